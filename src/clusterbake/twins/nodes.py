"""What every twin's VMs share: one systemd-nspawn node per VM, on the twin's bridge at its private IP.

A twin (twins/aws: the EC2 twin, twins/azure: the Azure twin) gives each VM of its cloud
what the cloud's hardware and network give: a root disk (an overlay on the image, kept
while the VM is stopped, removed when the VM is deleted), one network interface with the
VM's private IP and MAC on the twin's bridge, on-link routes to the virtual network and
to the cloud's link-local services (the metadata service, Azure's DNS), a machine UUID
per VM and the cloud's first hostname. Users, keys and the node's name come from the
image's own boot service reading the metadata, as in the cloud.

Boot time: a container sees the host's uptime, so slurmd would report the host's boot
time, and slurmctld keeps waiting for a node Slurm powered up to boot ("Still waiting
for boot of node"): each node gets a slurmd drop-in that adds `-b` (report the start of
slurmd as the boot, which on a node that just booted it is), as a VM booting now would.

Shared file systems: this kernel has no NFS or Lustre client, so each node also gets the
twin's storage directory and a mount helper for `nfs`/`nfs4`/`lustre` (mount_helper.py)
that binds the file system's directory instead (see docs/twin.md: what a twin cannot show).
The twin says which file systems exist and how nodes name them (sync_storage).
"""

from __future__ import annotations

import json
import subprocess
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from clusterbake.nspawn import limits, machines, network

STORAGE_INSIDE = "/run/clusterbake-twin/storage"
MOUNT_HELPERS = ("/usr/sbin/mount.nfs", "/usr/sbin/mount.nfs4", "/usr/sbin/mount.lustre")
MOUNT_HELPER = Path(__file__).with_name("mount_helper.py")
# After the image's own drop-ins (role slurm's clusterbake.conf); ExecStart as Debian 12's unit has it.
SLURMD_DROP_IN = "/etc/systemd/system/slurmd.service.d/zz-clusterbake-twin.conf"


def slurmd_boot_time(twin: str) -> str:
    return f"""# {twin}: a node is a container that sees the host's uptime; -b makes slurmd report
# its start as the node's boot, as an instance that boots now would (nodes.py).
[Service]
ExecStart=
ExecStart=/usr/sbin/slurmd -D -s $SLURMD_OPTIONS -b
"""


@dataclass(frozen=True)
class NodeSpec:
    """What a twin needs to boot one VM as a node."""

    key: str  # the VM's stable id (EC2 instance id, Azure vmId): names the machine, netns, disk
    address: str
    subnet_cidr: str
    image_root: Path
    hostname: str
    mac: str
    uuid: str
    binds: dict[str, Path] = field(default_factory=dict)  # inside -> host, read-write
    readonly_binds: dict[str, Path] = field(default_factory=dict)  # inside -> host
    # What the cloud's hardware shows inside the VM besides its NIC, for the twin's prepare (Azure:
    # {"infiniband": [ports]}).
    hardware: dict = field(default_factory=dict)


class TwinNodes:
    """The nodes of one twin: machines `cb-<network>-<key>`, disks under <root>/nodes/<key>."""

    # More stand-ins a twin binds into its nodes: path inside -> program (the Azure twin's blobfuse2).
    extra_helpers: dict[str, Path] = {}

    def __init__(
        self,
        root: Path,
        twin_network: str,
        ifname: str,
        routes: tuple[str, ...],
        log: Callable[[str], None],
        *,
        label: str,
        prepare: Callable[[NodeSpec, Path], None] | None = None,
    ):
        self.root = root
        self.twin_network = twin_network
        self.prefix = f"cb-{twin_network}-"
        self.ifname = ifname
        self.routes = routes
        self.log = log
        self.label = label
        self.prepare = prepare  # called with the node's mounted root before each boot
        self.storage = root / "storage"

    def machine(self, key: str) -> str:
        return f"{self.prefix}{key}"

    def paths(self, key: str) -> machines.MachinePaths:
        return machines.MachinePaths(self.root / "nodes" / key)

    def running(self) -> dict[str, int]:
        """Key -> nspawn PID of every node that runs."""
        return {m[len(self.prefix) :]: pid for m, pid in machines.find_machines(self.prefix).items()}

    def boot(self, spec: NodeSpec) -> None:
        # The host's limits are shared with every other node on it (nspawn/limits.py).
        limits.ensure(len(machines.find_machines("cb-")) + 1, self.log)
        netns = network.ensure_node_network(
            self.twin_network, spec.key, spec.address, spec.subnet_cidr, ifname=self.ifname, routes=self.routes
        )
        network.set_mac(netns, self.ifname, spec.mac)
        paths = self.paths(spec.key)
        machines.mount_overlay(spec.image_root, paths)
        if self.prepare is not None:
            self.prepare(spec, paths.root)
        drop_in = self.root / "slurmd-boot-time.conf"
        text = slurmd_boot_time(self.label)
        if not drop_in.exists() or drop_in.read_text() != text:
            drop_in.write_text(text)
        self.storage.mkdir(parents=True, exist_ok=True)
        helpers = {helper: MOUNT_HELPER for helper in MOUNT_HELPERS} | self.extra_helpers
        argv = machines.nspawn_argv(
            self.machine(spec.key),
            spec.hostname,
            paths.root,
            netns,
            {STORAGE_INSIDE: self.storage, **spec.binds},
            readonly_binds={**helpers, **spec.readonly_binds, SLURMD_DROP_IN: drop_in},
            uuid=spec.uuid,
            # A serial console as a VM has (what its boot prints, the host keys among it): the console
            # log is what GetConsoleOutput returns.
            console="read-only",
        )
        machines.spawn(argv, self.machine(spec.key), paths.console_log)
        self.log(f"node {spec.key} started at {spec.address}")

    def stop(self, key: str, pid: int | None) -> None:
        """Power the node off, keep its disk (a stopped VM keeps its root volume)."""
        if pid:
            machines.stop(pid)
        busy = machines.remove_cgroups(self.machine(key))
        machines.unmount_tree(self.paths(key).root)
        self.log(f"node {key} stopped" + (f" (cgroups still busy: {busy})" if busy else ""))

    def remove(self, key: str, pid: int | None) -> None:
        """A deleted VM: its node, disk and network go."""
        self.stop(key, pid)
        network.remove_node_network(self.twin_network, key)
        base = self.paths(key).base
        if base.exists():
            subprocess.run(["rm", "-rf", "--one-file-system", str(base)], check=True)
        self.log(f"node {key} removed")

    def known(self) -> set[str]:
        """Keys that have a disk here (running or stopped)."""
        directory = self.root / "nodes"
        return {p.name for p in directory.iterdir()} if directory.is_dir() else set()

    def sync_storage(self, directories: set[str], endpoints: dict[str, dict[str, str]]) -> None:
        """The file systems' directories (relative to the storage root: created when new, removed with
        their data when their file system is gone) and the mount helper's map (mount_helper.py)."""
        self.storage.mkdir(parents=True, exist_ok=True)
        manifest = self.storage / "directories.json"
        known = set(json.loads(manifest.read_text())) if manifest.exists() else set()
        for relative in sorted(directories - known):
            (self.storage / relative).mkdir(parents=True, mode=0o755, exist_ok=True)
            self.log(f"file system {relative}: {self.storage / relative}")
        for relative in sorted(known - directories):
            subprocess.run(["rm", "-rf", "--one-file-system", str(self.storage / relative)], check=True)
            self.log(f"file system {relative} deleted: its directory removed")
            parent = (self.storage / relative).parent
            while parent != self.storage and parent.is_dir() and not any(parent.iterdir()):
                parent.rmdir()  # the Azure account's directory once its last share went
                parent = parent.parent
        for name, value in (("directories.json", sorted(directories)), ("endpoints.json", endpoints)):
            text = json.dumps(value, indent=2, sort_keys=True)
            target = self.storage / name
            if not target.exists() or target.read_text() != text:
                tmp = target.with_suffix(".tmp")
                tmp.write_text(text)
                tmp.replace(target)

    def remove_all(self) -> list[str]:
        removed = []
        running = self.running()
        machines.kill_all(list(running.values()))  # the twin goes: its VMs end at once, not one by one
        for key in sorted(self.known() | set(running)):
            self.remove(key, None)
            removed.append(key)
        for leftover in network.leftover_netns(self.twin_network):
            network.remove_node_network(self.twin_network, leftover[len(self.prefix) :])
        if self.storage.exists():
            subprocess.run(["rm", "-rf", "--one-file-system", str(self.storage)], check=True)
        return removed


RUN, STOP, REMOVE = "run", "stop", "remove"
BOOT_RETRY = 30.0  # seconds before a node whose start failed is tried again


@dataclass
class Wanted:
    """What a twin's cloud says of one VM, for the node keeper."""

    key: str
    what: str  # in the log: "instance i-0abc", "VM cpu-1"
    state: str  # RUN, STOP (keep the disk) or REMOVE (the VM is gone or going)
    spec: Callable[[], NodeSpec]  # how to boot it
    # Why it must not boot (not in the twin's network), asked only before a boot.
    outside: Callable[[], str | None] = lambda: None
    restart: bool = False  # the cloud restarted a VM whose node runs: the node reboots
    # What the cloud records when the node powers itself off (EC2 and Azure: the VM is stopped).
    stopped_inside: Callable[[], None] = lambda: None


class NodeKeeper:
    """One state machine for both twins' nodes: boot what the cloud runs (retrying a failed start
    after BOOT_RETRY), stop a VM whose node powered itself off, stop or remove what the cloud stopped
    or deleted, remove nodes of VMs the cloud no longer has."""

    def __init__(self, nodes: TwinNodes, log: Callable[[str], None]):
        self.nodes = nodes
        self.log = log
        self.started: set[str] = set()
        self.failed: dict[str, float] = {}  # key -> when its node's start failed

    def keep(self, wanted: list[Wanted], now: Callable[[], float]) -> set[str]:
        """Bring the nodes to `wanted`; the keys whose nodes run (or were just booted)."""
        running = self.nodes.running()
        known = self.nodes.known()
        up: set[str] = set()
        for vm in wanted:
            pid = running.get(vm.key)
            if vm.state == RUN:
                if pid and vm.restart:
                    self.log(f"{vm.what} restarts: rebooting its node")
                    self.nodes.stop(vm.key, pid)
                    pid = None
                    self.started.discard(vm.key)
                if pid:
                    up.add(vm.key)
                elif vm.key in self.started:
                    self.log(f"node of {vm.what} shut down from inside: the VM is stopped")
                    self.started.discard(vm.key)
                    vm.stopped_inside()
                    self.nodes.stop(vm.key, None)
                elif now() - self.failed.get(vm.key, -1e9) < BOOT_RETRY:
                    continue
                elif reason := vm.outside():
                    self.failed[vm.key] = now()
                    self.log(f"{vm.what} {reason}: not booted")
                else:
                    self._boot(vm, now)
                    if vm.key in self.started:
                        up.add(vm.key)
            elif vm.state == STOP and (pid or vm.key in self.started):
                self.started.discard(vm.key)
                self.nodes.stop(vm.key, pid)
            elif vm.state == REMOVE and (pid or vm.key in known):
                self.started.discard(vm.key)
                self.nodes.remove(vm.key, pid)
        for orphan in (set(running) | known) - {vm.key for vm in wanted}:
            self.started.discard(orphan)
            self.nodes.remove(orphan, running.get(orphan))
        return up

    def _boot(self, vm: Wanted, now: Callable[[], float]) -> None:
        try:
            self.nodes.boot(vm.spec())
            self.started.add(vm.key)
        except Exception:
            self.failed[vm.key] = now()
            self.log(f"node of {vm.what} failed to start:\n{traceback.format_exc()}")
