"""What the local provider writes into a node's disk before it boots, and reads from it after: its
identity (hostname, machine id, SSH host keys, root's key, /etc/hosts), private files (a join bundle
holds the munge key), placeholder GPU devices, the units a container has no use for, its journal."""

from __future__ import annotations

import os
import stat
import subprocess
import uuid
from pathlib import Path

from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec, ed25519

from clusterbake.nspawn import machines, rootfs

# A local cluster's storage is host directories bound into its nodes (`hostdir`, the only kind the
# local provider takes), and this host's kernel has no NFS: the NFS client stack the image carries
# for the clouds (rpcbind, statd's reboot notice, the rpc_pipefs mount, which fails in a container)
# would only cost each node's boot.
NFS_GENERATORS = ("nfs-server-generator", "rpc-pipefs-generator")
NFS_UNITS = (
    "nfs-client.target",
    "rpcbind.service",
    "rpcbind.socket",
    "rpc-statd-notify.service",
    "var-lib-nfs-rpc_pipefs.mount",
    "run-rpc_pipefs.mount",
)
NVIDIA_MAJOR = 195  # the character device major number of NVIDIA's GPU devices
# Read by the job templates (scripts/jobs/torchrun-node): this node's GPUs are placeholders, CPU is expected.
PLACEHOLDER_GPUS_MARKER = "/etc/clusterbake/placeholder-gpus"


def write_private(root: Path, path: str, data: bytes) -> None:
    """A file in a node's root only root reads (a join bundle holds the munge key), written without
    following any link the node made (rootfs)."""
    rootfs.write_in_root(root, path, data, 0o600)


def write_host_keys(ssh_dir: Path, comment: str) -> None:
    """A node's SSH host keys (ed25519 and ECDSA P-256, as `ssh-keygen -t` makes them), generated
    in-process: a node's first boot needs two, and 32 nodes' ssh-keygen runs took over a second."""
    keys = {"ed25519": ed25519.Ed25519PrivateKey.generate(), "ecdsa": ec.generate_private_key(ec.SECP256R1())}
    for kind, key in keys.items():
        private = key.private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.OpenSSH, serialization.NoEncryption()
        )
        public = key.public_key().public_bytes(serialization.Encoding.OpenSSH, serialization.PublicFormat.OpenSSH)
        path = ssh_dir / f"ssh_host_{kind}_key"
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "wb") as handle:
            handle.write(private)
        path.with_suffix(".pub").write_bytes(public + f" {comment}\n".encode())


def personalize(root: Path, name: str, owner: str, public_key: str, others: dict[str, str]) -> None:
    """First boot only (a marker says whose node the disk is): hostname, machine id, new host keys,
    the controller's key for root, and /etc/hosts with the cluster's other nodes."""
    marker = root / "etc" / "clusterbake-node"
    if marker.exists():
        return
    (root / "etc" / "hostname").write_text(f"{name}\n")
    (root / "etc" / "machine-id").write_text(uuid.uuid4().hex + "\n")
    ssh_dir = root / "etc" / "ssh"
    for old in ssh_dir.glob("ssh_host_*"):
        old.unlink()
    write_host_keys(ssh_dir, f"root@{name}")
    root_ssh = root / "root" / ".ssh"
    root_ssh.mkdir(mode=0o700, parents=True, exist_ok=True)
    keys = root_ssh / "authorized_keys"
    keys.write_text(public_key)
    keys.chmod(0o600)
    hosts = ["127.0.0.1 localhost", f"127.0.1.1 {name}"]
    hosts += [f"{address} {node}" for node, address in others.items()]
    (root / "etc" / "hosts").write_text("\n".join(hosts) + "\n")
    marker.write_text(f"{owner}\n")


def placeholder_gpus(directory: Path, count: int) -> dict[str, Path]:
    """Placeholder GPUs: character devices /dev/nvidia0..N-1 with NVIDIA's major number, by where the
    node sees them.

    Not GPUs: no driver answers them (opening one fails). They exist so that slurmd finds the
    gres.conf `File=` devices and schedules, binds and counts them as it would on a GPU node.
    /etc/clusterbake/placeholder-gpus says so to the jobs (torchrun-node refuses to train on the CPU
    when a job was given real GPUs that torch cannot use)."""
    directory.mkdir(parents=True, exist_ok=True)
    devices = {}
    for index in range(count):
        path = directory / f"nvidia{index}"
        if not path.exists():
            os.mknod(path, 0o666 | stat.S_IFCHR, os.makedev(NVIDIA_MAJOR, index))
        devices[f"/dev/nvidia{index}"] = path
    marker = directory / "placeholder-gpus"
    marker.write_text(f"{count} placeholder GPUs of the local provider: no driver, jobs run on the CPU\n")
    devices[PLACEHOLDER_GPUS_MARKER] = marker
    return devices


def journal_tail(pid: int | None, root: Path, lines: int = 200) -> str:
    """The last lines of a node's journal, read from the host (journald keeps it under the node's /run,
    which only its running machine has, else on its disk)."""
    places = [Path(f"/proc/{c}/root/run/log/journal") for c in machines._children(pid)] if pid else []
    places.append(root / "var" / "log" / "journal")
    # journald keeps its files in a directory per machine id below these.
    for directory in (d for place in places if place.is_dir() for d in sorted(place.iterdir())):
        if directory.is_dir():
            result = subprocess.run(
                ["journalctl", "--directory", str(directory), "--no-pager", "-n", str(lines)],
                capture_output=True,
                text=True,
            )
            if result.stdout.strip():
                return result.stdout
    return "(no journal found: the node's systemd never started journald, or it was already gone)\n"
