"""What the node image is, read through the compute client's typed operations (review B3, B4, B8).

A managed image and a gallery image version are different resource providers with different
api-versions (compute `-01`, galleries `-03`): a generic GET by id with one fixed api-version
fails for one of them with NoRegisteredProviderFound, so each is read with its own operations.
A marketplace URN is not read (its Hyper-V generation is Azure's to check at the first create).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from clusterbake.errors import ConfigError
from clusterbake.providers.azure.api import get_or_none

MANAGED = re.compile(r"^/subscriptions/[^/]+/resourceGroups/([^/]+)/providers/Microsoft\.Compute/images/([^/]+)$", re.I)
GALLERY_VERSION = re.compile(
    r"^/subscriptions/[^/]+/resourceGroups/([^/]+)/providers/Microsoft\.Compute/galleries/([^/]+)/images/([^/]+)"
    r"/versions/([^/]+)$",
    re.I,
)


@dataclass(frozen=True)
class ImageFacts:
    kind: str  # "managed image", "gallery image version", "marketplace"
    generation: str | None  # Hyper-V generation V1 / V2; None: not read (marketplace)
    trusted_launch_only: bool = False  # a gallery definition with the SecurityType feature TrustedLaunch


def read(compute, image: str, field: str) -> ImageFacts:
    """The image's facts; a resource id that does not exist, or is neither kind, is a ConfigError on `field`."""
    if not image.startswith("/"):
        return ImageFacts("marketplace", None)
    missing = f"{field}: image {image} does not exist (or is not shared with this subscription)"
    if match := MANAGED.match(image):
        found = get_or_none(compute.images.get, *match.groups())
        if found is None:
            raise ConfigError(missing)
        return ImageFacts("managed image", _generation(found))
    if match := GALLERY_VERSION.match(image):
        group, gallery, definition, version = match.groups()
        if get_or_none(compute.gallery_image_versions.get, group, gallery, definition, version) is None:
            raise ConfigError(missing)
        found = compute.gallery_images.get(group, gallery, definition)
        features = {f.name: f.value for f in found.features or []}
        return ImageFacts(
            "gallery image version",
            _generation(found),
            trusted_launch_only=features.get("SecurityType") == "TrustedLaunch",
        )
    raise ConfigError(
        f"{field}: {image} is neither a managed image (.../Microsoft.Compute/images/<name>) nor a gallery image "
        "version (.../galleries/<gallery>/images/<definition>/versions/<version>); give one of those or a "
        "marketplace URN publisher:offer:sku:version"
    )


def _generation(image) -> str:
    """An image's Hyper-V generation: the SDK gives an enum (its value V1 / V2), ARM's default is V1."""
    generation = image.hyper_v_generation or "V1"
    return str(getattr(generation, "value", generation))


def check_fits(facts: ImageFacts, image: str, field: str, security_type: str, sizes: list[tuple[str, object]]):
    """The image boots on every size (`sizes`: (field, SkuInfo)) and with azure.security_type."""
    if facts.generation:
        for size_field, info in sizes:
            if facts.generation not in info.generations:
                raise ConfigError(
                    f"{size_field}: {info.name} boots Hyper-V generation {', '.join(info.generations)} only and "
                    f"{field} {image} is {facts.generation}; pick a size that boots {facts.generation} or an "
                    f"image of generation {', '.join(info.generations)}"
                )
    if security_type == "TrustedLaunch" and facts.kind == "managed image":
        raise ConfigError(
            f"azure.security_type: Trusted Launch does not take a managed image ({field} {image}); publish the "
            "image to an Azure Compute Gallery (packer's azure_gallery_name) or set azure.security_type: Standard"
        )
    if facts.trusted_launch_only and security_type != "TrustedLaunch":
        raise ConfigError(
            f"azure.security_type: {field} {image} is a gallery image whose definition takes Trusted Launch VMs "
            "only (feature SecurityType=TrustedLaunch); set azure.security_type: TrustedLaunch (vTPM, Secure Boot "
            "off: the image's NVIDIA and DOCA-OFED DKMS modules are not signed) or use a definition marked "
            "TrustedLaunchSupported"
        )
