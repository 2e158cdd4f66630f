"""The local provider: a real cluster of systemd-nspawn nodes on this machine."""

from __future__ import annotations

import hashlib
import ipaddress
import os
import secrets
import stat
import subprocess
import sys
import time
import uuid
from pathlib import Path

import yaml

from clusterbake import remote
from clusterbake.errors import ClusterbakeError, ConfigError
from clusterbake.images.store import find_local_image
from clusterbake.inventory import build_inventory
from clusterbake.nspawn import machines, network
from clusterbake.plan import address_pool, assign_addresses
from clusterbake.progress import say
from clusterbake.providers.base import BillingCheck, CostEstimate, NodeStatus, Provider
from clusterbake.remote import Endpoint
from clusterbake.state import write_secret

SSH_READY_TIMEOUT = 60.0
POWER_AGENT_PORT = 6820
# Where the image keeps the join program and a node its bundle (role node_join's defaults).
JOIN_PROGRAM = "/usr/local/sbin/clusterbake-node-join"
JOIN_BUNDLE = "/etc/clusterbake/node-join.json"


def write_file(path: Path, text: str) -> None:
    """Replace a file's content only when it differs (0600: the config may name secrets' paths)."""
    if path.exists() and path.read_text() == text:
        return
    tmp = path.with_suffix(".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as handle:
        handle.write(text)
    tmp.replace(path)


NVIDIA_MAJOR = 195  # the character device major number of NVIDIA's GPU devices


class LocalProvider(Provider):
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

    def find_image(self) -> Path:
        """The local image (a directory with rootfs/) from the image store."""
        return find_local_image(self.config, self.state)

    def provision(self, image: Path | str) -> None:
        image_root = Path(image) / "rootfs"
        state = self.cluster.read_state()
        if state.get("image") and state["image"] != str(image):
            say(f"    nodes keep their image {Path(state['image']).name} (destroy to move to a new one)")
            image_root = Path(state["image"]) / "rootfs"
            image = state["image"]
        if not image_root.is_dir():
            raise ClusterbakeError(f"image root {image_root} is missing; run `make image`")
        self.cluster.ensure_secrets()
        for directory in self._binds().values():
            directory.mkdir(parents=True, exist_ok=True)
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
        network.ensure_bridge(self.config.cluster_name, self.config.local.subnet)
        if self.elastic:
            self.ensure_power_agent()
        running = machines.find_machines(self.machine_prefix)
        # Elastic nodes stay powered down until Slurm asks for them.
        started = [n.name for n in self.nodes if not n.elastic and self.machine_name(n.name) not in running]
        for name in started:
            self._start(name, image_root)
        self._write_known_hosts()
        self.wait_ssh(started)

    def _start(self, name: str, image_root: Path | None = None) -> None:
        if image_root is None:
            image_root = Path(self.cluster.read_state()["image"]) / "rootfs"
        address = self.addresses()[name]
        netns = network.ensure_node_network(self.config.cluster_name, name, address, self.config.local.subnet)
        paths = self._paths(name)
        machines.mount_overlay(image_root, paths)
        self._personalize(name, paths.root)
        self._hand_over_join_bundle(name, paths.root)
        argv = machines.nspawn_argv(
            self.machine_name(name), name, paths.root, netns, self._binds(), readonly_binds=self._gpu_devices(name)
        )
        machines.spawn(argv, self.machine_name(name), paths.console_log)

    def _gpu_devices(self, name: str) -> dict[str, Path]:
        """Placeholder GPUs (`gpus: N`): character devices /dev/nvidia0..N-1 with NVIDIA's major number.

        Not GPUs: no driver answers them (opening one fails). They exist so that slurmd
        finds the gres.conf `File=` devices and schedules, binds and counts them as it
        would on a GPU node.
        """
        group = next((g for g in self.config.node_groups if g.name == self.node(name).nodegroup), None)
        if group is None or not group.gpus:
            return {}
        directory = self._paths(name).base / "devices"
        directory.mkdir(parents=True, exist_ok=True)
        devices = {}
        for index in range(group.gpus):
            path = directory / f"nvidia{index}"
            if not path.exists():
                os.mknod(path, 0o666 | stat.S_IFCHR, os.makedev(NVIDIA_MAJOR, index))
            devices[f"/dev/nvidia{index}"] = path
        return devices

    def _personalize(self, name: str, root: Path) -> None:
        """First boot only: identity of the node (hostname, machine-id, host keys, access)."""
        marker = root / "etc" / "clusterbake-node"
        if marker.exists():
            return
        (root / "etc" / "hostname").write_text(f"{name}\n")
        (root / "etc" / "machine-id").write_text(uuid.uuid4().hex + "\n")
        ssh_dir = root / "etc" / "ssh"
        for old in ssh_dir.glob("ssh_host_*"):
            old.unlink()
        for kind in ("ed25519", "ecdsa"):
            subprocess.run(
                [
                    "ssh-keygen",
                    "-q",
                    "-t",
                    kind,
                    "-N",
                    "",
                    "-C",
                    f"root@{name}",
                    "-f",
                    str(ssh_dir / f"ssh_host_{kind}_key"),
                ],
                check=True,
            )
        root_ssh = root / "root" / ".ssh"
        root_ssh.mkdir(mode=0o700, parents=True, exist_ok=True)
        keys = root_ssh / "authorized_keys"
        keys.write_text(self.cluster.ssh_key.with_suffix(".pub").read_text())
        keys.chmod(0o600)
        hosts = ["127.0.0.1 localhost", f"127.0.1.1 {name}"]
        hosts += [f"{address} {node}" for node, address in self.addresses().items() if node != name]
        (root / "etc" / "hosts").write_text("\n".join(hosts) + "\n")
        marker.write_text(f"{self.config.cluster_name}/{name}\n")

    def _hand_over_join_bundle(self, name: str, root: Path) -> None:
        """A compute node that boots with its group's bundle joins by itself (no Ansible run)."""
        node = self.node(name)
        bundle = self.cluster.join_bundles / f"{node.nodegroup}.json"
        if node.role != "compute" or not bundle.exists():
            return
        target = root / "etc" / "clusterbake" / "node-join.json"
        target.parent.mkdir(mode=0o755, parents=True, exist_ok=True)
        fd = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "wb") as handle:
            handle.write(bundle.read_bytes())

    def _write_known_hosts(self) -> None:
        lines = []
        for name, address in self.addresses().items():
            pub = self._paths(name).root / "etc" / "ssh" / "ssh_host_ed25519_key.pub"
            if pub.exists():
                key = " ".join(pub.read_text().split()[:2])
                lines.append(f"{name},{address} {key}")
        self.cluster.known_hosts.write_text("\n".join(lines) + "\n")

    def wait_ssh(self, names: list[str], timeout: float = SSH_READY_TIMEOUT) -> None:
        addresses = self.addresses()
        pending = set(names)
        deadline = time.monotonic() + timeout
        while pending and time.monotonic() < deadline:
            pending -= {name for name in sorted(pending) if machines.sshd_answers(addresses[name])}
            if pending:
                time.sleep(0.1)
        if pending:
            logs = ", ".join(str(self._paths(n).console_log) for n in sorted(pending))
            raise ClusterbakeError(
                f"nodes {', '.join(sorted(pending))} did not answer SSH within {timeout:.0f}s; console: {logs}"
            )

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

    def after_configure(self) -> None:
        """Running compute nodes get their group's join bundle where theirs differs: one command
        per node, in parallel, no Ansible. A node that boots later takes it from its disk."""
        running = self.running_nodes()
        groups: dict[str, list[str]] = {}
        for node in self.nodes:
            if node.role == "compute" and node.name in running:
                groups.setdefault(node.nodegroup, []).append(node.name)
        applied: list[str] = []
        for group, names in sorted(groups.items()):
            path = self.cluster.join_bundles / f"{group}.json"
            if not path.exists():
                continue
            bundle = path.read_bytes()
            endpoints = {name: self.endpoint(name) for name in names}
            current = remote.run_many(endpoints, f"sha256sum {JOIN_BUNDLE} 2>/dev/null || true", check=True)
            failed = {n: r for n, r in current.items() if isinstance(r, Exception)}
            if failed:
                raise ClusterbakeError(
                    "cannot compare the join bundle on "
                    + "; ".join(f"{n}: {str(e).splitlines()[0]}" for n, e in sorted(failed.items()))
                )
            digest = hashlib.sha256(bundle).hexdigest()
            drifted = {n: e for n, e in endpoints.items() if current[n].stdout.decode().split()[:1] != [digest]}
            results = remote.run_many(drifted, [JOIN_PROGRAM, "--install", "--bundle", JOIN_BUNDLE], stdin=bundle)
            broken = {n: r for n, r in results.items() if isinstance(r, Exception) or r.returncode != 0}
            if broken:
                raise ClusterbakeError(
                    "joining failed on " + "; ".join(f"{n}: {_first_error(r)}" for n, r in sorted(broken.items()))
                )
            applied += sorted(drifted)
        if applied:
            say(f"    join bundle applied on {', '.join(applied)} (theirs differed)")

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

    def refresh_known_hosts(self) -> None:
        self._write_known_hosts()

    def running_nodes(self) -> set[str]:
        return {m[len(self.machine_prefix) :] for m in machines.find_machines(self.machine_prefix)}

    @property
    def elastic(self) -> bool:
        return any(n.elastic for n in self.nodes)

    def _agent_pid(self) -> int | None:
        path = self.cluster.root / "power-agent.pid"
        try:
            pid = int(path.read_text())
        except (OSError, ValueError):
            return None
        return pid if machines.alive(pid) else None

    def ensure_power_agent(self) -> None:
        """The host-side service the head's ResumeProgram and SuspendProgram call (power_agent.py)."""
        if self._agent_pid() is not None:
            return
        write_secret(self.power_token_file, lambda: secrets.token_hex(32).encode())
        log = self.cluster.logs / "power-agent.log"
        log.parent.mkdir(parents=True, exist_ok=True)
        argv = [
            sys.executable, "-m", "clusterbake.providers.local.power_agent",
            "--config", str(self.config_path), "--state", str(self.state.root),
            "--address", str(network.host_address(self.config.local.subnet).ip), "--port", str(POWER_AGENT_PORT),
            "--token-file", str(self.power_token_file),
        ]  # fmt: skip
        with log.open("ab") as out, open(os.devnull, "rb") as devnull:
            process = subprocess.Popen(argv, stdin=devnull, stdout=out, stderr=out, start_new_session=True)
        (self.cluster.root / "power-agent.pid").write_text(f"{process.pid}\n")
        deadline = time.monotonic() + 20
        address = str(network.host_address(self.config.local.subnet).ip)
        while not machines.port_open(address, POWER_AGENT_PORT):
            if process.poll() is not None or time.monotonic() > deadline:
                raise ClusterbakeError(f"the power agent did not start; see {log}")
            time.sleep(0.1)
        say(f"    power agent for elastic nodes at {address}:{POWER_AGENT_PORT}")

    def stop_power_agent(self) -> bool:
        pid = self._agent_pid()
        if pid is None:
            return False
        machines.stop(pid, timeout=5.0)
        return True

    @property
    def config_path(self) -> Path:
        """The config this cluster runs with (written by provision), for the power agent."""
        return self.cluster.root / "config.yaml"

    @property
    def power_token_file(self) -> Path:
        return self.cluster.root / "secrets" / "power.token"

    def destroy(self) -> list[str]:
        """Stop every node (also ones a lost state file no longer names), then remove all."""
        removed = []
        if self.stop_power_agent():
            removed.append("power agent")
        running = machines.find_machines(self.machine_prefix)
        for machine, pid in sorted(running.items()):
            machines.stop(pid)
            removed.append(f"machine {machine}")
        names = {n.name for n in self.nodes} | set(self.cluster.read_state().get("nodes", {}))
        names |= {m[len(self.machine_prefix) :] for m in running}
        nodes_dir = self.cluster.root / "nodes"
        if nodes_dir.is_dir():
            names |= {p.name for p in nodes_dir.iterdir()}
        names |= {ns[len(self.machine_prefix) :] for ns in network.leftover_netns(self.config.cluster_name)}
        busy = []
        for name in sorted(names):
            busy += machines.remove_cgroups(self.machine_name(name))
            machines.unmount_tree(self._paths(name).root)
            network.remove_node_network(self.config.cluster_name, name)
        if network.link_exists(network.bridge_name(self.config.cluster_name)):
            network.remove_bridge(self.config.cluster_name)
            removed.append(f"bridge {network.bridge_name(self.config.cluster_name)}")
        machines.unmount_tree(self.cluster.root)
        if self.cluster.root.exists():
            subprocess.run(["rm", "-rf", "--one-file-system", str(self.cluster.root)], check=True)
            removed.append(f"state {self.cluster.root}")
        if busy:
            raise ClusterbakeError(f"cgroups still busy after stopping the nodes: {', '.join(busy)}")
        return removed

    # --- queries ---------------------------------------------------------------------

    def status(self) -> list[NodeStatus]:
        running = machines.find_machines(self.machine_prefix)
        addresses = self.addresses()
        exists = self.cluster.exists()
        result = []
        for node in self.nodes:
            if self.machine_name(node.name) in running:
                state = "running"
            elif exists and self.cluster.node(node.name).exists():
                state = "stopped"
            else:
                state = "absent"
            result.append(NodeStatus(node.name, node.role, node.nodegroup, addresses[node.name], state))
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
            "munge_key_file": str(self.cluster.munge_key),
            "node_join_controller_dir": str(self.cluster.join_bundles),
            # Compute nodes join from their bundle: at boot, or pushed by after_configure.
            "node_join_self_join": True,
            "fabric_socket_ifname": "host0",
            # Containers report the host's boot time: slurmd -b tells slurmctld it (re)booted now.
            "slurm_slurmd_extra_options": ["-b"],
            # Elastic nodes: the head's power programs call the host's power agent.
            "slurm_power_agent_url": f"http://{network.host_address(self.config.local.subnet).ip}:{POWER_AGENT_PORT}",
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
