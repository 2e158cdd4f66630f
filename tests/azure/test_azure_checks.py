"""Config errors found with Azure's read-only calls, before anything is created (exit status 2).

Three cases run the CLI as a subprocess (message on stderr, exit status); the others call
`cluster.up` in-process against the same twin, which is what the CLI runs.
"""

from __future__ import annotations

import pytest
from azuretest import (
    LOCATION,
    NET_GROUP,
    example_config,
    gallery_image,
    needs_sdk,
    of_type,
    private_subnet,
    run_cb,
)
from clitest import assert_up_refused

pytestmark = needs_sdk
SUBPROCESS = {"size-not-in-zone", "infiniband-on-non-rdma", "quota"}
H100 = "Standard_ND96isr_H100_v5"


def _gpu(**changes):
    return [{"name": "gpu", "count": 2, "instance_type": H100, **changes}]


CASES = {
    "unknown-size": (
        {"node_groups": _gpu(instance_type="Standard_ND96isr_B900_v9")},
        "node_groups.0.instance_type: Standard_ND96isr_B900_v9 is not a VM size offered in eastus",
    ),
    "head-size-not-in-location": (
        {
            "azure": {
                "location": "westeurope",
                "subnet_id": None,
                "vnet_name": "west-vnet",
                "subnet_name": "nodes",
                "vnet_resource_group": NET_GROUP,
            }
        },
        "node_groups.0.instance_type: Standard_ND96isr_H100_v5 is not a VM size offered in westeurope",
    ),
    "size-not-in-zone": (
        {"node_groups": _gpu(instance_type="Standard_ND96isr_H200_v5"), "azure": {"zone": "3"}},
        "node_groups.0.instance_type: Standard_ND96isr_H200_v5 is not offered in zone 3 of eastus for this "
        "subscription (zones: 1, 2); set azure.zone to one of those",
    ),
    "infiniband-on-non-rdma": (
        {"node_groups": _gpu(instance_type="Standard_NC24ads_A100_v4", infiniband=True)},
        "node_groups.0.infiniband: Standard_NC24ads_A100_v4 has no InfiniBand (RdmaEnabled False)",
    ),
    "spot-not-sold": (
        {"node_groups": _gpu(spot=True)},
        "node_groups.0.spot: Standard_ND96isr_H100_v5 is not sold as Spot in eastus (LowPriorityCapable False)",
    ),
    "quota": (
        {"node_groups": _gpu(count=12)},
        "node_groups.0.instance_type: 12 x Standard_ND96isr_H100_v5 need 1152 vCPUs of the standardNDSH100v5Family "
        "vCPUs quota in eastus (1152 for the cluster's new nodes), 1000 of 1000 left",
    ),
    "regional-quota": (
        {
            "node_groups": [
                {"name": "gpu", "count": 10, "instance_type": H100},
                {"name": "hpc", "count": 8, "instance_type": "Standard_HB120rs_v3"},
                {"name": "nc", "count": 5, "instance_type": "Standard_NC24ads_A100_v4"},
            ]
        },
        "node_groups.2.instance_type: 5 x Standard_NC24ads_A100_v4 need 120 vCPUs of the total regional vCPUs "
        "quota in eastus (2048 for the cluster's new nodes), 2000 of 2000 left",
    ),
    "missing-vnet": (
        {"azure": {"subnet_id": None, "vnet_name": "nope", "subnet_name": "nodes", "vnet_resource_group": NET_GROUP}},
        "azure.vnet_name: virtual network nope does not exist in resource group net-rg",
    ),
    "missing-subnet": (
        {
            "azure": {
                "subnet_id": "/subscriptions/{sub}/resourceGroups/net-rg/providers/Microsoft.Network/"
                "virtualNetworks/hpc-vnet/subnets/gone"
            }
        },
        "azure.subnet_id: subnet gone does not exist in virtual network hpc-vnet (net-rg)",
    ),
    "subnet-in-other-region": (
        {
            "azure": {
                "subnet_id": None,
                "vnet_name": "west-vnet",
                "subnet_name": "nodes",
                "vnet_resource_group": NET_GROUP,
            }
        },
        "azure.subnet_name: nodes of virtual network west-vnet (resource group net-rg) is in westeurope, "
        "not in azure.location eastus",
    ),
    "subnet-too-small": (
        {
            "node_groups": _gpu(count=3),
            "azure": {
                "subnet_id": None,
                "vnet_name": "hpc-vnet",
                "subnet_name": "tiny",
                "vnet_resource_group": NET_GROUP,
            },
        },
        "azure.subnet_name: room for 3 nodes, the config plans 4; choose a larger subnet or fewer nodes",
    ),
}


@pytest.mark.parametrize("case", list(CASES))
def test_check_names_the_field_and_creates_nothing(twin, tmp_path, monkeypatch, case):
    changes, expected = CASES[case]
    changes = {k: (dict(v) if isinstance(v, dict) else v) for k, v in changes.items()}
    name = "chk" + "".join(c for c in case if c.isalpha())[:18]
    azure = changes.pop("azure", {})
    if azure.get("subnet_id"):
        azure["subnet_id"] = azure["subnet_id"].format(sub=twin.subscription)
    config = example_config(twin, cluster_name=name, partitions=[], **changes)
    config["azure"] |= {"resource_group": f"{name}-rg", **azure}
    config["azure"] = {k: v for k, v in config["azure"].items() if v is not None}
    assert_up_refused(
        twin.env, tmp_path, config, 2, expected, monkeypatch, in_subprocess=case in SUBPROCESS, timeout=180
    )
    state = twin.state()
    assert f"{name}-rg" not in state["groups"], "a resource group was created before the checks passed"
    assert twin.resources_of(name) == []


def test_location_is_checked_for_every_size(twin):
    """The checks read Resource SKUs of the config's location only (one paged listing)."""
    from azure.identity import DefaultAzureCredential
    from azure.mgmt.compute import ComputeManagementClient

    from clusterbake.providers.azure.catalogue import Catalogue

    with twin.sdk_env():
        compute = ComputeManagementClient(DefaultAzureCredential(), twin.subscription, base_url=twin.url)
        sizes = Catalogue(compute, LOCATION).sizes
    h100 = sizes["standard_nd96isr_h100_v5"]
    assert (h100.vcpus, h100.cores, h100.threads_per_core, h100.memory_mib) == (96, 96, 1, 1900 * 1024)
    assert h100.gpus == (("h100", 8),) and h100.rdma and not h100.low_priority and h100.nvswitch
    d4 = sizes["standard_d4s_v5"]
    assert (d4.vcpus, d4.cores, d4.threads_per_core, d4.gpus, d4.rdma) == (4, 2, 2, (), False)


def test_no_image_is_exit_3_and_creates_nothing(twin, tmp_path):
    config = example_config(twin, cluster_name="chknoimage")
    config["azure"]["resource_group"] = "chknoimage-rg"
    del config["azure"]["image"]
    result = run_cb(twin, tmp_path, config, "cluster", "up", "--provision-only", check=False)
    assert result.returncode == 3, result.stderr
    assert "run `make image PROVIDER=azure` (or set azure.image)" in result.stderr
    assert "chknoimage-rg" not in twin.state()["groups"]


def test_an_image_id_that_does_not_exist_is_a_config_error(twin, tmp_path):
    config = example_config(twin, cluster_name="chkbadimage")
    config["azure"] |= {
        "resource_group": "chkbadimage-rg",
        "image": f"/subscriptions/{twin.subscription}/resourceGroups/img/providers/Microsoft.Compute/images/none",
    }
    result = run_cb(twin, tmp_path, config, "cluster", "up", "--provision-only", check=False)
    assert result.returncode == 2, result.stderr
    assert "azure.image: image /subscriptions/" in result.stderr and "does not exist" in result.stderr
    assert "chkbadimage-rg" not in twin.state()["groups"]


SMALL = [{"name": "small", "count": 1, "instance_type": "Standard_A2_v2"}]
# name -> (the image: a gallery image's settings or "managed", config changes, the error)
IMAGE_CASES = {
    "gen2-image-on-a-gen1-size": (
        {"generation": "V2"},
        {"node_groups": SMALL},
        "node_groups.0.instance_type: Standard_A2_v2 boots Hyper-V generation V1 only and azure.image",
    ),
    "trusted-launch-with-a-managed-image": (
        "managed",
        {"azure": {"security_type": "TrustedLaunch"}},
        "azure.security_type: Trusted Launch does not take a managed image",
    ),
    "gallery-image-for-trusted-launch-only": (
        {"trusted_launch_only": True},
        {},
        "is a gallery image whose definition takes Trusted Launch VMs only",
    ),
}


@pytest.mark.parametrize("case", list(IMAGE_CASES))
def test_the_image_is_checked_against_sizes_and_security_type_before_anything_is_created(
    twin, tmp_path, monkeypatch, case
):
    image, changes, expected = IMAGE_CASES[case]
    name = "img" + "".join(c for c in case if c.isalpha())[:18]
    if image == "managed":
        image_id = gallery_image(twin, name).split("/providers/")[0] + f"/providers/Microsoft.Compute/images/{name}"
    else:
        image_id = gallery_image(twin, name, **image)
    config = example_config(
        twin, cluster_name=name, partitions=[], **{k: v for k, v in changes.items() if k != "azure"}
    )
    config["azure"] |= {"resource_group": f"{name}-rg", "image": image_id, **changes.get("azure", {})}
    assert_up_refused(twin.env, tmp_path, config, 2, expected, monkeypatch, in_subprocess=False, timeout=180)
    assert f"{name}-rg" not in twin.state()["groups"]


def test_sizes_without_accelerated_networking_or_premium_storage_get_nics_and_disks_they_take(twin, tmp_path):
    """Standard_A2_v2 (no accelerated networking, no premium storage, Gen1) and Standard_D4_v5 (no premium
    storage) from a Gen1 gallery image: each VM is created, with what its size can take (review B8)."""
    name = "chkhw"
    config = example_config(
        twin,
        cluster_name=name,
        partitions=[],
        head={"instance_type": "Standard_D4s_v5"},
        node_groups=[*SMALL, {"name": "plain", "count": 1, "instance_type": "Standard_D4_v5"}],
    )
    config["azure"] |= {"resource_group": f"{name}-rg", "image": gallery_image(twin, name, generation="V1")}
    run_cb(twin, tmp_path, config, "cluster", "up", "--provision-only")
    try:
        resources = twin.resources_of(name)
        nics = {r["tags"]["clusterbake-name"]: r for r in of_type(resources, "Microsoft.Network/networkInterfaces")}
        vms = {r["tags"]["clusterbake-name"]: r for r in of_type(resources, "Microsoft.Compute/virtualMachines")}
        accelerated = {n: nic["properties"]["enableAcceleratedNetworking"] for n, nic in nics.items()}
        assert accelerated == {"head": True, "small-1": False, "plain-1": True}
        disks = {
            n: vm["properties"]["storageProfile"]["osDisk"]["managedDisk"]["storageAccountType"]
            for n, vm in vms.items()
        }
        assert disks == {"head": "Premium_LRS", "small-1": "StandardSSD_LRS", "plain-1": "StandardSSD_LRS"}
    finally:
        run_cb(twin, tmp_path, config, "cluster", "down")
    assert twin.resources_of(name) == []


def test_a_private_subnet_needs_a_way_out_before_anything_is_created(twin, tmp_path, monkeypatch):
    """No default outbound access (new virtual networks' default) and no NAT gateway: the nodes could not reach
    Key Vault, the head not Azure Resource Manager (review B2); the Key Vault service endpoint serves the
    nodes only, a NAT gateway both."""
    from azure.identity import DefaultAzureCredential
    from azure.mgmt.network import NetworkManagementClient

    from clusterbake.config import ClusterConfig
    from clusterbake.errors import ConfigError
    from clusterbake.providers.azure import checks

    closed = private_subnet(twin, "private", "10.70.50.0/24")
    config = example_config(twin, cluster_name="chkprivate", partitions=[])
    config["azure"] |= {"resource_group": "chkprivate-rg", "subnet_id": closed}
    expected = "is private (defaultOutboundAccess false: no default outbound access) and has no NAT gateway"
    assert_up_refused(twin.env, tmp_path, config, 2, expected, monkeypatch, in_subprocess=False, timeout=180)
    assert "chkprivate-rg" not in twin.state()["groups"]
    vault_only = private_subnet(twin, "private-kv", "10.70.51.0/24", endpoints=("Microsoft.KeyVault",))
    natted = private_subnet(twin, "private-nat", "10.70.52.0/24", nat=True)
    with twin.sdk_env():
        network = NetworkManagementClient(DefaultAzureCredential(), twin.subscription, base_url=twin.url)
        for subnet, powered, ok in ((vault_only, False, True), (vault_only, True, False), (natted, True, True)):
            parsed = ClusterConfig.model_validate(config | {"azure": config["azure"] | {"subnet_id": subnet}})
            read = checks.check_subnet(network, parsed)
            if ok:
                checks.check_outbound(read, parsed, powered)
            else:
                with pytest.raises(ConfigError, match="Azure Resource Manager"):
                    checks.check_outbound(read, parsed, powered)
