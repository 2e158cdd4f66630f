"""Transport detection on saved logs of each kind, and the training summary."""

import json
from pathlib import Path

from clusterbake.job_report import detect_transport, format_report, training_summary

DATA = Path(__file__).parent / "data"


def transport(name: str):
    return detect_transport((DATA / name).read_text())


def test_efa_through_aws_ofi_nccl_with_gpudirect():
    found = transport("nccl-efa.log")
    assert (found.library, found.transport, found.fabric) == ("nccl", "efa", "efa")
    assert found.gpudirect_rdma and not found.mismatch
    assert "via NET/Libfabric/0/GDRDMA" in found.evidence
    assert "NCCL 2.23.4" in found.description


def test_infiniband():
    found = transport("nccl-ib.log")
    assert (found.transport, found.fabric, found.gpudirect_rdma, found.mismatch) == ("ib", "ib", True, False)


def test_sockets_on_a_tcp_cluster_are_fine():
    found = transport("nccl-socket.log")
    assert (found.transport, found.fabric, found.mismatch) == ("socket", "tcp", False)
    assert found.description.startswith("NCCL over TCP sockets")


def test_efa_cluster_training_over_sockets_is_caught():
    found = transport("nccl-efa-fell-back-to-socket.log")
    assert (found.transport, found.fabric, found.mismatch) == ("socket", "efa", True)
    assert "aws-ofi-nccl" in found.advice
    assert "WARNING" in format_report(training_summary(""), found)


def test_older_plugin_name_and_libfabric_without_efa():
    old = detect_transport("x [0] NCCL INFO Ring 00 : 7 -> 8 [send] via NET/AWS Libfabric/0\n")
    assert old.transport == "efa"
    tcp_provider = detect_transport(
        "NCCL INFO NET/OFI Selected Provider is tcp (found 1 nics)\n"
        "NCCL INFO Channel 00/0 : 0[0] -> 1[0] [send] via NET/Libfabric/0\n"
        "clusterbake: job 1 on a-[1-2], fabric efa\n"
    )
    assert (tcp_provider.transport, tcp_provider.mismatch) == ("libfabric", True)


def event(payload: dict) -> str:
    return f"[rank0]: CLUSTERBAKE_EVENT {json.dumps(payload)}"


def test_gloo_job_and_training_summary():
    log = "\n".join(
        [
            "clusterbake: job 3 (restart 0) on cpu-[1-2], rendezvous cpu-1:29403, checkpoints in /c, fabric tcp",
            event({"event": "init", "backend": "gloo", "world_size": 2, "hosts": ["cpu-1", "cpu-2"],
                   "socket_ifname": "host0"}),
            event({"event": "step", "step": 1, "loss": 5.6, "tokens_per_s": 900.0}),
            event({"event": "checkpoint", "step": 10, "path": "/c/step10", "reason": "interval"}),
            event({"event": "resumed", "step": 10, "path": "/c/step10"}),
            "garbage CLUSTERBAKE_EVENT {not json",
            event({"event": "done", "steps": 30, "first_loss": 5.6, "final_loss": 2.9, "tokens_per_s": 1234.4,
                   "world_size": 2, "hosts": ["cpu-2", "cpu-1"], "checkpoint_dir": "/c",
                   "last_checkpoint": "/c/step30"}),
        ]
    )  # fmt: skip
    found = detect_transport(log)
    assert (found.library, found.transport, found.fabric, found.mismatch) == ("gloo", "gloo-tcp", "tcp", False)
    assert found.description == "gloo over TCP on host0"
    summary = training_summary(log)
    assert summary["completed"] and summary["steps"] == 30
    assert summary["hosts"] == ["cpu-1", "cpu-2"] and summary["resumed_from"] == [10]
    assert summary["last_checkpoint"] == "/c/step30"
    text = format_report(summary, found)
    assert "loss 5.600 -> 2.900" in text and "1234 tokens/s" in text


def test_log_without_any_collective_output():
    found = detect_transport("hello\n")
    assert (found.library, found.transport, found.mismatch) == ("unknown", "unknown", False)
