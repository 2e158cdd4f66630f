"""What a job's log says: the training summary and the transport the collective
library really used, so a cluster that paid for EFA or InfiniBand but trains over
TCP sockets is caught on the first job, not weeks later.

Pure functions over log text: the CLI fetches the log, tests feed saved logs.
"""

from __future__ import annotations

import json
import re
from dataclasses import asdict, dataclass

EVENT_PREFIX = "CLUSTERBAKE_EVENT "

# NCCL_DEBUG=INFO lines, as NCCL 2.21/2.23 and aws-ofi-nccl 1.9 print them (the source files
# are named in tests/unit/data/README.md, whose fixtures imitate them). Channel lines say
# what carried inter-node traffic:
# "Channel 00/0 : 0[0] -> 8[0] [send] via NET/IB/0/GDRDMA", through another local rank's NIC
# (PXN) "via NET/IB/0(1)/GDRDMA" (transport/net.cc); NCCL 2.4 printed "Ring 00 : 7 -> 8
# [send] via NET/AWS Libfabric/0". "Using network X" (init.cc) names the network selected.
# X is NCCL's own IB or Socket, or aws-ofi-nccl's: "AWS Libfabric" up to 1.11, "Libfabric"
# from 1.12, where NCCL_NET=OFI or NCCL_NET="AWS Libfabric" renames it to match
# (nccl_ofi_interface_nvidia.c); or HPC-X's InfiniBand plugin, "IBext_v8" and so on
# (nccl-rdma-sharp-plugins, ib_plugin.c).
# Keys are patterns, a name before any name it starts with.
_NET_NAMES = {
    "AWS Libfabric": "libfabric",
    "Libfabric": "libfabric",
    "OFI": "libfabric",
    r"IBext(?:_v\d+)?": "ib",
    "IB": "ib",
    "Socket": "socket",
}
_NET = "|".join(_NET_NAMES)
# The whole name, then the device number: "NET/IBext_v8/0" is not "NET/IB".
_VIA = re.compile(rf"\bvia NET/(?P<net>{_NET})/(?P<dev>\d+)(?:\((?P<proxy>\d+)\))?(?P<flags>\S*)")
_USING = re.compile(rf"NCCL INFO Using network (?P<net>{_NET})$")
_OFI_PROVIDER = re.compile(r"NET/OFI Selected [Pp]rovider is (?P<provider>[\w;-]+)")
_NET_INIT = re.compile(r"NCCL INFO NET/(?P<net>IB|Socket) : Using (?P<devices>.+)")
# No net plugin was loaded, so NCCL runs its own IB or Socket transport (net.cc): NCCL 2.21
# "NET/Plugin: No plugin found (libnccl-net.so)" ... "NET/Plugin: Using internal network
# plugin."; 2.23 "NET/Plugin: Could not find: libnccl-net.so. Using internal network plugin.";
# 2.28 "NET/Plugin: Could not find: libnccl-net.so" alone, then "Initialized NET plugin Socket"
# (or IB) for the first of its own that starts (captured on an H200, tests/unit/data/
# captured-h200). "TUNER/Plugin: ..." lines are about the tuner, not the network.
_PLUGIN_INTERNAL = re.compile(r"\bNET/Plugin: .*Using internal network plugin|\bInitialized NET plugin (?:IB|Socket)$")
_PLUGIN_MISSING = re.compile(
    r"\bNET/Plugin: (?:No plugin found \((?P<name>[^)]+)\)|Could not find: (?P<names>.+?)(?:\. Using|$))"
)
# NCCL_NET named a network that no loaded plugin provides; NCCL stops (net.cc).
_NET_NOT_FOUND = re.compile(r"NCCL WARN Error: network (?P<net>.*?) not found\.")
_FABRIC = re.compile(r"clusterbake: .*\bfabric (?P<fabric>efa|ib|tcp)\b")
# The image the job's steps ran in (torchrun-node's line; "none": on the node itself).
_CONTAINER = re.compile(r"clusterbake: .*\bcontainer (?P<container>\S+)$", re.MULTILINE)
_NCCL_VERSION = re.compile(r"NCCL version (?P<version>[\d.]+)")

# What each fabric should carry collectives over.
_EXPECTED = {"efa": {"efa"}, "ib": {"ib"}, "tcp": {"socket", "gloo-tcp", "efa", "ib"}}


@dataclass
class Transport:
    library: str  # nccl, gloo or unknown
    transport: str  # efa, ib, socket, gloo-tcp, libfabric (another provider), unknown
    description: str
    evidence: str
    gpudirect_rdma: bool = False
    fabric: str | None = None  # the node's fabric profile, from the job log
    container: str | None = None  # the image the steps ran in, from the job log
    mismatch: bool = False
    advice: str = ""
    net_plugin: str = ""  # why NCCL runs without a net plugin, when its log says so

    def as_dict(self) -> dict:
        return asdict(self)


_JSON = json.JSONDecoder()


def events(log: str) -> list[dict]:
    """Every event in the log. Ranks write to one file: with unbuffered output (PYTHONUNBUFFERED,
    `python -u`) print() writes the line and its newline separately, so one rank's event can
    end up on another's line ("...}CLUSTERBAKE_EVENT {..."): each event is read where it starts."""
    found = []
    for line in log.splitlines():
        start = line.find(EVENT_PREFIX)
        while start != -1:
            try:
                event, _ = _JSON.raw_decode(line, start + len(EVENT_PREFIX))
            except json.JSONDecodeError:
                event = None
            if isinstance(event, dict):
                found.append(event)
            start = line.find(EVENT_PREFIX, start + len(EVENT_PREFIX))
    return found


def progress_line(line: str) -> str:
    """A job output line as a person reads it: the training's event lines (CLUSTERBAKE_EVENT {json})
    as one short line each (step, loss, tokens/s; checkpoints; start and end); other lines as they are.
    The job's log keeps the raw lines (`job report` reads them)."""
    prefix, sep, payload = line.partition(EVENT_PREFIX)
    if not sep:
        return line
    try:
        event = json.loads(payload)
    except json.JSONDecodeError:
        return line
    kind = event.get("event")
    if kind == "step":
        shown = f"step {event.get('step')}: loss {event.get('loss', float('nan')):.4f}"
        if "tokens_per_s" in event:
            shown += f", {event['tokens_per_s']:,.0f} tokens/s"
        if "step_s" in event:
            shown += f", {event['step_s']:.2f} s/step"
    elif kind == "checkpoint":
        shown = f"checkpoint at step {event.get('step')}: {event.get('path')} ({event.get('reason', '')})"
    elif kind == "init":
        hosts = ", ".join(event.get("hosts", []))
        how = f"{event.get('backend')}, {event.get('device')}"
        shown = f"training: world size {event.get('world_size')} on {hosts} ({how})"
    elif kind == "done":
        shown = (
            f"done: {event.get('steps')} steps, loss {event.get('first_loss', float('nan')):.3f} -> "
            f"{event.get('final_loss', float('nan')):.3f}"
        )
    else:
        details = {k: v for k, v in event.items() if k not in ("event", "time")}
        shown = f"{kind}: {json.dumps(details, separators=(',', ':'))}"
    return f"{prefix.strip()} {shown}".strip() if prefix.strip() else shown


def _nccl_transport(lines: list[str]) -> tuple[str, str, bool] | None:
    """(transport, evidence line, GPUDirect RDMA) from NCCL's own lines."""
    provider = next((m["provider"] for line in lines if (m := _OFI_PROVIDER.search(line))), None)

    def classify(net: str) -> str:
        kind = next(kind for name, kind in _NET_NAMES.items() if re.fullmatch(name, net))
        if kind == "libfabric":
            return "efa" if provider is None or provider.startswith("efa") else "libfabric"
        return kind

    via = [(line, m) for line in lines if (m := _VIA.search(line))]
    if via:
        line, first = via[0]
        rdma = any("/GDRDMA" in m["flags"] for _, m in via if m["net"] == first["net"])
        return classify(first["net"]), line.strip(), rdma
    for pattern in (_USING, _NET_INIT):
        for line in lines:
            match = pattern.search(line.rstrip())
            if match:
                return classify(match["net"]), line.strip(), False
    if provider:
        line = next(line for line in lines if _OFI_PROVIDER.search(line))
        return classify("Libfabric"), line.strip(), False
    return None


def _net_plugin_problem(lines: list[str]) -> str:
    """What NCCL said about loading no net plugin ("" when it loaded one or said nothing)."""
    if not any(_PLUGIN_INTERNAL.search(line.rstrip()) for line in lines):
        return ""
    missing = next((m for line in lines if (m := _PLUGIN_MISSING.search(line.rstrip()))), None)
    names = (missing["name"] or missing["names"]) if missing else "libnccl-net.so"
    return f"NCCL loaded no net plugin ({names} not found) and used its own IB/Socket transports"


_DESCRIPTIONS = {
    "efa": "NCCL over EFA (libfabric, aws-ofi-nccl)",
    "ib": "NCCL over InfiniBand verbs",
    "socket": "NCCL over TCP sockets",
    "libfabric": "NCCL over libfabric with a provider other than efa",
    "gloo-tcp": "gloo over TCP",
}


def detect_transport(log: str) -> Transport:
    lines = log.splitlines()
    fabric_match = _FABRIC.search(log)
    fabric = fabric_match["fabric"] if fabric_match else None
    nccl = _nccl_transport(lines)
    plugin = _net_plugin_problem(lines)
    not_found = next(((line, m) for line in lines if (m := _NET_NOT_FOUND.search(line))), None)
    init = next((e for e in events(log) if e.get("event") in ("init", "hello")), None)
    if nccl:
        kind, evidence, rdma = nccl
        version = _NCCL_VERSION.search(log)
        description = _DESCRIPTIONS[kind] + (" with GPUDirect RDMA" if rdma else "")
        if version:
            description += f" (NCCL {version['version']})"
        result = Transport("nccl", kind, description, evidence, rdma, fabric)
    elif not_found:
        line, match = not_found
        result = Transport(
            "nccl",
            "unknown",
            f"NCCL stopped: no network named {match['net']!r} (NCCL_NET)",
            line.strip(),
            False,
            fabric,
            advice=f"NCCL_NET asks for {match['net']!r}, which no loaded net plugin provides"
            + (f" ({plugin})" if plugin else "")
            + "; install the plugin or fix NCCL_NET",
        )
    elif init and init.get("backend") == "gloo":
        interface = init.get("socket_ifname") or ""
        description = _DESCRIPTIONS["gloo-tcp"] + (f" on {interface}" if interface else "")
        result = Transport("gloo", "gloo-tcp", description, json.dumps(init), False, fabric)
    elif init and init.get("backend") == "nccl":
        result = Transport(
            "nccl",
            "unknown",
            "NCCL, transport not in the log",
            json.dumps(init),
            False,
            fabric,
            advice="run with NCCL_DEBUG=INFO (the job templates set it) to see which network NCCL used",
        )
    else:
        result = Transport("unknown", "unknown", "no collective library output in the log", "", False, fabric)
    if result.library == "nccl":
        result.net_plugin = plugin
    if fabric in ("efa", "ib") and result.transport not in _EXPECTED[fabric] and result.transport != "unknown":
        result.mismatch = True
        check = "the aws-ofi-nccl plugin (NCCL_NET_PLUGIN, LD_LIBRARY_PATH)" if fabric == "efa" else "NCCL_IB_HCA"
        cause = f"; {plugin}" if plugin and fabric == "efa" else ""
        result.advice = (
            f"this node's fabric is {fabric} but collectives went over {result.transport}{cause}: "
            f"check {check} and NCCL_DEBUG=INFO's NET/ lines before paying for another hour"
        )
    container = _CONTAINER.search(log)
    result.container = container["container"] if container and container["container"] != "none" else None
    return result


def training_summary(log: str) -> dict:
    """Steps, losses, speed, nodes and checkpoints from the example's events."""
    found = events(log)
    done = next((e for e in reversed(found) if e.get("event") == "done"), None)
    steps = [e for e in found if e.get("event") == "step"]
    resumed = [e for e in found if e.get("event") == "resumed"]
    checkpoints = [e for e in found if e.get("event") == "checkpoint"]
    init = next((e for e in reversed(found) if e.get("event") == "init"), {})
    summary: dict = {
        "completed": done is not None,
        "steps": done.get("steps") if done else (steps[-1]["step"] if steps else 0),
        "first_loss": done.get("first_loss") if done else (steps[0]["loss"] if steps else None),
        "final_loss": done.get("final_loss") if done else (steps[-1]["loss"] if steps else None),
        "tokens_per_s": done.get("tokens_per_s") if done else None,
        "world_size": init.get("world_size"),
        "hosts": sorted(set(done.get("hosts") or [])) if done else sorted(set(init.get("hosts") or [])),
        "checkpoint_dir": done.get("checkpoint_dir") if done else None,
        "last_checkpoint": (done or {}).get("last_checkpoint")
        or (checkpoints[-1].get("path") if checkpoints else None),
        "resumed_from": [e.get("step") for e in resumed],
    }
    return summary


def format_report(summary: dict, transport: Transport) -> str:
    lines = []
    if summary["steps"]:
        lines.append(
            f"training: {summary['steps']} steps, loss {summary['first_loss']:.3f} -> {summary['final_loss']:.3f}"
            + (f", {summary['tokens_per_s']:.0f} tokens/s" if summary.get("tokens_per_s") else "")
        )
        lines.append(f"nodes: {', '.join(summary['hosts']) or '-'} (world size {summary['world_size']})")
        if summary["resumed_from"]:
            lines.append(f"resumed from step(s): {', '.join(map(str, summary['resumed_from']))}")
        lines.append(f"checkpoint: {summary['last_checkpoint'] or '-'}")
    found_in_log = (("fabric", transport.fabric), ("container", transport.container))
    where = [f"{name} {value}" for name, value in found_in_log if value]
    lines.append(f"transport: {transport.description}" + (f" [{'; '.join(where)}]" if where else ""))
    if transport.evidence:
        lines.append(f"  evidence: {transport.evidence[:200]}")
    if transport.advice:
        lines.append(("  WARNING: " if transport.mismatch else "  note: ") + transport.advice)
    return "\n".join(lines)
