"""The Azure image: packer/azure.pkr.hcl (azure-arm.ubuntu) driven by the packer wrapper.

`AzureBuilder().build(config, state)` takes its settings from the config (image.azure,
with the azure: section's subscription, location and resource group as defaults),
stages the template for the Packer on PATH, runs `packer build -only=azure-arm.ubuntu`
and records the image in the store, `<state_dir>/images/azure-latest.json`:

    {"image", "location", "managed_image_id", "gallery_image_version_id", "name", ...}

`image` is what nodes boot: the gallery image version when image.azure.gallery_name
is set (replicated to `replication_regions`), else the managed image.

Packer versions (packer/README.md): azure-arm builds need Packer >= 1.10 with the azure
and ansible plugins (`packer init packer/plugins`); Debian's Packer 1.6.6 validates the
template (its bundled azure-arm builder) but its SSH client cannot log in to Ubuntu 22.04+.
Credentials: image.azure.auth (the Azure CLI's login, a service principal whose secret
comes from $AZURE_CLIENT_SECRET and reaches Packer in its environment, never on its
command line, or the managed identity of the machine running clusterbake).
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Mapping
from datetime import UTC, datetime
from pathlib import Path

from clusterbake.config import AZURE_SOURCE_IMAGES, ClusterConfig, extra_ca_files
from clusterbake.errors import ClusterbakeError, ConfigError
from clusterbake.images import cloud
from clusterbake.images.base import PackerRun
from clusterbake.images.inputs import builder_groups_for, node_group_features
from clusterbake.images.store import AZURE_IMAGE_PATTERN
from clusterbake.state import StateDir

SOURCE = "azure-arm.ubuntu"
TEMPLATE = "azure.pkr.hcl"
BASES = tuple(AZURE_SOURCE_IMAGES)
SECRET_ENV = "AZURE_CLIENT_SECRET"
_SUBNET = re.compile(
    r"^/subscriptions/[^/]+/resourceGroups/(?P<group>[^/]+)/providers/Microsoft\.Network/"
    r"virtualNetworks/(?P<vnet>[^/]+)/subnets/(?P<subnet>[^/]+)$"
)
_MANAGED_IMAGE = re.compile(
    r"^/subscriptions/(?P<subscription>[^/]+)/resourceGroups/(?P<group>[^/]+)/providers/"
    r"Microsoft\.Compute/images/(?P<name>[^/]+)$",
    re.IGNORECASE,
)


def azure_settings(config: ClusterConfig) -> dict:
    """The build's settings from the config: image.azure, defaulting to the azure: section's
    subscription, location and resource group; the node groups' features join the image's.
    Hashed into the inputs digest."""
    build = config.image.azure
    cluster = config.azure
    base = config.image.base
    settings = {
        "subscription_id": build.subscription_id or (cluster.subscription_id if cluster else "") or "",
        "location": build.location or (cluster.location if cluster else None),
        "resource_group": build.resource_group or (cluster.resource_group if cluster else None),
        "build_resource_group": build.build_resource_group or "",
        "vm_size": build.vm_size,
        "base": base,
        "source_image": build.source_image or AZURE_SOURCE_IMAGES.get(base, ""),
        "os_disk_size_gb": build.os_disk_size_gb,
        "subnet_id": build.subnet_id or "",
        "gallery_name": build.gallery_name or "",
        "gallery_resource_group": build.gallery_resource_group or "",
        "gallery_image_name": build.gallery_image_name or f"clusterbake-{base}",
        "gallery_replication_regions": list(build.gallery_replication_regions),
        "auth": build.auth,
        "client_id": build.client_id or "",
        "tenant_id": build.tenant_id or "",
        "features": sorted({*build.features, *node_group_features(config)}),
        "validate_gpu": build.validate_gpu,
        "validate_ib": build.validate_ib,
        "package_pins": dict(config.image.package_pins),
        "extra_ca_certificates": extra_ca_files(config),
    }
    if base not in BASES:
        raise ClusterbakeError(f"image.base: Azure images are built from {', '.join(BASES)}, not {base!r}")
    for key in ("location", "resource_group"):
        if not settings[key]:
            raise ClusterbakeError(f"image.azure.{key}: the Azure image build needs one (or azure.{key})")
    return settings


def gallery_version(name: str) -> str:
    """A gallery image version (Major.Minor.Patch, int32 each) from the image name's build time:
    clusterbake-ubuntu-24.04-20261201-093015-<rev> -> 2026.1201.93015."""
    match = re.search(r"-(\d{4})(\d{4})-(\d{6})(-|$)", name)
    if match:
        year, day, time = match.group(1), match.group(2), match.group(3)
    else:
        now = datetime.now(UTC)
        year, day, time = now.strftime("%Y"), now.strftime("%m%d"), now.strftime("%H%M%S")
    return f"{int(year)}.{int(day)}.{int(time)}"


def azure_packer_variables(settings: Mapping, run: PackerRun) -> dict[str, str]:
    """The -var values of packer/azure.pkr.hcl for these settings (never the client secret)."""
    s = settings
    publisher, offer, sku, version = s["source_image"].split(":")
    network = _SUBNET.match(s["subnet_id"]) if s["subnet_id"] else None
    return {
        "azure_subscription_id": s["subscription_id"],
        "azure_tenant_id": s["tenant_id"],
        "azure_client_id": s["client_id"] if s["auth"] == "service_principal" else "",
        "azure_use_cli_auth": json.dumps(s["auth"] == "cli"),
        "azure_location": s["location"],
        "azure_resource_group": s["resource_group"],
        "azure_build_resource_group": s["build_resource_group"],
        "azure_vm_size": s["vm_size"],
        "azure_image_publisher": publisher,
        "azure_image_offer": offer,
        "azure_image_sku": sku,
        "azure_image_version": version,
        "azure_base": s["base"],
        "azure_os_disk_size_gb": str(int(s["os_disk_size_gb"])),
        "azure_virtual_network_name": network["vnet"] if network else "",
        "azure_virtual_network_subnet_name": network["subnet"] if network else "",
        "azure_virtual_network_resource_group_name": network["group"] if network else "",
        "azure_gallery_name": s["gallery_name"],
        "azure_gallery_resource_group": s["gallery_resource_group"],
        "azure_gallery_image_name": s["gallery_image_name"],
        "azure_gallery_image_version": gallery_version(run.name),
        "azure_gallery_replication_regions": json.dumps(list(s["gallery_replication_regions"])),
        "azure_ansible_groups": json.dumps(builder_groups_for(s["features"])),
        "validate_gpu": json.dumps(bool(s["validate_gpu"])),
        "validate_ib": json.dumps(bool(s["validate_ib"])),
        **cloud.run_variables(run),
    }


def azure_packer_env(settings: Mapping, environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """The service principal's secret for Packer's environment (PKR_VAR_azure_client_secret)."""
    if settings["auth"] != "service_principal":
        return {}
    environ = os.environ if environ is None else environ
    secret = environ.get(SECRET_ENV)
    if not secret:
        raise ConfigError(
            f"image.azure.auth: service_principal needs its secret in ${SECRET_ENV} (never in the config file)"
        )
    return {"PKR_VAR_azure_client_secret": secret}


def parse_packer_manifest(path: Path, run_uuid: str | None = None) -> dict:
    """The managed image (and gallery version) of the manifest post-processor's JSON: the last
    azure-arm build of the last run (or of run_uuid)."""
    build = cloud.manifest_build(path, "azure-arm", run_uuid)
    custom = build.get("custom_data") or {}
    artifact = str(build.get("artifact_id") or "")
    if not artifact and custom.get("subscription_id") and custom.get("resource_group") and custom.get("image_name"):
        # Older azure-arm builders leave artifact_id empty for managed images.
        artifact = (
            f"/subscriptions/{custom['subscription_id']}/resourceGroups/{custom['resource_group']}"
            f"/providers/Microsoft.Compute/images/{custom['image_name']}"
        )
    managed = _MANAGED_IMAGE.match(artifact)
    if not managed:
        raise ClusterbakeError(f"{path}: cannot read a managed image id from artifact_id {artifact!r}")
    gallery_id = None
    if custom.get("gallery_name"):
        gallery_id = (
            f"/subscriptions/{managed['subscription']}/resourceGroups/{custom.get('gallery_group') or managed['group']}"
            f"/providers/Microsoft.Compute/galleries/{custom['gallery_name']}/images/{custom.get('gallery_image', '')}"
            f"/versions/{custom.get('gallery_version', '')}"
        )
        if not AZURE_IMAGE_PATTERN.match(gallery_id):
            raise ClusterbakeError(f"{path}: incomplete gallery data in custom_data: {custom!r}")
    regions = [r for r in str(custom.get("gallery_regions", "")).split(",") if r]
    return {
        "managed_image_id": artifact,
        "gallery_image_version_id": gallery_id,
        "location": custom.get("location", ""),
        "replication_regions": regions if gallery_id else [],
        "resource_group": managed["group"],
        **cloud.manifest_fields(build, "azure_base", managed["name"]),
    }


def image_record(manifest: Mapping, versions: Mapping | None, inputs_digest: str = "") -> dict:
    """What azure-latest.json holds about an image."""
    record = {
        "image": manifest["gallery_image_version_id"] or manifest["managed_image_id"],
        "location": manifest["location"],
        "managed_image_id": manifest["managed_image_id"],
        "gallery_image_version_id": manifest["gallery_image_version_id"],
        "replication_regions": list(manifest.get("replication_regions", [])),
        "resource_group": manifest.get("resource_group", ""),
        **cloud.record_fields(manifest, versions, inputs_digest, {}),
    }
    cloud.check_versions(f"image {record['name']}", record)
    return record


class AzureBuilder(cloud.PackerCloudBuilder):
    """The Azure GPU image (managed image, optionally a gallery image version), Packer azure-arm."""

    name = "azure"
    source = SOURCE
    template = TEMPLATE
    plugin_settings = None
    location_key = "location"
    image_id_key = "image"
    label = "Azure image"
    why_new_packer = "its SSH client signs with SHA-1, which Ubuntu 22.04+ refuses"
    settings = staticmethod(azure_settings)
    variables = staticmethod(azure_packer_variables)
    parse_packer_manifest = staticmethod(parse_packer_manifest)
    image_record = staticmethod(image_record)

    def describe(self, settings: Mapping) -> str:
        return f"{settings['vm_size']} in {settings['location']}"

    def packer_env(self, config: ClusterConfig) -> dict[str, str]:
        return azure_packer_env(azure_settings(config))


def build_azure_image(config: ClusterConfig, state: StateDir, *, force: bool = False) -> dict:
    """Bake the Azure GPU image for the config and record it; the record (azure-latest.json)."""
    return cloud.build_cloud_image(AzureBuilder(), config, state, force=force)[0]
