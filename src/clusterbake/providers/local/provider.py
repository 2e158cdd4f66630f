"""The local provider: a real cluster of systemd-nspawn nodes on this machine."""

from __future__ import annotations

import contextlib
import fcntl
import ipaddress
import json
import os
import subprocess
import threading
import time
from concurrent.futures import Future, ThreadPoolExecutor
from datetime import UTC, datetime, timedelta
from pathlib import Path

import hostlist
import yaml

from clusterbake.errors import ClusterbakeError, ConfigError, NodesDidNotBoot
from clusterbake.images.store import find_local_image
from clusterbake.inventory import CONTROLLER_SHARED_DIR, build_inventory
from clusterbake.nspawn import limits, machines, network, outbound, rootfs
from clusterbake.plan import address_pool, assign_addresses
from clusterbake.progress import say
from clusterbake.providers import common
from clusterbake.providers.base import BillingCheck, CostEstimate, NodeStatus, Provider
from clusterbake.providers.local import node_disk, power_agent
from clusterbake.providers.local.node_disk import write_host_keys  # noqa: F401 (tests build keys with it)
from clusterbake.providers.local.power_agent import HEAD_SOCKET_DIR, SOCKET_NAME
from clusterbake.remote import Endpoint

# Where the image keeps the join program and a node its bundle (role node_join's defaults).
JOIN_PROGRAM = "/usr/local/sbin/clusterbake-node-join"
JOIN_BUNDLE = "/etc/clusterbake/node-join.json"
# A fresh node's bundle for its join during the head's play (see configuring): not JOIN_BUNDLE, so
# that the join after the play still finds the node's bundle missing and applies it whole.
EARLY_BUNDLE = "/etc/clusterbake/node-join.early.json"
# Where a staged interruption notice goes on the node's disk (role notice_agent reads it).
NOTICE_FILE = "/var/lib/clusterbake/notice.json"


def write_file(path: Path, text: str) -> None:
    """Replace a file's content only when it differs (0600: the config may name secrets' paths)."""
    if path.exists() and path.read_text() == text:
        return
    tmp = path.with_suffix(".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as handle:
        handle.write(text)
    tmp.replace(path)


# Compute nodes started at once by `cluster up`: each start is mostly waiting on `ip`, mount and
# nspawn processes, which overlap; more than a few only crowd 2 cores.
START_WORKERS = 4


class LocalProvider(Provider):
    # Compute nodes this run started whose SSH is awaited in after_configure (see provision).
    _booting: tuple[str, ...] = ()
    # provision()'s background starts of the compute nodes (finish_provision awaits them).
    _starter: ThreadPoolExecutor | None = None
    _starts: dict[str, Future] = {}
    # Nodes joined during the play (configuring): {name: (the bundle applied, the services held)}.
    _joined_early: dict[str, tuple[bytes, list[str]]] = {}

    @property
    def machine_prefix(self) -> str:
        return f"cb-{self.config.cluster_name}-"

    def machine_name(self, node: str) -> str:
        return f"{self.machine_prefix}{node}"

    def addresses(self) -> dict[str, str]:
        """Every planned node's address, kept for good (state.json): a new node takes the first free
        one, so growing a group never moves another node."""
        kept = {name: node.get("address") for name, node in self.cluster.read_state().get("nodes", {}).items()}
        subnet = self.config.local.subnet
        # The host takes the first address; in a /26 or larger the head starts at the 10th.
        skip = 9 if ipaddress.ip_network(subnet).num_addresses >= 64 else 1
        return assign_addresses(
            [n.name for n in self.nodes], address_pool(subnet, skip_first=skip), kept, "local.subnet"
        )

    def _paths(self, node: str) -> machines.MachinePaths:
        return machines.MachinePaths(self.cluster.node(node))

    def _binds(self) -> dict[str, Path]:
        binds = {"/home": self.cluster.home}
        for mount in self.config.effective_storage():
            binds[mount.mount_point] = self.cluster.storage(mount.name)
        return binds

    def _head_binds(self) -> dict[str, Path]:
        """With a backup controller, what both heads share (slurmctld's state, the power program's):
        a host directory, bound into the heads only (root's; the join makes SlurmUser's folders in it)."""
        return {CONTROLLER_SHARED_DIR: self.controller_dir} if self.config.head.count > 1 else {}

    @property
    def controller_dir(self) -> Path:
        return self.cluster.root / "controller"

    # --- lifecycle -------------------------------------------------------------------

    def validate(self) -> None:
        """Host limits the schema cannot know: slurmd drains a node that has less than it is told."""
        cpus = os.cpu_count() or 1
        memory_mb = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") // 2**20
        sections = [("head", self.config.head)] + [
            (f"node_groups.{i}", g) for i, g in enumerate(self.config.node_groups)
        ]
        for field, section in sections:
            if section.cpus > cpus:
                raise ConfigError(f"{field}.cpus: {section.cpus} is more than this host's {cpus} CPUs; lower it")
            if section.memory_mb > memory_mb:
                raise ConfigError(
                    f"{field}.memory_mb: {section.memory_mb} is more than this host's {memory_mb} MiB; lower it"
                )
        self.addresses()

    def host_limit_report(self) -> list[str]:
        """The host limits this cluster would exceed (`validate` shows them; `cluster up` raises them)."""
        host_nodes = self.host_nodes()
        return [
            f"host limit: {limits.describe(short, host_nodes)}; `cluster up` raises it as root ({short.command()})"
            for short in limits.shortfalls(host_nodes)
        ]

    def host_nodes(self) -> int:
        """Nodes the host runs once this cluster is at its largest: every planned node (elastic ones
        at max_count) and the nspawn machines of other clusters and twins, which share the limits."""
        others = [m for m in machines.find_machines("cb-") if not m.startswith(self.machine_prefix)]
        return len(self.nodes) + len(others)

    def find_image(self) -> Path:
        """The local image (a directory with rootfs/) from the image store."""
        return find_local_image(self.config, self.state)

    def provision(self, image: Path | str) -> None:
        image_root = Path(image) / "rootfs"
        state = self.cluster.read_state()
        if state.get("image") and state["image"] != str(image):
            say(
                f"    nodes keep their image {Path(state['image']).name}; "
                f"`clusterbake ops image_update` moves them to {Path(image).name}, one group at a time"
            )
            image_root = Path(state["image"]) / "rootfs"
            image = state["image"]
        if not image_root.is_dir():
            raise ClusterbakeError(f"image root {image_root} is missing; run `make image`")
        self.cluster.ensure_secrets()
        for directory in [*self._binds().values(), *self._head_binds().values()]:
            directory.mkdir(parents=True, exist_ok=True)
            machines.ensure_nosuid_nodev(directory)
        self.power_agent_dir.mkdir(mode=0o755, exist_ok=True)
        # Shared storage is like /tmp: every user can create their own directories
        # (checkpoints, job logs); the sticky bit keeps them theirs.
        for mount in self.config.effective_storage():
            self.cluster.storage(mount.name).chmod(0o1777)
        self.cluster.write_state(
            {
                "cluster": self.config.cluster_name,
                "provider": "local",
                "image": str(image),
                "subnet": self.config.local.subnet,
                "nodes": {name: {"address": address} for name, address in self.addresses().items()},
            }
        )
        write_file(self.config_path, yaml.safe_dump(self.config.model_dump(mode="json", exclude_unset=True)))
        limits.ensure(self.host_nodes(), say)
        bridge = network.ensure_bridge(self.config.cluster_name, self.config.local.subnet)
        self._ensure_outbound(bridge)
        if self.powered_by_slurm:
            self.ensure_power_agent()
        running = machines.find_machines(self.machine_prefix)
        # Elastic nodes stay powered down until Slurm asks for them. A node whose supervisor
        # died (an orphan) is not running: _start ends it and boots it again.
        started = [n.name for n in self.nodes if not n.elastic and self.machine_name(n.name) not in running]
        orphans = machines.find_orphans(self.machine_prefix)  # one look at the host's processes for all
        heads = [name for name in started if self.node(name).role == "head"]
        computes = [name for name in started if name not in heads]
        for name in heads:
            self._start(name, Path(image), orphans)
        self._write_known_hosts()
        # Ansible connects to the head only: the compute nodes start and boot while it is configured
        # (on 2 cores, starting 32 took 7 s before the play could begin), awaited by after_configure
        # (finish_provision) before their bundles.
        if computes:
            self._starter = ThreadPoolExecutor(max_workers=START_WORKERS, thread_name_prefix="start")
            self._starts = {name: self._starter.submit(self._start, name, Path(image), orphans) for name in computes}
        try:
            self.wait_ssh(heads)
        except BaseException:
            self._end_starts()  # a rollback must not race nodes still being started
            raise
        self._booting = tuple(computes)

    @property
    def _default_via(self) -> str | None:
        """The nodes' default route (local.outbound): the host's bridge address; None, no way out."""
        return str(network.host_address(self.config.local.subnet).ip) if self.config.local.outbound else None

    def _ensure_outbound(self, bridge: str) -> None:
        """NAT through the host as local.outbound says, and the running nodes' default routes with it."""
        cluster = self.config.cluster_name
        if self.config.local.outbound:
            if outbound.ensure(cluster, self.config.local.subnet, bridge):
                table = outbound.table_name(cluster)
                say(f"    outbound: the nodes reach beyond this machine through it (nftables {table})")
        elif outbound.remove(cluster):
            say("    outbound: off (the nodes reach this machine's bridge address only)")
        for name in self.running_nodes():
            network.set_default_route(network.netns_name(cluster, name), "host0", self._default_via)

    def _end_starts(self) -> list[BaseException]:
        """Wait for every background start to end; the failures, in start order."""
        if self._starter is None:
            return []
        self._starter.shutdown(wait=True)
        failures = [error for future in self._starts.values() if (error := future.exception()) is not None]
        self._starter, self._starts = None, {}
        return failures

    @contextlib.contextmanager
    def configuring(self):
        """While the head's play runs, the compute nodes this run started that never joined join as
        soon as the play has kept their group's bundle (it does so early in its first play), but for
        the bundle's `after_controller` services (a configless slurmd fetches its slurm.conf from
        slurmctld, which starts at the play's end). after_configure hands the bundle over and the
        join there starts those. On 2 cores that join work (users, files, munge, node exporter,
        notice agent) fills the play's idle time instead of following it. A node whose early join
        fails is reported and joined whole after the play, as it would be without this."""
        if not self._booting:
            yield
            return
        played = threading.Event()
        self._joined_early = {}
        # mtime is the kernel's coarse clock: a bundle this play writes is newer than a second ago.
        since = time.time() - 1.0
        worker = threading.Thread(target=self._join_early, args=(since, played), name="early-join", daemon=True)
        worker.start()
        try:
            yield
        finally:
            played.set()
            worker.join()

    def _join_early(self, since: float, played: threading.Event) -> None:
        try:
            self._join_groups_early(since, played)
        except Exception as exc:  # the joins after the play do it all: a failure here only costs time
            say(f"    warning: joining nodes during the play stopped ({exc}); they join after it")

    def _join_groups_early(self, since: float, played: threading.Event) -> None:
        groups: dict[str, list[str]] = {}
        for name in self._booting:
            groups.setdefault(self.node(name).nodegroup, []).append(name)
        while groups and not played.is_set():
            for group in list(groups):
                path = self.cluster.join_bundles / f"{group}.json"
                with contextlib.suppress(FileNotFoundError):
                    if path.stat().st_mtime >= since:
                        self._join_group_early(groups.pop(group), path.read_bytes(), played)
            played.wait(0.2)

    def _join_group_early(self, names: list[str], bundle: bytes, played: threading.Event) -> None:
        """Join a group's nodes as each has started and answers SSH (its systemd is up), until the
        play ends (after_configure joins the rest). A node with a bundle of its own (a disk it
        joined before) is not fresh: after_configure compares its bundle with the group's."""
        held = json.loads(bundle).get("after_controller")
        if held is None:  # roles from before the field: the whole join after the play
            return
        addresses, pending = self.addresses(), list(names)
        while pending and not played.is_set():
            done = [name for name in pending if self._starts[name].done()]
            # A failed start is finish_provision's to report.
            ready = [n for n in done if self._starts[n].exception() is None and machines.sshd_answers(addresses[n])]
            pending = [n for n in pending if n not in ready and not (n in done and self._starts[n].exception())]
            fresh = [name for name in ready if not (self._paths(name).root / JOIN_BUNDLE.lstrip("/")).exists()]
            if fresh:
                self._run_early_joins(fresh, bundle, held)
            if pending:
                played.wait(0.2)

    def _run_early_joins(self, names: list[str], bundle: bytes, held: list[str]) -> None:
        inits = machines.node_inits(self.machine_prefix)
        nodes = {self.machine_name(name): name for name in names if self.machine_name(name) in inits}
        # Staged, not at JOIN_BUNDLE: a node whose early join ended (or clusterbake with it) before
        # after_configure released its held services has no bundle, so a next join applies it whole.
        for name in nodes.values():
            node_disk.write_private(self._paths(name).root, EARLY_BUNDLE, bundle)
        argv = [JOIN_PROGRAM, "--bundle", EARLY_BUNDLE, *(f"--hold={service}" for service in held)]
        try:
            results = machines.run_inside({machine: inits[machine] for machine in nodes}, argv)
        finally:
            for name in nodes.values():
                rootfs.remove_in_root(self._paths(name).root, EARLY_BUNDLE)
        joined = []
        for machine, result in sorted(results.items()):
            if result.returncode == 0:
                joined.append(nodes[machine])
                self._joined_early[nodes[machine]] = (bundle, held)
            else:
                say(f"    {nodes[machine]}: its join during the play failed ({_first_error(result)}); it joins after")
        if joined:
            but = f", but for {', '.join(held)}" if held else ""
            say(f"    {hostlist.collect_hostlist(joined)} joined during the play{but}")

    def finish_provision(self) -> None:
        """The compute nodes provision() started in the background are started (not yet booted:
        after_configure waits for their SSH) and their host keys known; a failed start raises
        NodesDidNotBoot, so that a new cluster is rolled back."""
        if self._starter is None:
            return
        failures = self._end_starts()
        self._write_known_hosts()
        if failures:
            raise NodesDidNotBoot(f"starting the compute nodes failed: {failures[0]}") from failures[0]

    # --- images: the cluster's, and each node disk's own -------------------------------

    @property
    def cluster_image(self) -> Path:
        """The image a node given a new disk boots (state.json's `image`)."""
        return Path(self.cluster.read_state()["image"])

    def _image_record(self, name: str) -> Path:
        return self._paths(name).base / "image"

    def disk_image(self, name: str) -> Path | None:
        """The image a node's disk was made from; None when the node has no disk. A disk made before
        nodes recorded theirs is the cluster's image's (there was only one)."""
        if not self._paths(name).upper.is_dir():
            return None
        record = self._image_record(name)
        return Path(record.read_text().strip()) if record.exists() else self.cluster_image

    def _start(self, name: str, image: Path | None = None, orphans: dict[str, int] | None = None) -> None:
        """Boot a node on its own disk, or on a new disk from `image` (default: the cluster's).
        `orphans`: machines.find_orphans of the cluster, when the caller looked already.

        An elastic node whose disk is of another image than the cluster's gets a new disk: a powered
        down node boots the newest image the cluster moved to (a rolling image update)."""
        paths = self._paths(name)
        paths.base.mkdir(parents=True, exist_ok=True)
        # One start at a time per node: provision's background start and the power agent (the head's
        # reconcile loop, a resume) can be asked for the same node; the second finds it running.
        with open(paths.base / "start.lock", "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            if machines.mounted_at(paths.root) and self.machine_name(name) in machines.find_machines(
                self.machine_name(name)
            ):
                return
            self._start_locked(name, image, orphans)

    def _start_locked(self, name: str, image: Path | None, orphans: dict[str, int] | None) -> None:
        if orphans is None:
            orphans = machines.find_orphans(self.machine_name(name))
        orphan = orphans.get(self.machine_name(name))
        if orphan is not None:
            # Its nspawn died and its init runs on without it: nothing can supervise or stop it
            # any more, so it ends (its jobs were requeued by Slurm) and boots again below.
            self.tell_slurm_down(name, f"clusterbake: {name}'s nspawn supervisor died; restarting the node")
            machines.end_orphans([orphan])
            machines.remove_cgroups(self.machine_name(name))
            say(f"    {name}: its nspawn supervisor had died (init PID {orphan} ran on): ended, starting it again")
        current = self.disk_image(name)
        if current is not None and self.node(name).elastic and current != self.cluster_image:
            say(f"    {name}: a new disk from {self.cluster_image.name} (its disk was of {current.name})")
            self._remove_disk(name)
            current = None
        image = current or image or self.cluster_image
        image_root = image / "rootfs"
        if not image_root.is_dir():
            raise ClusterbakeError(f"image root {image_root} of node {name} is missing; run `make image`")
        address = self.addresses()[name]
        netns = network.ensure_node_network(
            self.config.cluster_name, name, address, self.config.local.subnet, default_via=self._default_via
        )
        paths = self._paths(name)
        machines.mount_overlay(image_root, paths)
        if current is None:
            self._image_record(name).write_text(f"{image}\n")
        self._personalize(name, paths.root)
        machines.mask_in_root(
            paths.root,
            machines.CONTAINER_IDLE_GENERATORS + node_disk.NFS_GENERATORS,
            machines.CONTAINER_IDLE_UNITS + node_disk.NFS_UNITS,
        )
        self._hand_over_join_bundle(name, paths.root)
        init_args = []
        if name in self.injected("boot-fail"):
            # Fault injection for the tests: the node boots, but its sshd never starts.
            say(f"    {name}: injected boot failure (inject/boot-fail): ssh.service masked")
            init_args.append("systemd.mask=ssh.service")
        head = self.node(name).role == "head"
        argv = machines.nspawn_argv(
            self.machine_name(name),
            name,
            paths.root,
            netns,
            self._binds() | (self._head_binds() if head else {}),
            # The heads alone see the power agent's socket (security review finding 17).
            readonly_binds=self._gpu_devices(name) | ({HEAD_SOCKET_DIR: self.power_agent_dir} if head else {}),
            init_args=init_args,
            # Compute nodes cannot spoof an address on the bridge (security review finding 17): the head
            # alone keeps CAP_NET_ADMIN (quickack), no node CAP_NET_RAW.
            network_admin=head,
            raw_sockets=False,
        )
        machines.spawn(argv, self.machine_name(name), paths.console_log, shared_cpu=self.node(name).role == "compute")

    def _gpu_devices(self, name: str) -> dict[str, Path]:
        """Placeholder GPUs of the node's group (`gpus: N`; node_disk.placeholder_gpus)."""
        group = next((g for g in self.config.node_groups if g.name == self.node(name).nodegroup), None)
        if group is None or not group.gpus:
            return {}
        return node_disk.placeholder_gpus(self._paths(name).base / "devices", group.gpus)

    def injected(self, kind: str) -> set[str]:
        """Node names listed in `<cluster dir>/inject/<kind>` (fault injection for the tests: boot-fail,
        resume-fail, suspend-fail); none without the file."""
        path = self.cluster.root / "inject" / kind
        return set(path.read_text().split()) if path.exists() else set()

    def _personalize(self, name: str, root: Path) -> None:
        """First boot only: identity of the node (hostname, machine-id, host keys, access)."""
        others = {node: address for node, address in self.addresses().items() if node != name}
        public_key = self.cluster.ssh_key.with_suffix(".pub").read_text()
        node_disk.personalize(root, name, f"{self.config.cluster_name}/{name}", public_key, others)

    def _hand_over_join_bundle(self, name: str, root: Path) -> None:
        """A compute or login node that boots with its group's bundle joins by itself (no Ansible run)."""
        node = self.node(name)
        bundle = self.cluster.join_bundles / f"{node.nodegroup}.json"
        if node.role == "head" or not bundle.exists():
            return
        node_disk.write_private(root, JOIN_BUNDLE, bundle.read_bytes())

    def _write_known_hosts(self) -> None:
        lines = []
        for name, address in self.addresses().items():
            pub = self._paths(name).root / "etc" / "ssh" / "ssh_host_ed25519_key.pub"
            if pub.exists():
                key = " ".join(pub.read_text().split()[:2])
                lines.append(f"{name},{address} {key}")
        self.cluster.known_hosts.write_text("\n".join(lines) + "\n")

    def wait_ssh(self, names: list[str], timeout: float | None = None) -> None:
        timeout = timeout or self.config.local.boot_timeout
        addresses = self.addresses()
        pending = set(names)
        deadline = time.monotonic() + timeout
        while pending and time.monotonic() < deadline:
            pending -= {name for name in sorted(pending) if machines.sshd_answers(addresses[name])}
            if pending:
                time.sleep(0.1)
        if pending:
            kept = self.keep_evidence(sorted(pending))
            raise NodesDidNotBoot(
                f"nodes {', '.join(sorted(pending))} did not answer SSH within {timeout:.0f}s; their console logs "
                f"and journals are kept (a rollback leaves the logs directory): {', '.join(map(str, kept))}"
            )

    def keep_evidence(self, names: list[str]) -> list[Path]:
        """Copy each node's console log and the tail of its journal under the cluster's logs directory,
        which outlives the node (and a rollback); the copies' paths."""
        folder = self.cluster.logs / f"failed-nodes-{time.strftime('%Y%m%d-%H%M%S')}"
        folder.mkdir(parents=True, exist_ok=True)
        kept = []
        running = machines.find_machines(self.machine_prefix)
        for name in names:
            console = self._paths(name).console_log
            target = folder / f"{name}.console.log"
            target.write_bytes(console.read_bytes() if console.exists() else b"(no console output)\n")
            kept.append(target)
            journal = folder / f"{name}.journal.txt"
            journal.write_text(node_disk.journal_tail(running.get(self.machine_name(name)), self._paths(name).root))
            kept.append(journal)
        return kept

    def start_node(self, name: str) -> None:
        self.node(name)
        if self.machine_name(name) in machines.find_machines(self.machine_prefix):
            return
        self._start(name)
        self._write_known_hosts()  # a node started from scratch has new host keys
        self.wait_ssh([name])

    def stop_node(self, name: str) -> None:
        self.node(name)
        if self.machine_name(name) in machines.find_machines(self.machine_prefix):
            self.tell_slurm_down(name, "stopped by clusterbake node stop")
        self.power_off(name)

    def replace_node(self, name: str, image: Path | str | None = None) -> None:
        """A new disk from `image` (default: the cluster's) and a boot; the node joins by itself from
        its group's bundle. An elastic node that is powered down only loses its disk: it boots the
        cluster's image when Slurm powers it up. With another image, that image becomes the cluster's
        (every node given a new disk from now on boots it)."""
        node = self.node(name)
        if node.role != "compute":
            raise ConfigError(f"node {name}: only compute nodes are replaced (the head keeps Slurm's state)")
        if image is not None:
            self.use_image(image)
        image = self.cluster_image
        running = name in self.running_nodes()
        self.power_off(name)
        self._remove_disk(name)
        if node.elastic and not running:
            say(f"    {name}: powered down; boots {image.name} when Slurm powers it up")
            return
        self._start(name, image)
        self._write_known_hosts()  # its new disk has new host keys
        self.wait_ssh([name])

    def use_image(self, image: Path | str) -> bool:
        """Make `image` the cluster's: nodes keep their disks (each records its image first), new
        disks come from it. False: it already was."""
        image = Path(image)
        if image == self.cluster_image:
            return False
        if not (image / "rootfs").is_dir():
            raise ClusterbakeError(f"image {image} has no rootfs; run `clusterbake image build`")
        old = self.cluster_image
        for node in self.nodes:
            if self._paths(node.name).upper.is_dir() and not self._image_record(node.name).exists():
                self._image_record(node.name).write_text(f"{old}\n")
        state = self.cluster.read_state()
        self.cluster.write_state({**state, "image": str(image)})
        say(f"    cluster image: {old.name} -> {image.name} (new disks boot it)")
        return True

    def _remove_disk(self, name: str) -> None:
        """A halted node's disk and identity (overlay upper dir, host keys, records); its address stays."""
        base = self._paths(name).base
        machines.unmount_tree(base)
        if base.exists():
            subprocess.run(["rm", "-rf", "--one-file-system", str(base)], check=True)

    def after_configure(self) -> list[str]:
        """Running compute and login nodes get their group's join bundle where theirs differs: the bundle
        written into the node's disk from here, then applied in the node (nsenter, in parallel): no
        SSH and no Ansible. A node that boots later takes it from its disk. A node that joined
        during the play with this bundle (configuring) only has its held services started."""
        self.finish_provision()
        early, self._joined_early = self._joined_early, {}
        self.wait_ssh([name for name in self._booting if name not in early])
        self._booting = ()
        running = self.running_nodes()
        inits = machines.node_inits(self.machine_prefix)
        drifted: dict[str, int] = {}
        held: dict[tuple[str, ...], dict[str, int]] = {}
        for node in self.nodes:
            path = self.cluster.join_bundles / f"{node.nodegroup}.json"
            machine = self.machine_name(node.name)
            if node.role == "head" or node.name not in running or machine not in inits or not path.exists():
                continue
            bundle = path.read_bytes()
            target = self._paths(node.name).root / JOIN_BUNDLE.lstrip("/")
            try:
                same = target.read_bytes() == bundle
            except OSError:
                same = False
            if same:
                continue
            self._hand_over_join_bundle(node.name, self._paths(node.name).root)
            if node.name in early and early[node.name][0] == bundle:
                held.setdefault(tuple(early[node.name][1]), {})[machine] = inits[machine]
            else:
                drifted[machine] = inits[machine]
        results = machines.run_inside(drifted, [JOIN_PROGRAM, "--bundle", JOIN_BUNDLE]) if drifted else {}
        for services, group_inits in held.items():
            if services:
                results |= machines.run_inside(group_inits, ["systemctl", "start", *services])
        broken = {m[len(self.machine_prefix) :]: r for m, r in results.items() if r.returncode != 0}
        if broken:
            raise ClusterbakeError(
                "joining failed on " + "; ".join(f"{n}: {_first_error(r)}" for n, r in sorted(broken.items()))
            )
        applied = sorted(m[len(self.machine_prefix) :] for m in drifted)
        released = sorted(m[len(self.machine_prefix) :] for group in held.values() for m in group)
        if applied:
            say(f"    join bundle applied on {', '.join(applied)} (theirs differed)")
        for services, group in held.items():
            names = [m[len(self.machine_prefix) :] for m in group]
            say(f"    {hostlist.collect_hostlist(names)}: joined, {', '.join(services) or 'nothing'} started")
        return [f"{name}: new join bundle applied" for name in applied + released]

    # --- power (the power agent's side: no SSH wait, no Slurm update) ------------------

    def power_on(self, name: str) -> None:
        """Boot a node; it joins by itself from its group's bundle (written into it first)."""
        self.node(name)
        if self.machine_name(name) not in machines.find_machines(self.machine_prefix):
            self._start(name)

    def power_off(self, name: str) -> None:
        """Halt a node and release its mounts and cgroups; its disk stays (like a stopped instance)."""
        pid = machines.find_machines(self.machine_prefix).get(self.machine_name(name))
        if pid:
            machines.stop(pid)
        machines.remove_cgroups(self.machine_name(name))
        machines.unmount_tree(self._paths(name).root)

    def interrupt_node(self, name: str, seconds: int) -> None:
        """A spot reclaim, staged: the notice the node's agent reads (role notice_agent, the shape of
        EC2's spot/instance-action), then after `seconds` the machine ends abruptly, as a reclaimed
        instance does. Its disk stays without the notice: the head's reconcile loop starts it again."""
        if self.node(name).role != "compute":
            raise ConfigError(f"node interrupt: {name} is not a compute node")
        pid = machines.find_machines(self.machine_prefix).get(self.machine_name(name))
        if pid is None:
            raise ClusterbakeError(f"node interrupt: {name} is not running")
        at = datetime.now(UTC) + timedelta(seconds=seconds)
        notice = {"action": "terminate", "time": at.strftime("%Y-%m-%dT%H:%M:%SZ")}
        rootfs.write_in_root(self._paths(name).root, NOTICE_FILE, (json.dumps(notice) + "\n").encode())
        say(f"    {name}: interruption notice for {notice['time']}; the machine goes in {seconds} s")
        deadline = time.monotonic() + seconds
        while (left := deadline - time.monotonic()) > 0:
            time.sleep(min(left, 10.0))
            if left > 10:
                say(f"    {name}: reclaimed in {max(0, left - 10):.0f} s")
        machines.kill_all([pid])
        rootfs.remove_in_root(self._paths(name).root, NOTICE_FILE)  # a new instance has none
        machines.remove_cgroups(self.machine_name(name))
        machines.unmount_tree(self._paths(name).root)
        say(f"    {name}: reclaimed (its machine ended; the head's reconcile loop starts it again)")

    def refresh_known_hosts(self) -> None:
        self._write_known_hosts()

    def running_nodes(self) -> set[str]:
        """Nodes whose machine runs, orphans included (they still work; `cluster up` restarts them)."""
        found = set(machines.find_machines(self.machine_prefix)) | set(machines.find_orphans(self.machine_prefix))
        return {m[len(self.machine_prefix) :] for m in found}

    @property
    def powered_by_slurm(self) -> bool:
        """Whether the head's power program starts nodes: elastic ones, or lost static ones."""
        return any(n.elastic for n in self.nodes) or self.config.recovery.replace_lost_nodes

    def ensure_power_agent(self) -> None:
        """The host-side service the head's ResumeProgram and SuspendProgram call (power_agent.py)."""
        power_agent.ensure_running(
            self.cluster, self.config_path, self.state.root, self.power_agent_dir, self.power_token_file
        )

    def stop_power_agent(self) -> bool:
        return power_agent.stop(self.cluster)

    @property
    def config_path(self) -> Path:
        """The config this cluster runs with (written by provision), for the power agent."""
        return self.cluster.root / "config.yaml"

    @property
    def power_agent_dir(self) -> Path:
        """The power agent's socket directory, bound into the head only."""
        return self.cluster.root / "power-agent"

    @property
    def power_token_file(self) -> Path:
        return self.cluster.root / "secrets" / "power.token"

    def rollback(self) -> list[str]:
        """After a failed first `cluster up`: all of destroy() but the logs, which hold the evidence."""
        return self.destroy(keep_logs=True)

    def destroy(self, keep_logs: bool = False) -> list[str]:
        """Stop every node (also ones a lost state file no longer names), all at once, then remove all."""
        removed = []
        if self.stop_power_agent():
            removed.append("power agent")
        running = machines.find_machines(self.machine_prefix)
        orphans = machines.find_orphans(self.machine_prefix)
        names = {n.name for n in self.nodes} | set(self.cluster.read_state().get("nodes", {}))
        names |= {m[len(self.machine_prefix) :] for m in [*running, *orphans]}
        nodes_dir = self.cluster.root / "nodes"
        if nodes_dir.is_dir():
            names |= {p.name for p in nodes_dir.iterdir()}
        names |= {ns[len(self.machine_prefix) :] for ns in network.leftover_netns(self.config.cluster_name)}
        # Every node ends at once (its init killed: no clean shutdown of a node whose disk goes
        # next; shared storage is on the host) while the links and namespaces go.
        with ThreadPoolExecutor(max_workers=1) as pool:
            unplugged = pool.submit(network.remove_node_networks, self.config.cluster_name, sorted(names))
            machines.kill_all(list(running.values()))
            machines.end_orphans(list(orphans.values()))
            unplugged.result()
        removed += [f"machine {machine}" for machine in sorted(running)]
        removed += [
            f"machine {machine} (its nspawn supervisor had died; init PID {pid})"
            for machine, pid in sorted(orphans.items())
        ]
        busy = []
        for name in sorted(names):
            busy += machines.remove_cgroups(self.machine_name(name))
        if busy:
            # Something of a node still runs: keep the state (its paths, its names), so that the
            # next `cluster down` finds it again.
            raise ClusterbakeError(
                f"cgroups still busy after stopping the nodes: {', '.join(busy)}; the cluster's state is kept "
                f"under {self.cluster.root}: run `cluster down` again, or end those processes (see the cgroups' "
                "cgroup.procs)"
            )
        if outbound.remove(self.config.cluster_name):
            removed.append(f"nftables table {outbound.table_name(self.config.cluster_name)} (the nodes' way out)")
        if network.link_exists(network.bridge_name(self.config.cluster_name)):
            network.remove_bridge(self.config.cluster_name)
            removed.append(f"bridge {network.bridge_name(self.config.cluster_name)}")
        machines.unmount_tree(self.cluster.root)
        if self.cluster.root.exists():
            kept = {self.cluster.logs} if keep_logs else set()
            doomed = [p for p in self.cluster.root.iterdir() if p not in kept] if kept else [self.cluster.root]
            if doomed:
                subprocess.run(["rm", "-rf", "--one-file-system", *map(str, doomed)], check=True)
            removed.append(f"state {self.cluster.root}" + (f" (kept {self.cluster.logs})" if kept else ""))
        return removed

    # --- queries ---------------------------------------------------------------------

    def status(self) -> list[NodeStatus]:
        running = machines.find_machines(self.machine_prefix)
        orphans = machines.find_orphans(self.machine_prefix)
        addresses = self.addresses()
        exists = self.cluster.exists()
        result = []
        for node in self.nodes:
            if (orphan := orphans.get(self.machine_name(node.name))) is not None:
                detail = f"its nspawn supervisor died; its init (PID {orphan}) runs on: `cluster up` restarts it"
                result.append(
                    NodeStatus(node.name, node.role, node.nodegroup, addresses[node.name], "orphaned", detail)
                )
                continue
            if self.machine_name(node.name) in running:
                state = "running"
            elif exists and self.cluster.node(node.name).exists():
                state = "stopped"
            else:
                state = "absent"
            image = self.disk_image(node.name) if exists else None
            name = image.name if image else None
            result.append(NodeStatus(node.name, node.role, node.nodegroup, addresses[node.name], state, image=name))
        return result

    def inventory(self) -> dict:
        """Every planned node (running or not: Ansible connects to the head only)."""
        running = machines.find_machines(self.machine_prefix)
        hostvars = {n.name: {"clusterbake_running": self.machine_name(n.name) in running} for n in self.nodes}
        return build_inventory(
            self.config, self.nodes, self.addresses(), extra_vars=self._connection_vars(), extra_hostvars=hostvars
        )

    def _connection_vars(self) -> dict:
        return {
            "ansible_user": "root",
            "ansible_ssh_private_key_file": str(self.cluster.ssh_key),
            "ansible_ssh_common_args": " ".join(self._ssh_options()),
            **common.controller_files(self.cluster),
            # Compute nodes join from their bundle: at boot, or pushed by after_configure.
            "node_join_self_join": True,
            "fabric_socket_ifname": "host0",
            # Containers report the host's boot time: slurmd -b tells slurmctld it (re)booted now.
            "slurm_slurmd_extra_options": ["-b"],
            # Elastic nodes: the head's power programs call the host's power agent on its socket.
            "slurm_power_agent_url": f"unix://{HEAD_SOCKET_DIR}/{SOCKET_NAME}",
            "slurm_power_token_controller_file": str(self.power_token_file),
        }

    def _ssh_options(self) -> list[str]:
        return [
            "-o",
            f"UserKnownHostsFile={self.cluster.known_hosts}",
            "-o",
            "StrictHostKeyChecking=yes",
            "-o",
            "IdentitiesOnly=yes",
            "-o",
            "LogLevel=ERROR",
        ]

    def endpoint(self, node: str) -> Endpoint:
        """root at the node's bridge address, with the cluster key; host keys pinned by _write_known_hosts."""
        self.node(node)
        return Endpoint(
            name=node,
            host=self.addresses()[node],
            user="root",
            key_file=self.cluster.ssh_key,
            known_hosts=self.cluster.known_hosts,
            host_key_policy="pinned",
        )

    # --- cost ------------------------------------------------------------------------

    def cost(self) -> CostEstimate:
        return CostEstimate(note="local: the nodes run on this machine; nothing bills by the hour")

    def billing_leftovers(self) -> BillingCheck:
        return BillingCheck(note="local: nothing bills")


def _first_error(result) -> str:
    if isinstance(result, Exception):
        return str(result).splitlines()[0]
    text = result.stderr.decode(errors="replace").strip().splitlines()
    return text[-1] if text else f"exit status {result.returncode}"
