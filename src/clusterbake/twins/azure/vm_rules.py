"""What ARM checks of a new VM's size, image, security type and placement (review D1, D4, D5).

Each rule is Microsoft's documented behaviour; the error codes and messages are those real
deployments report (quoted in docs/twin.md with their sources). Where the documentation leaves the
exact boundary open, the twin takes the strict reading and says so:

- size capabilities (Resource SKUs): a NIC with accelerated networking on a size whose
  AcceleratedNetworkingEnabled is False, a premium OS disk on a size whose PremiumIO is False,
  an image whose Hyper-V generation is not in the size's HyperVGenerations: refused (B8);
- security type: Trusted Launch is the default for Gen2 VMs created without a securityProfile
  from api-version TRUSTED_LAUNCH_DEFAULT_FROM (the twin's reading of "Trusted Launch as
  Default", GA August 2026: which api-versions it covers is not documented); Trusted Launch is
  refused for a managed image (Microsoft: "Managed Image ... not supported") and for a Gen1 image;
  a gallery image whose definition's SecurityType feature is TrustedLaunch takes nothing else (B4);
- placement: an availability set cannot be zonal and a VM in one takes its proximity placement
  group; an InfiniBand (RdmaEnabled) size in a Flexible scale set is refused: Microsoft's
  orchestration-modes table says "Infiniband Networking: No (Flexible)", and where real Azure
  would create the VM without a shared InfiniBand partition, the twin says no (B1). The VMs an
  InfiniBand fabric joins (`_ib_fabric`): those of one availability set (or one Uniform scale set,
  not emulated); a VM on its own has a fabric of its own.
"""

from __future__ import annotations

from clusterbake.twins.azure import skus
from clusterbake.twins.azure.resource import ArmError

TRUSTED_LAUNCH_DEFAULT_FROM = "2025-11-01"
PREMIUM_DISKS = ("Premium_LRS", "Premium_ZRS", "PremiumV2_LRS")
MANAGED_IMAGE = "Microsoft.Compute/images"
GALLERY_VERSION = "Microsoft.Compute/galleries/images/versions"


def image_facts(resources: dict, image: dict) -> tuple[str, str, str | None]:
    """(kind, Hyper-V generation, security type the image requires or None) of an imageReference.

    A managed image and a gallery image definition say their generation (ARM's default: V1); a
    marketplace URN is taken as Gen2 unless its SKU names gen1 (Canonical's Ubuntu 24.04 `server`
    is Gen2, `server-gen1` Gen1: the twin does not emulate the marketplace catalogue)."""
    if image.get("id"):
        found = resources.get(image["id"].lower()) or {}
        kind = found.get("type", "")
        if kind == GALLERY_VERSION:
            definition = resources.get(image["id"].lower().rsplit("/versions/", 1)[0]) or {}
            props = definition.get("properties") or {}
            features = {f.get("name"): f.get("value") for f in props.get("features") or []}
            required = features.get("SecurityType")
            return (
                kind,
                props.get("hyperVGeneration", "V1"),
                ("TrustedLaunch" if required in ("TrustedLaunch",) else None),
            )
        return kind, (found.get("properties") or {}).get("hyperVGeneration", "V1"), None
    return "marketplace", "V1" if "gen1" in str(image.get("sku", "")).lower() else "V2", None


def check_capabilities(entry: dict, nics: list[dict], disk_type: str, generation: str) -> None:
    size = entry["name"]
    if skus.capability(entry, "AcceleratedNetworkingEnabled") != "True" and any(
        nic["properties"].get("enableAcceleratedNetworking") for nic in nics
    ):
        raise ArmError(
            400,
            "VMSizeIsNotPermittedToEnableAcceleratedNetworking",
            f"VM size {size} is not compatible with Accelerated Networking enabled on the network interface(s) "
            "on the VM. Compatible VM sizes: see https://aka.ms/AcceleratedNetworking",
        )
    if disk_type in PREMIUM_DISKS and skus.capability(entry, "PremiumIO") != "True":
        raise ArmError(
            400,
            "BadRequest",
            f"Requested operation cannot be performed because storage account type '{disk_type}' is not supported "
            f"for VM size '{size}'.",
            "osDisk.managedDisk.storageAccountType",
        )
    generations = (skus.capability(entry, "HyperVGenerations") or "V1").split(",")
    if generation not in generations:
        raise ArmError(
            400,
            "BadRequest",
            f"The selected VM size '{size}' cannot boot Hypervisor Generation '{generation[1:]}'. If this was a "
            "Create operation please check that the Hypervisor Generation of the Image matches the Hypervisor "
            "Generation of the selected VM Size.",
        )


def security_profile(requested: dict | None, api_version: str, kind: str, generation: str, required: str | None):
    """The securityProfile the VM gets (None: none, as ARM before Trusted Launch by default)."""
    requested = dict(requested or {})
    security_type = requested.get("securityType")
    if security_type is None and generation == "V2" and api_version >= TRUSTED_LAUNCH_DEFAULT_FROM:
        security_type = "TrustedLaunch"
        requested = {"securityType": security_type, "uefiSettings": {"secureBootEnabled": True, "vTpmEnabled": True}}
    if security_type == "TrustedLaunch" and (kind == MANAGED_IMAGE or generation != "V2"):
        raise ArmError(
            400,
            "BadRequest",
            "Use of TrustedLaunch setting is not supported for the provided image. Please select Trusted Launch "
            "Supported Gen2 OS Image. For more information, see https://aka.ms/TrustedLaunch-FAQ.",
        )
    if required == "TrustedLaunch" and security_type != "TrustedLaunch":
        raise ArmError(
            400,
            "BadRequest",
            "The provided gallery image only supports creation of VMs and VM Scale Sets with 'TrustedLaunch' "
            "security type.",
        )
    if security_type is None:
        return None
    if security_type not in ("Standard", "TrustedLaunch", "ConfidentialVM"):
        raise ArmError(
            400, "InvalidParameter", f"The value '{security_type}' of securityType is not valid.", "securityType"
        )
    if security_type == "TrustedLaunch":
        uefi = requested.get("uefiSettings") or {}
        requested["uefiSettings"] = {
            "secureBootEnabled": bool(uefi.get("secureBootEnabled", True)),
            "vTpmEnabled": bool(uefi.get("vTpmEnabled", True)),
        }
    return requested


def check_placement(resources: dict, props: dict, zones: list[str], entry: dict) -> str | None:
    """Refuse what ARM refuses of an availability set or scale set; the VM's InfiniBand fabric (see above)."""
    refs = {key: (props.get(key) or {}).get("id") for key in ("availabilitySet", "virtualMachineScaleSet")}
    if refs["availabilitySet"] and refs["virtualMachineScaleSet"]:
        raise ArmError(
            400,
            "InvalidParameter",
            "A virtual machine cannot be in an availability set and a virtual machine scale set.",
            "availabilitySet",
        )
    rdma = skus.capability(entry, "RdmaEnabled") == "True"
    if refs["availabilitySet"]:
        found = resources[refs["availabilitySet"].lower()]
        if zones:
            raise ArmError(
                400,
                "InvalidParameter",
                "Virtual Machine cannot be created in an Availability Set and an Availability Zone at the same time.",
                "zones",
            )
        own = ((props.get("proximityPlacementGroup") or {}).get("id") or "").lower()
        theirs = ((found["properties"].get("proximityPlacementGroup") or {}).get("id") or "").lower()
        if theirs and own != theirs:
            raise ArmError(
                400,
                "InvalidParameter",
                "The proximity placement group of the virtual machine must be "
                f"{found['properties']['proximityPlacementGroup']['id']}, the one of its availability set.",
                "proximityPlacementGroup",
            )
        return found["id"].lower() if rdma else None
    if refs["virtualMachineScaleSet"] and rdma:
        found = resources[refs["virtualMachineScaleSet"].lower()]
        if found["properties"].get("orchestrationMode") == "Flexible":
            raise ArmError(
                400,
                "OperationNotAllowed",
                f"VM size {entry['name']} uses InfiniBand, which Flexible scale sets do not support ('Infiniband "
                "Networking: No (Flexible)', Orchestration modes for Virtual Machine Scale Sets); use an "
                "availability set or a Uniform scale set with a single placement group.",
                "virtualMachineScaleSet",
            )
    return None
