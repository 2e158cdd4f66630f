"""Azure Compute Gallery: galleries, image definitions and image versions (the images a VM names by
resource id besides managed images; review D3). They answer only their own api-versions
(api_versions.GALLERIES). An image definition keeps its Hyper-V generation (ARM's default V1) and
its features (SecurityType TrustedLaunch / TrustedLaunchSupported: vm_rules); a version names its
source image. Replication, sharing and the build of a version are not emulated.

A mixin of ArmState (state.py)."""

from __future__ import annotations

from clusterbake.twins.azure.resource import ArmError


class GalleryMixin:
    def _put_compute_galleries(self, rid, body, existing):
        resource = self._base(rid, body, existing)
        resource["properties"] = {
            "identifier": {"uniqueName": f"{self.subscription}-{rid.name.upper()}"},
            "provisioningState": "Succeeded",
        }
        return resource

    def _put_compute_galleries_images(self, rid, body, existing):
        self._require(str(rid.parent()), "Microsoft.Compute/galleries", "gallery")
        resource = self._base(rid, body, existing)
        props = body.get("properties") or {}
        identifier = props.get("identifier") or {}
        if props.get("osType") not in ("Linux", "Windows") or not all(
            identifier.get(k) for k in ("publisher", "offer", "sku")
        ):
            raise ArmError(
                400,
                "InvalidParameter",
                "An image definition needs osType and identifier (publisher, offer, sku).",
                "properties",
            )
        generation = props.get("hyperVGeneration", "V1")
        if generation not in ("V1", "V2"):
            raise ArmError(400, "InvalidParameter", f"hyperVGeneration {generation!r}.", "hyperVGeneration")
        resource["properties"] = {
            "osType": props["osType"],
            "osState": props.get("osState", "Generalized"),
            "hyperVGeneration": generation,
            "identifier": identifier,
            "features": list(props.get("features") or []),
            "provisioningState": "Succeeded",
        }
        return resource

    def _put_compute_galleries_images_versions(self, rid, body, existing):
        self._require(str(rid.parent()), "Microsoft.Compute/galleries/images", "image definition")
        resource = self._base(rid, body, existing)
        props = body.get("properties") or {}
        source = ((props.get("storageProfile") or {}).get("source") or {}).get("id")
        self._require(source, "Microsoft.Compute/images", "storageProfile.source.id")
        resource["properties"] = {
            "storageProfile": {"source": {"id": source}},
            "publishingProfile": props.get("publishingProfile") or {},
            "provisioningState": "Succeeded",
        }
        return resource
