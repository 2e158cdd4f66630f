"""Instances of the EC2 twin as real local nodes: one systemd-nspawn machine per instance.

The machinery is shared with the Azure twin (src/clusterbake/twins/nodes.py); this module
says what is EC2's.

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

Shared file systems: see twins/nodes.py (the mount helper binds the EFS/FSx directories).
"""

from __future__ import annotations

import hashlib
import uuid
from dataclasses import dataclass
from pathlib import Path

from clusterbake.twins.nodes import SLURMD_DROP_IN, NodeSpec, TwinNodes, slurmd_boot_time

TWIN_NETWORK = "twin-aws"  # names the bridge cb-twin-aws and netns cb-twin-aws-<instance id>
MACHINE_PREFIX = f"cb-{TWIN_NETWORK}-"
IFNAME = "ens5"
METADATA_ADDRESS = "169.254.169.254"
LABEL = "The EC2 twin"
SLURMD_BOOT_TIME = slurmd_boot_time(LABEL)
__all__ = ["SLURMD_DROP_IN", "Instance", "Nodes", "ec2_hostname", "mac_of"]


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


class Nodes(TwinNodes):
    """The EC2 twin's nodes (twins/nodes.py)."""

    def __init__(self, root: Path, vpc_cidr: str, log):
        super().__init__(root, TWIN_NETWORK, IFNAME, (vpc_cidr, f"{METADATA_ADDRESS}/32"), log, label=LABEL)
        self.vpc_cidr = vpc_cidr

    def spec(self, instance: Instance) -> NodeSpec:
        return NodeSpec(
            key=instance.instance_id,
            address=instance.address,
            subnet_cidr=instance.subnet_cidr,
            image_root=instance.image_root,
            hostname=ec2_hostname(instance.address),
            mac=mac_of(instance.instance_id),
            uuid=str(uuid.uuid5(uuid.NAMESPACE_URL, f"ec2:{instance.instance_id}")),
        )
