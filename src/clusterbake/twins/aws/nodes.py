"""Instances of the EC2 twin as real local nodes: one systemd-nspawn machine per instance.

What the twin provides is what EC2's hardware and network provide, nothing of the
product: a root disk (an overlay on the AMI's image, kept while the instance is
stopped, gone when it is terminated), one network interface `ens5` with the
instance's private IP in its subnet (the name Ubuntu gives the primary interface on
Nitro instances), on-link routes to the VPC and to the metadata service, a stable
machine UUID per instance, and the initial hostname EC2 gives (`ip-10-90-0-5`).
Users, keys and the node's name come from the image's own boot service reading the
instance metadata and user data, as on EC2.

Boot time: a container sees the host's uptime, so slurmd would report the host's boot
time, and slurmctld keeps waiting for a node Slurm powered up to boot ("Still waiting
for boot of node"): each node gets a slurmd drop-in that adds `-b` (report the start of
slurmd as the boot, which on a node that just booted it is), as an instance booting
now would report.

Shared file systems: this kernel has no NFS or Lustre client, so each node also gets
the twin's storage directory and a mount helper for `nfs`/`nfs4`/`lustre` that binds
the file system's directory instead (see docs/twin.md: what the twin cannot show).
"""

from __future__ import annotations

import hashlib
import shutil
import subprocess
import uuid
from dataclasses import dataclass
from pathlib import Path

from clusterbake.providers.local import machines, network

TWIN_NETWORK = "twin-aws"  # names the bridge cb-twin-aws and netns cb-twin-aws-<instance id>
MACHINE_PREFIX = f"cb-{TWIN_NETWORK}-"
IFNAME = "ens5"
METADATA_ADDRESS = "169.254.169.254"
STORAGE_INSIDE = "/run/clusterbake-twin/storage"
MOUNT_HELPERS = ("/usr/sbin/mount.nfs", "/usr/sbin/mount.nfs4", "/usr/sbin/mount.lustre")
# After the image's own drop-ins (role slurm's clusterbake.conf); ExecStart as Debian 12's unit has it.
SLURMD_DROP_IN = "/etc/systemd/system/slurmd.service.d/zz-clusterbake-twin.conf"
SLURMD_BOOT_TIME = """# The EC2 twin: a node is a container that sees the host's uptime; -b makes slurmd report
# its start as the node's boot, as an instance that boots now would (nodes.py).
[Service]
ExecStart=
ExecStart=/usr/sbin/slurmd -D -s $SLURMD_OPTIONS -b
"""


@dataclass(frozen=True)
class Instance:
    """What the twin needs to know of an EC2 instance to run it."""

    instance_id: str
    state: str  # EC2's: pending, running, stopping, stopped, shutting-down, terminated
    address: str
    subnet_cidr: str
    image_root: Path


def mac_of(instance_id: str) -> str:
    """The instance's MAC address (EC2's start with 0e or 0a), stable per instance."""
    digest = hashlib.sha256(instance_id.encode()).digest()
    return "0e:" + ":".join(f"{b:02x}" for b in digest[:5])


def ec2_hostname(address: str) -> str:
    return "ip-" + address.replace(".", "-")


class Nodes:
    def __init__(self, root: Path, vpc_cidr: str, mount_helper: Path, log):
        self.root = root
        self.vpc_cidr = vpc_cidr
        self.mount_helper = mount_helper
        self.storage = root / "storage"
        self.log = log

    def machine(self, instance_id: str) -> str:
        return f"{MACHINE_PREFIX}{instance_id}"

    def paths(self, instance_id: str) -> machines.MachinePaths:
        return machines.MachinePaths(self.root / "nodes" / instance_id)

    def running(self) -> dict[str, int]:
        """Instance id -> nspawn PID of every node that runs."""
        return {m[len(MACHINE_PREFIX) :]: pid for m, pid in machines.find_machines(MACHINE_PREFIX).items()}

    def start(self, instance: Instance) -> None:
        netns = network.ensure_node_network(
            TWIN_NETWORK,
            instance.instance_id,
            instance.address,
            instance.subnet_cidr,
            ifname=IFNAME,
            routes=(self.vpc_cidr, f"{METADATA_ADDRESS}/32"),
        )
        network.set_mac(netns, IFNAME, mac_of(instance.instance_id))
        paths = self.paths(instance.instance_id)
        machines.mount_overlay(instance.image_root, paths)
        self.storage.mkdir(parents=True, exist_ok=True)
        drop_in = self.root / "slurmd-boot-time.conf"
        if not drop_in.exists() or drop_in.read_text() != SLURMD_BOOT_TIME:
            drop_in.write_text(SLURMD_BOOT_TIME)
        argv = machines.nspawn_argv(
            self.machine(instance.instance_id),
            ec2_hostname(instance.address),
            paths.root,
            netns,
            {STORAGE_INSIDE: self.storage},
            readonly_binds={**{helper: self.mount_helper for helper in MOUNT_HELPERS}, SLURMD_DROP_IN: drop_in},
            uuid=str(uuid.uuid5(uuid.NAMESPACE_URL, f"ec2:{instance.instance_id}")),
        )
        machines.spawn(argv, self.machine(instance.instance_id), paths.console_log)
        self.log(f"node {instance.instance_id} started at {instance.address}")

    def stop(self, instance_id: str, pid: int | None) -> None:
        """Power the node off, keep its disk (a stopped instance keeps its EBS root volume)."""
        if pid:
            machines.stop(pid)
        busy = machines.remove_cgroups(self.machine(instance_id))
        machines.unmount_tree(self.paths(instance_id).root)
        self.log(f"node {instance_id} stopped" + (f" (cgroups still busy: {busy})" if busy else ""))

    def remove(self, instance_id: str, pid: int | None) -> None:
        """A terminated instance: its node, disk and network go."""
        self.stop(instance_id, pid)
        network.remove_node_network(TWIN_NETWORK, instance_id)
        base = self.paths(instance_id).base
        if base.exists():
            subprocess.run(["rm", "-rf", "--one-file-system", str(base)], check=True)
        self.log(f"node {instance_id} removed")

    def known(self) -> set[str]:
        """Instance ids that have a disk here (running or stopped)."""
        directory = self.root / "nodes"
        return {p.name for p in directory.iterdir()} if directory.is_dir() else set()

    def remove_all(self) -> list[str]:
        removed = []
        running = self.running()
        for instance_id in sorted(self.known() | set(running)):
            self.remove(instance_id, running.get(instance_id))
            removed.append(instance_id)
        for leftover in network.leftover_netns(TWIN_NETWORK):
            network.remove_node_network(TWIN_NETWORK, leftover[len(MACHINE_PREFIX) :])
        if self.storage.exists():
            shutil.rmtree(self.storage)
        return removed
