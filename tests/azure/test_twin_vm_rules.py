"""The ARM twin refuses what ARM refuses of a VM (review D1, D3, D4, D5): api-versions per resource
provider, InfiniBand placement, size capabilities and the security type (raw HTTPS requests)."""

from __future__ import annotations

import pytest
from azuretest import LOCATION, RawArm, arm_twin, make_network, needs_sdk, private_subnet

pytestmark = needs_sdk

H100 = "Standard_ND96isr_H100_v5"
GALLERY = "Microsoft.Compute/galleries/g"


@pytest.fixture(scope="module")
def twin(tmp_path_factory):
    """A twin of this module's own: its NICs take addresses of the shared network."""
    with arm_twin(tmp_path_factory.mktemp("azure-rules")) as server:
        make_network(server)
        yield server


@pytest.fixture(scope="module")
def arm(twin) -> RawArm:
    arm = RawArm(twin, "rules-rg", twin.token())
    status, body, _ = twin.request(
        "PUT",
        f"/subscriptions/{twin.subscription}/resourceGroups/rules-rg?api-version=2024-07-01",
        {"location": LOCATION},
        arm.token,
    )
    assert status in (200, 201), body
    return arm


def _image(arm: RawArm, name: str, generation: str) -> dict:
    status, body, _ = arm.put(
        f"Microsoft.Compute/images/{name}", {"location": LOCATION, "properties": {"hyperVGeneration": generation}}
    )
    assert status in (200, 201), body
    return {"id": body["id"]}


def _error(answer) -> tuple[int, str]:
    status, body, _ = answer
    return status, body["error"]["code"]


def test_each_resource_provider_answers_its_own_api_versions(arm):
    """Galleries take -03 versions only: the fixed 2024-03-01 the product once used for every image is refused."""
    status, body, _ = arm.put(GALLERY, {"location": LOCATION}, version="2024-03-01")
    assert (status, body["error"]["code"]) == (400, "NoRegisteredProviderFound")
    assert "for type 'galleries'" in body["error"]["message"] and "2024-03-03" in body["error"]["message"]
    status, body, _ = arm.put(GALLERY, {"location": LOCATION}, version="2024-03-03")
    assert status in (200, 201), body
    assert _error(arm.put("Microsoft.Compute/disks/d", {"location": LOCATION}, version="2024-07-01")) == (
        400,
        "NoRegisteredProviderFound",
    )
    # The provider's registration lists the versions (what a generic delete picks from).
    status, body, _ = arm.twin.request(
        "GET",
        f"/subscriptions/{arm.twin.subscription}/providers/Microsoft.Compute?api-version=2021-04-01",
        token=arm.token,
    )
    types = {t["resourceType"]: t["apiVersions"] for t in body["resourceTypes"]}
    assert types["galleries/images/versions"][0] == "2026-03-03" and "2024-07-01" in types["virtualMachines"]


def test_infiniband_sizes_are_refused_in_flexible_scale_sets_and_share_an_availability_set(arm):
    status, body, _ = arm.put(
        "Microsoft.Compute/virtualMachineScaleSets/flex",
        {"location": LOCATION, "properties": {"orchestrationMode": "Flexible", "platformFaultDomainCount": 1}},
    )
    assert status in (200, 201), body
    flex = {"id": body["id"]}
    assert _error(arm.vm("ib-0", H100, arm.nic("ib-0-nic"), virtualMachineScaleSet=flex)) == (
        400,
        "OperationNotAllowed",
    )
    status, body, _ = arm.put(
        "Microsoft.Compute/availabilitySets/ib",
        {"location": LOCATION, "sku": {"name": "Aligned"}, "properties": {"platformFaultDomainCount": 1}},
    )
    assert status == 200, body
    fabric = {"id": body["id"]}
    nics = {name: arm.nic(f"{name}-nic") for name in ("ib-1", "ib-2")}
    # An availability set is never zonal.
    assert _error(arm.vm("ib-1", H100, nics["ib-1"], availabilitySet=fabric)) == (400, "InvalidParameter")
    for name, nic in nics.items():
        status, body, _ = arm.vm(name, H100, nic, zone=None, availabilitySet=fabric)
        assert status == 201, body
    state = arm.twin.state()["resources"]
    vms = {r["name"]: r for r in state.values() if r["type"] == "Microsoft.Compute/virtualMachines"}
    assert vms["ib-1"]["_ib_fabric"] == vms["ib-2"]["_ib_fabric"] == fabric["id"].lower()


def test_size_capabilities_are_enforced(arm):
    """Accelerated networking, premium disks and the image's Hyper-V generation, as Resource SKUs says (B8)."""
    gen1 = _image(arm, "gen1", "V1")
    premium = {"osDisk": {"createOption": "FromImage", "managedDisk": {"storageAccountType": "Premium_LRS"}}}
    assert _error(arm.vm("a-1", "Standard_A2_v2", arm.nic("a-1-nic", accelerated=True), image=gen1)) == (
        400,
        "VMSizeIsNotPermittedToEnableAcceleratedNetworking",
    )
    plain = arm.nic("a-2-nic")
    assert _error(arm.vm("a-2", "Standard_A2_v2", plain)) == (400, "BadRequest")  # a Gen2 image on a Gen1 size
    assert _error(arm.vm("a-2", "Standard_D4_v5", plain, image=gen1, storage=premium)) == (400, "BadRequest")
    status, body, _ = arm.vm("a-2", "Standard_A2_v2", plain, image=gen1)
    assert status == 201, body


def test_gen2_vms_without_a_security_type_get_trusted_launch_and_managed_images_refuse_it(arm):
    """From the twin's Trusted Launch default api-version a Gen2 VM naming no security type is Trusted Launch
    with Secure Boot, which a managed image cannot take (B4); an older api-version keeps none."""
    gen2 = _image(arm, "gen2", "V2")
    nic = arm.nic("t-1-nic")
    status, body, _ = arm.vm("t-1", "Standard_D4s_v5", nic, image=gen2, version="2026-04-01")
    assert (status, body["error"]["code"]) == (400, "BadRequest")
    assert "TrustedLaunch" in body["error"]["message"]
    status, body, _ = arm.vm("t-1", "Standard_D4s_v5", nic, version="2026-04-01")  # a marketplace image
    assert status == 201, body
    assert body["properties"]["securityProfile"] == {
        "securityType": "TrustedLaunch",
        "uefiSettings": {"secureBootEnabled": True, "vTpmEnabled": True},
    }
    status, body, _ = arm.vm(
        "t-2",
        "Standard_D4s_v5",
        arm.nic("t-2-nic"),
        image=gen2,
        version="2026-04-01",
        securityProfile={"securityType": "Standard"},
    )
    assert status == 201 and body["properties"]["securityProfile"] == {"securityType": "Standard"}
    status, body, _ = arm.vm("t-3", "Standard_D4s_v5", arm.nic("t-3-nic"), image=gen2, version="2024-07-01")
    assert status == 201 and "securityProfile" not in body["properties"]


def test_vms_without_default_outbound_access_reach_only_what_their_subnet_opens(arm):
    """A private subnet's VM or a Flexible scale set member reaches Key Vault only through a NAT gateway or the
    Microsoft.KeyVault service endpoint (review D2); the twin's listener for the nodes asks egress.reaches."""
    from clusterbake.twins.azure import egress
    from clusterbake.twins.azure.state import ArmState

    subnets = {
        "closed": private_subnet(arm.twin, "closed", "10.70.30.0/24"),
        "vault": private_subnet(arm.twin, "vault", "10.70.31.0/24", endpoints=("Microsoft.KeyVault",)),
        "nat": private_subnet(arm.twin, "nat", "10.70.32.0/24", nat=True),
    }
    addresses = {}
    for name, subnet in subnets.items():
        nic = arm.nic(f"out-{name}-nic", subnet=subnet)
        status, body, _ = arm.vm(f"out-{name}", "Standard_D4s_v5", nic)
        assert status == 201, body
        addresses[name] = arm.twin.request("GET", f"{nic}?api-version=2024-07-01", token=arm.token)[1]
    status, body, _ = arm.put(
        "Microsoft.Compute/virtualMachineScaleSets/out-flex",
        {"location": LOCATION, "properties": {"orchestrationMode": "Flexible", "platformFaultDomainCount": 1}},
    )
    flex_nic = arm.nic("out-flex-nic")
    assert arm.vm("out-flex", "Standard_D4s_v5", flex_nic, virtualMachineScaleSet={"id": body["id"]})[0] == 201
    addresses["flex"] = arm.twin.request("GET", f"{flex_nic}?api-version=2024-07-01", token=arm.token)[1]
    state = ArmState()
    state.restore(arm.twin.state())

    def reaches(name: str, service: str) -> bool:
        address = addresses[name]["properties"]["ipConfigurations"][0]["properties"]["privateIPAddress"]
        return egress.reaches(state, address, service)

    assert [reaches(n, "Microsoft.KeyVault") for n in ("closed", "vault", "nat", "flex")] == [False, True, True, False]
    assert [reaches(n, "Microsoft.Storage") for n in ("vault", "nat")] == [False, True]
    assert egress.reaches(state, "127.0.0.1", "Microsoft.KeyVault")  # the host, not a VM of the twin
