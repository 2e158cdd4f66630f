"""GPU nodes of an AWS cluster, from the aws provider's inventory through the real join.

The inventory comes from `aws_inventory` (the function behind inventories/aws_ec2.py)
over instances of a p5.48xlarge group (EFA), a g5.xlarge group and a CPU group,
with the instance types as moto_server describes them. Then ansible/tasks/join.yml
runs for the compute nodes as ansible/cluster.yml runs it (tests/playbooks/aws_join.yml):
they fetch their bundle themselves, so the play only keeps each group's bundle on
the controller, where these tests read it:

- the fabric manager runs on the NVSwitch type (group `nvswitch`, gpu_systems.py) only;
- the bundle's /etc/clusterbake/fabric.env (tcp for g5, efa for p5) is run with bash
  and sh in network namespaces made here (needs root and `ip netns`): it must find
  the node's interface itself (fabric_socket_ifname: auto, AWS's default), e.g.
  enp71s0 on a p5 with Ubuntu, and the aws-ofi-nccl path the image build recorded.
"""

from __future__ import annotations

import base64
import json
import os
import shutil
import subprocess
import sys
import uuid
from contextlib import contextmanager
from pathlib import Path

import pytest
import yaml
from awstest import REPO

from clusterbake.config import ClusterConfig
from clusterbake.providers.aws.catalogue import Catalogue
from clusterbake.providers.aws.provider import AwsProvider, aws_inventory
from clusterbake.state import StateDir

sys.path.insert(0, str(REPO / "tests" / "unit"))
from playbook_run import ANSIBLE_PLAYBOOK, playbook_env, run_playbook

HEAD, P5, G5, CPU = "10.123.0.10", "10.123.0.11", "10.123.0.12", "10.123.0.13"
TYPES = {"head": "m7i.2xlarge", "p5-1": "p5.48xlarge", "g5-1": "g5.xlarge", "cpu-1": "c7i.large"}
ADDRESSES = {"head": HEAD, "p5-1": P5, "g5-1": G5, "cpu-1": CPU}


def _config() -> ClusterConfig:
    return ClusterConfig.model_validate(
        {
            "cluster_name": "gpujoin",
            "provider": "aws",
            "image": {"base": "ubuntu-22.04"},
            "aws": {"region": "us-east-1", "vpc_id": "vpc-0123456789abcdef0", "subnet_id": "subnet-0123456789abcdef0"},
            "head": {"instance_type": TYPES["head"]},
            "node_groups": [
                {"name": "p5", "count": 1, "instance_type": TYPES["p5-1"], "efa": True},
                {"name": "g5", "count": 1, "instance_type": TYPES["g5-1"]},
                {"name": "cpu", "count": 1, "instance_type": TYPES["cpu-1"]},
            ],
        }
    )


def _instances() -> list[dict]:
    return [
        {
            "InstanceId": f"i-00000000000000{n:03d}",
            "InstanceType": TYPES[name],
            "State": {"Name": "running", "Code": 16},
            "PrivateIpAddress": ADDRESSES[name],
            "Placement": {"AvailabilityZone": "us-east-1a", "GroupName": ""},
            "Tags": [{"Key": "clusterbake:cluster", "Value": "gpujoin"}, {"Key": "clusterbake:name", "Value": name}],
        }
        for n, name in enumerate(TYPES)
    ]


@pytest.fixture(scope="module")
def aws(moto, tmp_path_factory) -> dict:
    """The inventory, as the provider builds it, with the instance types from moto_server."""
    tmp = tmp_path_factory.mktemp("gpu_join")
    config = _config()
    provider = AwsProvider(config, StateDir(tmp / "state"), client=moto.ec2())
    infos = Catalogue(moto.ec2()).get(set(TYPES.values()))
    extra = {
        **provider._connection_vars(),
        "clusterbake_storage_endpoints": {},
        "clusterbake_subnet_cidr": "10.123.0.0/16",
        "node_join_self_join": True,
    }
    return {"tmp": tmp, "inventory": aws_inventory(config, _instances(), infos, extra)}


def test_nvswitch_types_are_in_group_nvswitch(aws):
    inv = aws["inventory"]
    assert inv["nvswitch"]["hosts"] == ["p5-1"]
    assert inv["gpu"]["hosts"] == ["p5-1", "g5-1"] and inv["efa"]["hosts"] == ["p5-1"]
    assert "g5-1" not in inv["nvswitch"]["hosts"] and "cpu-1" not in inv["nvswitch"]["hosts"]
    # An inventory group, not a Slurm feature: the instance type already names the node there.
    assert "nvswitch" not in inv["_meta"]["hostvars"]["p5-1"]["clusterbake_slurm_node"]["features"]
    # The socket interface is found on the node by default (config aws.network_interface: auto).
    assert inv["all"]["vars"]["fabric_socket_ifname"] == "auto"


def _as_yaml_inventory(inv: dict, overrides: dict) -> dict:
    """`--list` JSON to the YAML inventory format, `overrides` added to group all's vars."""
    groups = {name: body["hosts"] for name, body in inv.items() if name not in ("all", "_meta")}
    return {
        "all": {
            "vars": {**inv["all"]["vars"], **overrides},
            "hosts": inv["_meta"]["hostvars"],
            "children": {name: {"hosts": {host: {} for host in hosts}} for name, hosts in groups.items() if hosts},
        }
    }


@pytest.fixture(scope="module")
def bundles(aws) -> dict[str, dict]:
    """Each compute group's join bundle, as the real join keeps it on the controller."""
    if not ANSIBLE_PLAYBOOK.exists():
        pytest.skip("ansible-playbook is not in the venv (make venv)")
    tmp = aws["tmp"]
    (tmp / "bundles").mkdir()
    (tmp / "munge.key").write_bytes(os.urandom(32))
    overrides = {
        "ansible_connection": "local",
        "ansible_python_interpreter": "/usr/bin/python3",
        "ansible_become": False,
        "munge_key_file": str(tmp / "munge.key"),
        "node_join_controller_dir": str(tmp / "bundles"),
        # Where the image's record of the aws-ofi-nccl plugin is read (run_profile writes it).
        "fabric_efa_env_file": str(tmp / "efa.env"),
    }
    (tmp / "inventory.yml").write_text(yaml.safe_dump(_as_yaml_inventory(aws["inventory"], overrides)))
    env = playbook_env(tmp, tmp / "no-fakes", tmp / "record.json")
    run_playbook("aws_join.yml", tmp / "inventory.yml", env)
    return {p.stem: json.loads(p.read_text()) for p in (tmp / "bundles").glob("*.json")}


def test_the_health_check_expects_every_efa_interface_of_the_type(aws, bundles):
    """p5.48xlarge has 32 EFA interfaces (moto's DescribeInstanceTypes, as EC2's): a node with 31 was passed
    before (one device was enough; hardware review item 17)."""
    hostvars = aws["inventory"]["_meta"]["hostvars"]
    assert hostvars["p5-1"]["node_health_efa_devices"] == 32
    assert "node_health_efa_devices" not in hostvars["g5-1"]
    health = next(f for f in bundles["p5"]["files"] if f["path"].endswith("health.json"))
    assert json.loads(base64.b64decode(health["content_b64"]))["efa_devices"] == 32


def test_fabric_manager_runs_on_nvswitch_nodes_only(bundles):
    assert sorted(bundles) == ["cpu", "g5", "p5"]
    assert {"nvidia-fabricmanager", "nvidia-persistenced"} <= set(bundles["p5"]["services"])
    assert "nvidia-persistenced" in bundles["g5"]["services"]
    assert "nvidia-fabricmanager" not in bundles["g5"]["services"]
    assert not {"nvidia-fabricmanager", "nvidia-persistenced"} & set(bundles["cpu"]["services"])


def _file(bundle: dict, path: str) -> str:
    (spec,) = [f for f in bundle["files"] if f["path"] == path]
    return base64.b64decode(spec["content_b64"]).decode()


def test_nccl_conf_leaves_what_only_the_node_knows_to_fabric_env(bundles):
    tcp = _file(bundles["g5"], "/etc/nccl.conf")
    assert "NCCL_IB_DISABLE=1" in tcp.splitlines()
    efa = _file(bundles["p5"], "/etc/nccl.conf")
    for conf in (tcp, efa):
        assert not [line for line in conf.splitlines() if line.startswith(("NCCL_SOCKET_IFNAME=", "NCCL_NET_PLUGIN="))]
    assert "# NCCL_SOCKET_IFNAME is not here" in efa and "# NCCL_NET_PLUGIN is not here" in efa


# --- fabric.env, run in network namespaces --------------------------------------------

NEED_NETNS = pytest.mark.skipif(
    os.geteuid() != 0 or shutil.which("ip") is None, reason="network namespaces need root and iproute2"
)


@contextmanager
def netns(interfaces: list[tuple[str, str]], default_via: tuple[str, str] | None = None):
    """A throwaway network namespace with `interfaces` [(name, address/prefix)] (veth pairs,
    both ends inside), and a default route (interface, gateway); removed at the end."""
    name = f"cbtest-{uuid.uuid4().hex[:8]}"

    def ip(*args: str) -> None:
        subprocess.run(["ip", "-n", name, *args], check=True, capture_output=True, text=True)

    subprocess.run(["ip", "netns", "add", name], check=True, capture_output=True)
    try:
        ip("link", "set", "lo", "up")
        for n, (ifname, address) in enumerate(interfaces):
            ip("link", "add", ifname, "type", "veth", "peer", "name", f"cbpeer{n}")
            ip("link", "set", f"cbpeer{n}", "up")
            ip("addr", "add", address, "dev", ifname)
            ip("link", "set", ifname, "up")
        if default_via:
            ip("route", "add", "default", "via", default_via[1], "dev", default_via[0])
        yield name
    finally:
        subprocess.run(["ip", "netns", "del", name], capture_output=True)


SHOW = 'printf "%s|%s|%s|%s\\n" "${NCCL_SOCKET_IFNAME-unset}" "${GLOO_SOCKET_IFNAME-unset}" '
SHOW += '"${NCCL_NET_PLUGIN-unset}" "${LD_LIBRARY_PATH-unset}"'


def run_profile(namespace: str, profile: str, tmp: Path, shell: str = "bash") -> tuple[list[str], str]:
    """Source `profile` in `shell` inside the namespace as strict job scripts do (set -eu,
    bash also pipefail), twice; returns the exported values and stderr."""
    path = tmp / f"fabric-{uuid.uuid4().hex[:8]}.env"
    path.write_text(profile)
    strict = "set -euo pipefail" if shell == "bash" else "set -eu"
    script = f"{strict}; unset LD_LIBRARY_PATH NCCL_SOCKET_IFNAME GLOO_SOCKET_IFNAME NCCL_NET_PLUGIN; "
    script += f". {path}; . {path}; {SHOW}; "
    # Nothing but the exports is left behind.
    script += '! command -v __clusterbake_socket_ifname >/dev/null; [ -z "${__clusterbake_ifname+x}" ]'
    proc = subprocess.run(
        ["ip", "netns", "exec", namespace, shell, "-c", script],
        capture_output=True,
        text=True,
        env={"PATH": "/usr/sbin:/usr/bin:/sbin:/bin"},
    )
    assert proc.returncode == 0, proc.stderr
    return proc.stdout.strip().split("|"), proc.stderr


@pytest.fixture(scope="module")
def profiles(bundles) -> dict[str, str]:
    return {group: _file(bundles[group], "/etc/clusterbake/fabric.env") for group in ("g5", "p5")}


@NEED_NETNS
@pytest.mark.parametrize("shell", ["bash", "sh"])
@pytest.mark.parametrize("ifname", ["enp71s0", "host0"])
def test_fabric_env_finds_the_interface_towards_the_head(profiles, aws, shell, ifname):
    """A p5 on Ubuntu names it enp71s0 (local nspawn nodes: host0); a second interface
    holds the default route and must not be taken."""
    tmp = aws["tmp"]
    with netns([(ifname, f"{P5}/24"), ("ens9", "10.200.0.11/24")], default_via=("ens9", "10.200.0.1")) as ns:
        for group in ("g5", "p5"):
            (nccl, gloo, _, _), _ = run_profile(ns, profiles[group], tmp, shell)
            assert (nccl, gloo) == (ifname, ifname), group
    assert "CLUSTERBAKE_FABRIC=tcp" in profiles["g5"] and "CLUSTERBAKE_FABRIC=efa" in profiles["p5"]


@NEED_NETNS
def test_fabric_env_on_the_head_takes_the_interface_holding_its_address(profiles, aws):
    # The route to its own address is `local ... dev lo`: the interface holding it is meant.
    with netns([("enp71s0", f"{HEAD}/24")]) as ns:
        (nccl, gloo, _, _), _ = run_profile(ns, profiles["g5"], aws["tmp"])
    assert (nccl, gloo) == ("enp71s0", "enp71s0")


@NEED_NETNS
def test_fabric_env_falls_back_to_the_default_route_and_else_exports_nothing(profiles, aws):
    # No route to the head but the default one: its interface.
    with netns([("ens5", "10.200.0.11/24")], default_via=("ens5", "10.200.0.1")) as ns:
        (nccl, _, _, _), _ = run_profile(ns, profiles["g5"], aws["tmp"], "sh")
    assert nccl == "ens5"
    # No route at all: NCCL and gloo pick their own; the profile still succeeds.
    with netns([]) as ns:
        (nccl, gloo, _, _), err = run_profile(ns, profiles["g5"], aws["tmp"])
    assert (nccl, gloo) == ("unset", "unset")
    assert "fabric.env found no socket interface" in err


@NEED_NETNS
def test_efa_profile_loads_the_plugin_the_image_build_recorded(profiles, aws):
    tmp = aws["tmp"]
    plugin = tmp / "opt/amazon/ofi-nccl/lib/x86_64-linux-gnu/libnccl-net-ofi.so"
    plugin.parent.mkdir(parents=True, exist_ok=True)
    plugin.write_text("fake plugin\n")
    # What role efa writes at image time (tests/unit/test_gpu_roles.py renders it).
    (tmp / "efa.env").write_text(f"# role efa\nCLUSTERBAKE_OFI_NCCL_PLUGIN={plugin}\n")
    with netns([("enp71s0", f"{P5}/24")]) as ns:
        for shell in ("bash", "sh"):
            (nccl, _, net_plugin, libs), err = run_profile(ns, profiles["p5"], tmp, shell)
            assert (nccl, net_plugin) == ("enp71s0", str(plugin))
            # Sourced twice, the directories are there once.
            assert libs == f"{plugin.parent}:/opt/amazon/efa/lib" and err == ""
        # The recorded file is gone (another image): no NCCL_NET_PLUGIN pointing at nothing.
        (tmp / "efa.env").write_text(f"CLUSTERBAKE_OFI_NCCL_PLUGIN={tmp}/missing/libnccl-net.so\n")
        (_, _, net_plugin, libs), err = run_profile(ns, profiles["p5"], tmp)
        assert (net_plugin, libs) == ("unset", "/opt/amazon/efa/lib")
        assert "no aws-ofi-nccl plugin" in err and "NCCL would use TCP sockets, not EFA" in err
