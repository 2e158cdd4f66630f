"""`clusterbake doctor`: what stands between this cluster and a working job, each finding with a fix.

Three parts, each a list of findings (ok, warn or FAIL, what was seen, how to fix it):
- the host (local provider: systemd-nspawn, root, cgroup mode, host limits; every provider:
  Packer and its version);
- the cluster: every static node running, Slurm's view of each node (down or drained,
  with Slurm's reason);
- each running node, probed over SSH at once (remote.run_many): its Slurm daemons and
  munge, a munge credential it can decode, the shared file systems mounted, and its fabric
  profile (what NCCL is told to use: sockets on which interface, EFA through libfabric,
  InfiniBand ports that are Active).
"""

from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

from clusterbake import remote
from clusterbake.config import ClusterConfig
from clusterbake.nspawn import limits
from clusterbake.providers.base import Provider

OK, WARN, FAIL = "ok", "warn", "FAIL"
PACKER_FOR_CLOUD_PLUGINS = (1, 10)


@dataclass(frozen=True)
class Finding:
    status: str  # ok, warn, FAIL
    where: str  # host, cluster, or a node's name
    what: str
    fix: str = ""

    def line(self) -> str:
        return f"{self.status:<4}  {self.where}: {self.what}" + (f"; fix: {self.fix}" if self.fix else "")


def _host(good: bool, good_text: str, bad: tuple[str, str], fix: str) -> Finding:
    """A host check's finding: ok with `good_text`, else `bad` (status, text) with its fix."""
    return Finding(OK, "host", good_text) if good else Finding(bad[0], "host", bad[1], fix)


def host_findings(config: ClusterConfig, host_nodes: int | None) -> list[Finding]:
    found = []
    packer = shutil.which("packer")
    if packer is None:
        found.append(Finding(FAIL, "host", "packer is not installed", "make deps (apt-get install packer)"))
    else:
        text = subprocess.run([packer, "version"], capture_output=True, text=True).stdout
        match = re.search(r"(\d+)\.(\d+)\.(\d+)", text)
        version = tuple(int(x) for x in match.groups()) if match else (0, 0, 0)
        shown = ".".join(map(str, version))
        found.append(
            _host(
                config.provider == "local" or version[:2] >= PACKER_FOR_CLOUD_PLUGINS,
                f"packer {shown}",
                (WARN, f"packer {shown}: building {config.provider} images needs Packer >= 1.10 (its plugins)"),
                "install Packer >= 1.10 from HashiCorp's releases",
            )
        )
    if config.provider != "local":
        return found
    if os.geteuid() != 0:
        found.append(Finding(FAIL, "host", "not root: local nodes need nspawn, namespaces and mounts", "run as root"))
    found.append(
        _host(
            shutil.which("systemd-nspawn") is not None,
            "systemd-nspawn installed",
            (FAIL, "systemd-nspawn is not installed"),
            "make deps (apt-get install systemd-container)",
        )
    )
    hybrid = Path("/sys/fs/cgroup/unified").is_dir()
    mode = "v1 hybrid" if hybrid else ("v2" if Path("/sys/fs/cgroup/cgroup.controllers").exists() else "v1")
    cgroup_plugins = [v for v in config.slurm_plugins().values() if v.endswith("/cgroup")]
    found.append(
        _host(
            not cgroup_plugins or mode == "v2",
            f"cgroups {mode}",
            (FAIL, f"cgroups {mode}: Slurm's cgroup plugins ({', '.join(cgroup_plugins)}) cannot run in nodes here"),
            "leave the slurm: plugin settings out (docs/local-provider.md)",
        )
    )
    if host_nodes is not None:
        shorts = limits.shortfalls(host_nodes)
        for short in shorts:
            fix = f"`cluster up` raises it as root, or: {short.command()}"
            found.append(Finding(WARN, "host", limits.describe(short, host_nodes), fix))
        if not shorts:
            found.append(Finding(OK, "host", f"kernel limits fit {host_nodes} nodes"))
    return found


def cluster_findings(provider: Provider, slurm_states: dict[str, str], reasons: dict[str, str]) -> list[Finding]:
    found = []
    states = {s.name: s.state for s in provider.status()}
    for node in provider.nodes:
        state = states.get(node.name, "absent")
        if node.elastic:
            continue  # powered down until Slurm wants it: not a fault
        if state != "running":
            fix = "clusterbake cluster up" if state == "absent" else f"clusterbake node start {node.name}"
            found.append(Finding(FAIL, node.name, f"the node is {state}", fix))
    for name, state in sorted(slurm_states.items()):
        base = state.rstrip("*~#!%$@^-+")
        if base in ("down", "drain", "drng", "fail", "failg") or state.endswith("*"):
            reason = reasons.get(name) or "no reason given"
            found.append(
                Finding(
                    FAIL,
                    name,
                    f"Slurm has it {state} ({reason})",
                    f"fix the cause, then: clusterbake ssh head -- scontrol update NodeName={name} State=RESUME",
                )
            )
    if not found:
        found.append(Finding(OK, "cluster", f"{len(states)} nodes as planned, none down or drained in Slurm"))
    return found


# Role slurm's SlurmdSpoolDir (slurm_slurmd_spool_dir).
SLURMD_CONF_CACHE = "/var/spool/slurmd/conf-cache"


def probe_command(mount_points: list[str]) -> str:
    """A node's state as key=value lines (POSIX sh, as root)."""
    lines = [
        ". /etc/clusterbake/fabric.env >/dev/null 2>&1 || true",
        'echo "fabric=${CLUSTERBAKE_FABRIC:-none}"',
        'echo "socket_ifname=${NCCL_SOCKET_IFNAME:-}"',
        'echo "fi_provider=${FI_PROVIDER:-}"',
        'echo "nccl_ib_hca=${NCCL_IB_HCA:-}"',
        "for unit in munge slurmd slurmctld; do",
        '  echo "enabled_$unit=$(systemctl is-enabled $unit 2>/dev/null || true)"',
        '  echo "active_$unit=$(systemctl is-active $unit 2>/dev/null || true)"',
        "done",
        'if munge -n 2>/dev/null | unmunge >/dev/null 2>&1; then echo "munge_cred=ok"; else echo "munge_cred=fail"; fi',
        # A configless slurmd reads oci.conf from its conf-cache only (role containers' keeper unit).
        f"if [ -e /etc/slurm/oci.conf ] && [ -d {SLURMD_CONF_CACHE} ]; then",
        f'  if [ -e {SLURMD_CONF_CACHE}/oci.conf ]; then echo "oci_conf=ok"; else echo "oci_conf=missing"; fi',
        "fi",
    ]
    for point in mount_points:
        quoted = shlex.quote(point)
        lines.append(f'if findmnt -n {quoted} >/dev/null 2>&1; then echo "mount={point}:ok"; else')
        lines.append(f'  echo "mount={point}:missing"; fi')
    lines += [
        "if command -v ibstat >/dev/null 2>&1; then",
        '  echo "ib_active=$(ibstat 2>/dev/null | grep -c "State: Active")"',
        '  echo "ib_ports=$(ibstat 2>/dev/null | grep -c "State:")"',
        "fi",
        "if command -v fi_info >/dev/null 2>&1; then",
        '  echo "efa_providers=$(fi_info -p efa 2>/dev/null | grep -c "provider: efa")"',
        "fi",
    ]
    return "\n".join(lines)


def parse_probe(text: str) -> dict[str, list[str]]:
    values: dict[str, list[str]] = {}
    for line in text.splitlines():
        key, sep, value = line.partition("=")
        if sep:
            values.setdefault(key.strip(), []).append(value.strip())
    return values


def node_findings(name: str, role: str, probe: dict[str, list[str]]) -> list[Finding]:
    def one(key: str) -> str:
        return (probe.get(key) or [""])[0]

    found = []
    ssh = f"clusterbake ssh {name} --"
    # Login nodes run no daemon of Slurm's: their commands fetch slurm.conf from slurmctld.
    units = {"head": ("munge", "slurmctld"), "login": ("munge",)}.get(role, ("munge", "slurmd"))
    for unit in units:
        state = one(f"active_{unit}")
        if state != "active":
            fix = f"{ssh} systemctl restart {unit} (why: {ssh} journalctl -u {unit} -n 50)"
            found.append(Finding(FAIL, name, f"{unit} is {state or 'missing'}", fix))
    if one("active_munge") == "active" and one("munge_cred") != "ok":
        found.append(
            Finding(FAIL, name, "munge runs but cannot decode its own credential", f"{ssh} journalctl -u munge -n 50")
        )
    if role == "compute" and one("oci_conf") == "missing":
        found.append(
            Finding(
                FAIL,
                name,
                "slurmd's conf-cache has no oci.conf: Slurm runs --container steps outside any container",
                f"{ssh} systemctl start clusterbake-oci-conf.service",
            )
        )
    for entry in probe.get("mount", []):
        point, _, state = entry.rpartition(":")
        if state != "ok":
            found.append(Finding(FAIL, name, f"{point} is not mounted", f"{ssh} systemctl list-units --all '*.mount'"))
    fabric = one("fabric")
    if fabric == "tcp":
        where = one("socket_ifname") or "an interface NCCL picks itself"
        detail = f"fabric tcp: NCCL and gloo over sockets on {where}"
    elif fabric == "efa":
        providers = one("efa_providers")
        detail = f"fabric efa: NCCL through libfabric (FI_PROVIDER={one('fi_provider') or 'unset'})"
        if providers in ("", "0"):
            found.append(
                Finding(FAIL, name, "fabric efa, but `fi_info -p efa` finds no EFA device", "check the EFA driver")
            )
    elif fabric == "ib":
        active, ports = one("ib_active"), one("ib_ports")
        detail = f"fabric ib: NCCL over InfiniBand verbs ({active or 0} of {ports or 0} ports Active)"
        if active in ("", "0"):
            found.append(Finding(FAIL, name, "fabric ib, but no InfiniBand port is Active", f"{ssh} ibstat"))
    else:
        detail = f"fabric {fabric}: no profile (/etc/clusterbake/fabric.env missing)"
    healthy = f"{', '.join(units)} active; " if not found else ""
    return [*found, Finding(OK, name, healthy + detail)]


def probe_nodes(provider: Provider, mount_points: list[str]) -> list[Finding]:
    states = {s.name: s.state for s in provider.status()}
    running = [n for n in provider.nodes if states.get(n.name) == "running"]
    results = remote.run_many({n.name: provider.endpoint(n.name) for n in running}, probe_command(mount_points))
    found = []
    for node in running:
        result = results[node.name]
        if isinstance(result, Exception):
            fix = "clusterbake cluster status; clusterbake node start " + node.name
            found.append(Finding(FAIL, node.name, f"unreachable over SSH: {str(result).splitlines()[0]}", fix))
            continue
        found += node_findings(node.name, node.role, parse_probe(result.text()))
    return found


def slurm_view(provider: Provider) -> tuple[dict[str, str], dict[str, str], Finding | None]:
    """(state, reason) of each node as slurmctld sees it, or a finding when it cannot be asked."""
    try:
        result = remote.run(provider.controller_endpoint(), ["sinfo", "-h", "-N", "-o", "%N|%t|%E"], timeout=30)
    except Exception as exc:  # an unreachable head or a dead slurmctld: a finding, not a crash
        text = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        fix = "clusterbake ssh head -- systemctl status slurmctld"
        return {}, {}, Finding(FAIL, "head", f"cannot ask slurmctld: {text}", fix)
    states, reasons = {}, {}
    for line in result.text().splitlines():
        name, _, rest = line.partition("|")
        state, _, reason = rest.partition("|")
        states[name] = state
        reasons[name] = "" if reason == "none" else reason
    return states, reasons, None


def diagnose(config: ClusterConfig, provider: Provider) -> list[Finding]:
    host_nodes = provider.host_nodes() if hasattr(provider, "host_nodes") else None
    found = host_findings(config, host_nodes)
    if not provider.cluster.exists():
        return [*found, Finding(WARN, "cluster", f"{config.cluster_name} is not created", "clusterbake cluster up")]
    states, reasons, problem = slurm_view(provider)
    if problem is not None:
        found.append(problem)
    found += cluster_findings(provider, states, reasons)
    mount_points = sorted({"/home"} | {m.mount_point for m in config.effective_storage()})
    return found + probe_nodes(provider, mount_points)
