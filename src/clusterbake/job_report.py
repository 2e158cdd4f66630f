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

# NCCL_DEBUG=INFO lines. Channel lines ("... via NET/IB/0/GDRDMA") say what carried
# inter-node traffic; "Using network X" and the NET/<plugin> init lines say what
# was selected. aws-ofi-nccl calls itself "AWS Libfabric" (older) or "Libfabric".
_VIA = re.compile(r"via NET/(?P<net>AWS Libfabric|Libfabric|IB|Socket)(?P<rest>/\S*)?")
_USING = re.compile(r"NCCL INFO Using network (?P<net>AWS Libfabric|Libfabric|IB|Socket)")
_OFI_PROVIDER = re.compile(r"NET/OFI Selected [Pp]rovider is (?P<provider>[\w;-]+)")
_NET_INIT = re.compile(r"NCCL INFO NET/(?P<net>IB|Socket) : Using (?P<devices>.+)")
_FABRIC = re.compile(r"clusterbake: .*\bfabric (?P<fabric>efa|ib|tcp)\b")
_NCCL_VERSION = re.compile(r"NCCL version (?P<version>[\d.]+)")

_NET_NAMES = {"AWS Libfabric": "libfabric", "Libfabric": "libfabric", "IB": "ib", "Socket": "socket"}
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
    mismatch: bool = False
    advice: str = ""

    def as_dict(self) -> dict:
        return asdict(self)


def events(log: str) -> list[dict]:
    found = []
    for line in log.splitlines():
        _, sep, payload = line.partition(EVENT_PREFIX)
        if sep:
            try:
                found.append(json.loads(payload))
            except json.JSONDecodeError:
                continue
    return found


def _nccl_transport(log: str) -> tuple[str, str, bool] | None:
    """(transport, evidence line, GPUDirect RDMA) from NCCL's own lines."""
    lines = log.splitlines()
    provider = next((m["provider"] for line in lines if (m := _OFI_PROVIDER.search(line))), None)

    def classify(net: str) -> str:
        kind = _NET_NAMES[net]
        if kind == "libfabric":
            return "efa" if provider is None or provider.startswith("efa") else "libfabric"
        return kind

    for line in lines:
        match = _VIA.search(line)
        if match:
            rdma = any("GDRDMA" in (m.group("rest") or "") for m in map(_VIA.search, lines) if m)
            return classify(match["net"]), line.strip(), rdma
    for pattern in (_USING, _NET_INIT):
        for line in lines:
            match = pattern.search(line)
            if match:
                return classify(match["net"]), line.strip(), False
    if provider:
        line = next(line for line in lines if _OFI_PROVIDER.search(line))
        return classify("Libfabric"), line.strip(), False
    return None


_DESCRIPTIONS = {
    "efa": "NCCL over EFA (libfabric, aws-ofi-nccl)",
    "ib": "NCCL over InfiniBand verbs",
    "socket": "NCCL over TCP sockets",
    "libfabric": "NCCL over libfabric with a provider other than efa",
    "gloo-tcp": "gloo over TCP",
}


def detect_transport(log: str) -> Transport:
    fabric_match = _FABRIC.search(log)
    fabric = fabric_match["fabric"] if fabric_match else None
    nccl = _nccl_transport(log)
    init = next((e for e in events(log) if e.get("event") in ("init", "hello")), None)
    if nccl:
        kind, evidence, rdma = nccl
        version = _NCCL_VERSION.search(log)
        description = _DESCRIPTIONS[kind] + (" with GPUDirect RDMA" if rdma else "")
        if version:
            description += f" (NCCL {version['version']})"
        result = Transport("nccl", kind, description, evidence, rdma, fabric)
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
    if fabric in ("efa", "ib") and result.transport not in _EXPECTED[fabric] and result.transport != "unknown":
        result.mismatch = True
        plugin = "the aws-ofi-nccl plugin (NCCL_NET_PLUGIN, LD_LIBRARY_PATH)" if fabric == "efa" else "NCCL_IB_HCA"
        result.advice = (
            f"this node's fabric is {fabric} but collectives went over {result.transport}: "
            f"check {plugin} and NCCL_DEBUG=INFO's NET/ lines before paying for another hour"
        )
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
    lines.append(f"transport: {transport.description}" + (f" [fabric {transport.fabric}]" if transport.fabric else ""))
    if transport.evidence:
        lines.append(f"  evidence: {transport.evidence[:200]}")
    if transport.advice:
        lines.append(("  WARNING: " if transport.mismatch else "  note: ") + transport.advice)
    return "\n".join(lines)
