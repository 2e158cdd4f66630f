"""systemd-nspawn machines: overlay root filesystems, start, stop, find, clean up.

A node's root is an overlayfs with the (read-only) image as lowerdir and a
per-node upper dir, so each node persists its own changes (Slurm state on the
head) while sharing the image. The host has no systemd, so nspawn runs with
--register=no --keep-unit and in a session of its own (setsid) to outlive the
command that started it.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

from clusterbake.errors import ClusterbakeError

NSPAWN = "systemd-nspawn"


@dataclass(frozen=True)
class MachinePaths:
    base: Path  # nodes/<name>

    @property
    def upper(self) -> Path:
        return self.base / "upper"

    @property
    def work(self) -> Path:
        return self.base / "work"

    @property
    def root(self) -> Path:
        return self.base / "root"

    @property
    def console_log(self) -> Path:
        return self.base / "console.log"


def mounted_at(path: Path) -> bool:
    target = str(path.resolve())
    with open("/proc/self/mountinfo") as info:
        return any(line.split()[4] == target for line in info)


def mount_overlay(image_root: Path, paths: MachinePaths) -> None:
    for directory in (paths.upper, paths.work, paths.root):
        directory.mkdir(parents=True, exist_ok=True)
    if mounted_at(paths.root):
        return
    options = f"lowerdir={image_root},upperdir={paths.upper},workdir={paths.work}"
    result = subprocess.run(
        ["mount", "-t", "overlay", "overlay", "-o", options, str(paths.root)], capture_output=True, text=True
    )
    if result.returncode != 0:
        raise ClusterbakeError(f"mounting the overlay root at {paths.root} failed: {result.stderr.strip()}")


def unmount_tree(path: Path) -> None:
    """Unmount path and anything below it, deepest first."""
    target = str(path.resolve())
    with open("/proc/self/mountinfo") as info:
        points = [line.split()[4] for line in info]
    for point in sorted((p for p in points if p == target or p.startswith(target + "/")), reverse=True):
        result = subprocess.run(["umount", point], capture_output=True, text=True)
        if result.returncode != 0:
            subprocess.run(["umount", "-l", point], capture_output=True)


def nspawn_argv(
    machine: str,
    hostname: str,
    root: Path,
    netns: str | None,
    binds: dict[str, Path],
    *,
    readonly_binds: dict[str, Path] | None = None,
    uuid: str | None = None,
) -> list[str]:
    argv = [
        NSPAWN,
        "--quiet",
        "--register=no",
        "--keep-unit",
        f"--machine={machine}",
        f"--hostname={hostname}",
        f"--directory={root}",
        "--console=pipe",
        "--resolv-conf=off",
        "--timezone=off",
        "--link-journal=no",
        "--boot",
    ]
    if netns:
        argv.insert(-1, f"--network-namespace-path=/run/netns/{netns}")
    for inside, host in sorted(binds.items()):
        argv.insert(-1, f"--bind={host}:{inside}")
    for inside, host in sorted((readonly_binds or {}).items()):
        argv.insert(-1, f"--bind-ro={host}:{inside}")
    if uuid:
        # The machine's identity across boots (systemd takes its machine-id from it).
        argv.insert(-1, f"--uuid={uuid}")
    return argv


def _cgroup_hierarchies() -> list[Path]:
    """The hierarchies a booted systemd uses: both halves of a hybrid host, or the v2 root."""
    root = Path("/sys/fs/cgroup")
    if (root / "cgroup.controllers").exists():
        return [root]
    return [root / name for name in ("systemd", "unified") if (root / name / "cgroup.procs").exists()]


def machine_cgroups(machine: str) -> list[Path]:
    return [hierarchy / "clusterbake" / machine for hierarchy in _cgroup_hierarchies()]


def spawn(argv: list[str], machine: str, console_log: Path) -> int:
    """Start nspawn detached from our session, in a cgroup of its own; returns its PID.

    Without a host systemd, nspawn --keep-unit creates its `payload` cgroup under
    its caller's cgroup: every node would share one, and a `systemctl stop` on one
    node would kill the same unit's processes on all of them.
    """
    cgroups = machine_cgroups(machine)
    for cgroup in cgroups:
        cgroup.mkdir(parents=True, exist_ok=True)

    def enter_own_cgroup() -> None:
        for cgroup in cgroups:
            (cgroup / "cgroup.procs").write_text(str(os.getpid()))

    console_log.parent.mkdir(parents=True, exist_ok=True)
    with console_log.open("ab") as log, open(os.devnull, "rb") as devnull:
        proc = subprocess.Popen(
            argv,
            stdin=devnull,
            stdout=log,
            stderr=log,
            start_new_session=True,
            close_fds=True,
            preexec_fn=enter_own_cgroup,
        )
    return proc.pid


def remove_cgroups(machine: str) -> list[str]:
    """Remove the machine's cgroups after it stopped; returns those that stayed busy."""
    busy = []
    for cgroup in machine_cgroups(machine):
        if not cgroup.exists():
            continue
        for directory in sorted((p for p in cgroup.rglob("*") if p.is_dir()), key=lambda p: -len(p.parts)):
            _rmdir_cgroup(directory, busy)
        _rmdir_cgroup(cgroup, busy)
        # The shared parent goes with the last machine; busy while others run.
        with contextlib.suppress(OSError):
            cgroup.parent.rmdir()
    return busy


def _rmdir_cgroup(directory: Path, busy: list[str]) -> None:
    try:
        directory.rmdir()
    except FileNotFoundError:
        pass
    except OSError:
        busy.append(str(directory))


def _cmdline(pid: int) -> list[str]:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace").split("\0")
    except OSError:
        return []


def find_machines(prefix: str) -> dict[str, int]:
    """Running nspawn processes whose --machine starts with prefix: {machine: pid}."""
    found = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        argv = _cmdline(int(entry.name))
        if not argv or not argv[0].endswith(NSPAWN):
            continue
        for arg in argv:
            if arg.startswith("--machine=") and arg[len("--machine=") :].startswith(prefix):
                found[arg[len("--machine=") :]] = int(entry.name)
    return found


def port_open(host: str, port: int) -> bool:
    try:
        with socket.create_connection((host, port), timeout=0.5):
            return True
    except OSError:
        return False


def sshd_answers(host: str, port: int = 22) -> bool:
    """Whether an sshd is up at host:port (it sends its banner first)."""
    try:
        with socket.create_connection((host, port), timeout=0.5) as conn:
            return conn.recv(4).startswith(b"SSH-")
    except OSError:
        return False


def _children(pid: int) -> list[int]:
    try:
        text = Path(f"/proc/{pid}/task/{pid}/children").read_text()
    except OSError:
        return []
    return [int(child) for child in text.split()]


def alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state != "Z"


def _wait_gone(pid: int, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if not alive(pid):
            return True
        time.sleep(0.05)
    return not alive(pid)


def stop(pid: int, timeout: float = 10.0) -> None:
    """Halt a machine: SIGTERM to nspawn (a clean poweroff inside), then force.

    A halt can hang in the node's systemd shutdown (PLATFORM.md); then the node's
    own PID 1 is killed, which ends its whole PID namespace, and nspawn exits.
    Killing nspawn first would leave the node's init running as an orphan.
    """
    if not alive(pid):
        return
    inits = _children(pid)
    try:
        os.kill(pid, signal.SIGTERM)
    except ProcessLookupError:
        return
    if _wait_gone(pid, timeout):
        return
    for init in inits or _children(pid):
        with contextlib.suppress(ProcessLookupError):
            os.kill(init, signal.SIGKILL)
    if _wait_gone(pid, 5.0):
        return
    os.kill(pid, signal.SIGKILL)
    if not _wait_gone(pid, 5.0):
        raise ClusterbakeError(f"nspawn process {pid} did not exit after SIGKILL")
