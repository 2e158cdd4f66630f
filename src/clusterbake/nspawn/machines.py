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
from clusterbake.nspawn import rootfs
from clusterbake.paths import below

NSPAWN = "systemd-nspawn"


@dataclass(frozen=True)
class MachinePaths:
    base: Path  # nodes/<name>

    upper = below("upper", base="base")
    work = below("work", base="base")
    root = below("root", base="base")
    console_log = below("console.log", base="base")


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


def ensure_nosuid_nodev(path: Path) -> bool:
    """Make `path` a mount of its own with nosuid and nodev (a bind onto itself), unless it is one.
    Binds of it into nodes keep those flags: a set-uid file or a device node a node's root makes in
    a shared directory means nothing there, nor on this host (finding 4 of the security review:
    `chmod 4755` on /shared in a node was a root shell for any host user). True when mounted now;
    unmount_tree (cluster down) removes it."""
    target = str(path.resolve())
    with open("/proc/self/mountinfo") as info:
        for line in info:
            fields = line.split()
            if fields[4] == target and {"nosuid", "nodev"} <= set(fields[5].split(",")):
                return False
    subprocess.run(["mount", "--bind", target, target], check=True, capture_output=True)
    subprocess.run(["mount", "-o", "remount,bind,nosuid,nodev", target], check=True, capture_output=True)
    return True


def nspawn_argv(
    machine: str,
    hostname: str,
    root: Path,
    netns: str | None,
    binds: dict[str, Path],
    *,
    readonly_binds: dict[str, Path] | None = None,
    uuid: str | None = None,
    init_args: list[str] | None = None,
    network_admin: bool = True,
    raw_sockets: bool = True,
    console: str = "pipe",
) -> list[str]:
    """`network_admin`: CAP_NET_ADMIN in the node's own network namespace; `raw_sockets`: keep
    nspawn's CAP_NET_RAW. Without both a node's root cannot impersonate another address on its
    bridge (ARP), where the local provider's power agent takes a bearer token over HTTP.
    `console`: nspawn's --console; `read-only` gives the node a /dev/console (a pty) whose output
    nspawn copies to the console log, as a VM's serial console (the twins)."""
    argv = [
        NSPAWN,
        "--quiet",
        "--register=no",
        "--keep-unit",
        f"--machine={machine}",
        f"--hostname={hostname}",
        f"--directory={root}",
        f"--console={console}",
        "--resolv-conf=off",
        "--timezone=off",
        "--link-journal=no",
        "--boot",
    ]
    if netns:
        argv.insert(-1, f"--network-namespace-path=/run/netns/{netns}")
    if netns and network_admin:
        # Root administers the node's own network namespace, as on a VM and as nspawn's
        # --private-network allows (which --network-namespace-path does not imply): the head sets
        # route flags (role slurm_accounting's quickack), a cloud node its metadata guard (nftables).
        # The host's namespace stays out of reach.
        argv.insert(-1, "--capability=CAP_NET_ADMIN")
    if not raw_sockets:
        argv.insert(-1, "--drop-capability=CAP_NET_RAW")
    for inside, host in sorted(binds.items()):
        argv.insert(-1, f"--bind={host}:{inside}")
    for inside, host in sorted((readonly_binds or {}).items()):
        argv.insert(-1, f"--bind-ro={host}:{inside}")
    if uuid:
        # The machine's identity across boots (systemd takes its machine-id from it).
        argv.insert(-1, f"--uuid={uuid}")
    # After the options, nspawn hands arguments to the node's init: systemd reads them as its
    # kernel command line (systemd.mask=..., systemd.unit=...).
    return argv + list(init_args or [])


# Generators that find nothing to do in a container (no block devices, boot loader, hibernation,
# offline update, SysV-only service or rc.local in a clusterbake image) but that systemd runs at
# every boot and daemon-reload: a fork and exec each, which 32 nodes booting at once pay together.
CONTAINER_IDLE_GENERATORS = (
    "systemd-cryptsetup-generator",
    "systemd-gpt-auto-generator",
    "systemd-hibernate-resume-generator",
    "systemd-integritysetup-generator",
    "systemd-rc-local-generator",
    "systemd-run-generator",
    "systemd-system-update-generator",
    "systemd-sysv-generator",
    "systemd-veritysetup-generator",
)
# Units with nothing to do in a container node: kernel file systems the host owns, package and
# file-system housekeeping of a disk the node does not have (its root is an overlay of the image).
CONTAINER_IDLE_UNITS = (
    "dev-hugepages.mount",
    "sys-fs-fuse-connections.mount",
    "systemd-pstore.service",
    "apt-daily.timer",
    "apt-daily-upgrade.timer",
    "dpkg-db-backup.timer",
    "e2scrub_all.timer",
    "e2scrub_reap.service",
    "fstrim.timer",
)


def mask_in_root(root: Path, generators: tuple[str, ...] = (), units: tuple[str, ...] = ()) -> None:
    """Mask generators and units in a node's own root (its overlay's upper layer): a link to
    /dev/null in /etc, as systemd.generator(7) and `systemctl mask` make. The image is untouched."""
    for directory, names in (("/etc/systemd/system-generators", generators), ("/etc/systemd/system", units)):
        for name in names:
            rootfs.link_in_root(root, f"{directory}/{name}", "/dev/null")


def _cgroup_hierarchies() -> list[Path]:
    """The hierarchies a booted systemd uses: both halves of a hybrid host, or the v2 root."""
    root = Path("/sys/fs/cgroup")
    if (root / "cgroup.controllers").exists():
        return [root]
    return [root / name for name in ("systemd", "unified") if (root / name / "cgroup.procs").exists()]


def machine_cgroups(machine: str) -> list[Path]:
    """Every cgroup a machine can be in (those a booted systemd uses, and the `cpu` one)."""
    return _own_cgroups(machine) + _cpu_cgroups(machine)


def _own_cgroups(machine: str) -> list[Path]:
    return [hierarchy / "clusterbake" / machine for hierarchy in _cgroup_hierarchies()]


# The cgroup v1 `cpu` controller (a hybrid or v1 host, as here): its cgroups take a host's tasks out
# of the kernel's autogroups, where every service of a node is an entity as heavy as a whole
# session (Ansible's included).
CPU_HIERARCHY = Path("/sys/fs/cgroup/cpu")


# The weight of all compute nodes together (cgroup v1 cpu.shares; one process's is 1024): an eighth
# of a process, so that while 32 nodes boot and join, Ansible and the head it configures (the play:
# the bring-up's critical path) run as on an idle host, and the nodes take the rest.
NODES_CPU_SHARES = 128


def _cpu_cgroups(machine: str) -> list[Path]:
    return [CPU_HIERARCHY / "clusterbake" / machine] if (CPU_HIERARCHY / "cpu.shares").exists() else []


SH = "/bin/sh"
# Arguments: cgroup.procs files, `--`, the command: the shell writes its PID to each, then execs.
ENTER_CGROUPS = 'while [ "$1" != -- ]; do echo $$ > "$1" || exit 1; shift; done; shift; exec "$@"'


def _entering(cgroups) -> list[str]:
    """The argv prefix that runs a command in these cgroups (none: no prefix)."""
    procs = [str(cgroup / "cgroup.procs") for cgroup in cgroups]
    return [SH, "-c", ENTER_CGROUPS, "sh", *procs, "--"] if procs else []


def spawn(argv: list[str], machine: str, console_log: Path, shared_cpu: bool = False) -> int:
    """Start nspawn detached from our session, in a cgroup of its own; returns its PID.

    Without a host systemd, nspawn --keep-unit creates its `payload` cgroup under
    its caller's cgroup: every node would share one, and a `systemctl stop` on one
    node would kill the same unit's processes on all of them.

    `shared_cpu` (compute nodes): the machine also goes into `clusterbake/<machine>` of the `cpu`
    controller, where all machines together weigh an eighth of one process. Under contention (32 nodes
    booting while the head is configured) they take what the head's configuration leaves;
    on an idle host they have every core. Without a v1 `cpu` hierarchy (a cgroup v2 host) the
    nodes run at the normal weight.
    """
    cpu = _cpu_cgroups(machine) if shared_cpu else []
    cgroups = _own_cgroups(machine) + cpu
    for cgroup in cgroups:
        cgroup.mkdir(parents=True, exist_ok=True)
    for cgroup in cpu:  # the group of all the nodes: its weight
        (cgroup.parent / "cpu.shares").write_text(f"{NODES_CPU_SHARES}\n")
    # A shell enters the cgroups and becomes nspawn (exec: same PID), rather than a preexec_fn:
    # nodes are started from several threads, where a preexec_fn is unsafe (and forces a full
    # fork of this process for every node).
    enter = _entering(cgroups)
    console_log.parent.mkdir(parents=True, exist_ok=True)
    with console_log.open("ab") as log, open(os.devnull, "rb") as devnull:
        proc = subprocess.Popen(
            [*enter, *argv],
            stdin=devnull,
            stdout=log,
            stderr=log,
            start_new_session=True,
            close_fds=True,
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


def _ns_pids(pid: int) -> list[int]:
    """The process's PID in each PID namespace it is in, outermost first (NSpid of /proc/PID/status)."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("NSpid:"):
                return [int(part) for part in line.split()[1:]]
    except (OSError, ValueError):
        pass
    return []


def _cgroup_pids(cgroup: Path) -> list[int]:
    pids = []
    for procs in [cgroup / "cgroup.procs", *cgroup.rglob("*/cgroup.procs")]:
        with contextlib.suppress(OSError, ValueError):
            pids += [int(pid) for pid in procs.read_text().split()]
    return pids


def find_orphans(prefix: str) -> dict[str, int]:
    """Machines whose nspawn supervisor is gone while the node's init still runs (nspawn killed):
    {machine: the init's PID}. Found by the machine's own cgroup (spawn() puts it there), where
    the node's processes stay: the init is the one that is PID 1 of its own PID namespace."""
    supervised = set(find_machines(prefix))
    found: dict[str, int] = {}
    for hierarchy in _cgroup_hierarchies():
        base = hierarchy / "clusterbake"
        if not base.is_dir():
            continue
        for cgroup in sorted(base.iterdir()):
            name = cgroup.name
            if not cgroup.is_dir() or not name.startswith(prefix) or name in supervised or name in found:
                continue
            for pid in _cgroup_pids(cgroup):
                namespaces = _ns_pids(pid)
                if len(namespaces) > 1 and namespaces[-1] == 1 and alive(pid):
                    found[name] = pid
                    break
    return found


def node_inits(prefix: str) -> dict[str, int]:
    """{machine: PID of its init}: the child of each running nspawn, and orphans' own inits."""
    inits = {machine: children[0] for machine, pid in find_machines(prefix).items() if (children := _children(pid))}
    return {**find_orphans(prefix), **inits}


def run_inside(inits: dict[str, int], argv: list[str], stdin: bytes | None = None, timeout: float = 300.0):
    """The same command in many nodes at once, in all of each node's namespaces (nsenter, as a
    console would: no SSH), at the node's CPU weight where it has one (a compute node's: a join
    while the head is configured takes what the play leaves); {machine: CompletedProcess}."""
    env = {"PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin", "LANG": "C.UTF-8"}
    started = {
        machine: subprocess.Popen(
            [*_entering(c for c in _cpu_cgroups(machine) if c.is_dir()), "nsenter", "-t", str(pid), "-a", *argv],
            stdin=subprocess.PIPE if stdin is not None else subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            env=env,
        )
        for machine, pid in inits.items()
    }
    results = {}
    for machine, process in started.items():
        out, err = process.communicate(stdin, timeout=timeout)
        results[machine] = subprocess.CompletedProcess(process.args, process.returncode, out, err)
    return results


def end_orphans(inits: list[int], timeout: float = 5.0) -> None:
    """Kill orphaned nodes' inits (each takes its whole PID namespace with it) and wait for them."""
    for pid in inits:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    left = [pid for pid in inits if not _wait_gone(pid, timeout)]
    if left:
        raise ClusterbakeError(f"the orphaned node inits {left} did not exit after SIGKILL")


def port_open(host: str, port: int) -> bool:
    try:
        with socket.create_connection((host, port), timeout=0.5):
            return True
    except OSError:
        return False


def unix_socket_open(path: Path) -> bool:
    """Whether something accepts connections on the Unix socket at `path`."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.settimeout(0.5)
        try:
            sock.connect(str(path))
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


def kill_all(pids: list[int]) -> None:
    """End many machines at once, for nodes whose disks are deleted next (as a cloud deletes a VM
    without shutting it down): each node's PID 1 is killed, which ends its PID namespace, so
    nspawn exits; an nspawn still there after 5 s is killed too."""
    live = [pid for pid in pids if alive(pid)]
    for pid in live:
        for init in _children(pid):
            with contextlib.suppress(ProcessLookupError):
                os.kill(init, signal.SIGKILL)
    deadline = time.monotonic() + 5.0
    while (live := [pid for pid in live if alive(pid)]) and time.monotonic() < deadline:
        time.sleep(0.05)
    for pid in live:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    if live and not all(_wait_gone(pid, 5.0) for pid in live):
        raise ClusterbakeError(f"nspawn processes {live} did not exit after SIGKILL")


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
