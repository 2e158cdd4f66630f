"""The job report and the health checks against output captured on a real GPU machine
(one H200, NCCL 2.28.9, DeepSpeed 0.19.8: tests/unit/data/captured-h200/README.md), where
tests/unit/data's other logs are reconstructed from NCCL's source."""

from pathlib import Path

from clusterbake.job_report import detect_transport, events, format_report, training_summary

CAPTURED = Path(__file__).parent / "data" / "captured-h200"
HELLO = (CAPTURED / "nccl-2.28.9-hello-2hosts.log").read_text()
TWO_HOSTS = (CAPTURED / "deepspeed-2hosts-checkpoint-request.log").read_text()
ONE_GPU = (CAPTURED / "deepspeed-1gpu-fresh-then-resume.log").read_text()
NO_PLUGIN = "NCCL loaded no net plugin (libnccl-net.so not found) and used its own IB/Socket transports"


def test_nccl_2_28_between_two_hosts_is_sockets_and_says_no_net_plugin_was_found():
    for log in (HELLO, TWO_HOSTS):
        found = detect_transport(log)
        assert (found.library, found.transport, found.fabric, found.mismatch) == ("nccl", "socket", "tcp", False)
        assert found.description == "NCCL over TCP sockets (NCCL 2.28.9)"
        assert found.evidence.endswith("via NET/Socket/0") and not found.gpudirect_rdma
        # 2.28 prints "NET/Plugin: Could not find: libnccl-net.so" and "Initialized NET plugin
        # Socket", no longer "Using internal network plugin".
        assert found.net_plugin == NO_PLUGIN


def test_the_same_log_on_an_efa_node_is_a_mismatch_that_names_the_missing_plugin():
    found = detect_transport(HELLO.replace("fabric tcp", "fabric efa"))
    assert found.mismatch and found.fabric == "efa"
    assert "collectives went over socket; " + NO_PLUGIN in found.advice


def test_events_of_ranks_whose_unbuffered_lines_interleaved_are_all_read():
    # Captured with PYTHONUNBUFFERED=1 before hello_distributed.py wrote each event in one
    # write: rank 1's newline came after rank 0's event.
    assert "}CLUSTERBAKE_EVENT {" in HELLO
    hello = [event for event in events(HELLO) if event["event"] == "hello"]
    assert sorted(event["rank"] for event in hello) == [0, 1]
    assert all(event["ok"] and event["backend"] == "nccl" and event["sum"] == 1.0 for event in hello)


def test_a_checkpoint_request_mid_run_on_the_gpu_stops_with_a_checkpoint():
    summary = training_summary(TWO_HOSTS)
    checkpoints = [event for event in events(TWO_HOSTS) if event["event"] == "checkpoint"]
    assert [event["reason"] for event in checkpoints] == ["signal"]
    assert summary["completed"] and summary["world_size"] == 2
    assert summary["last_checkpoint"] == checkpoints[0]["path"] and checkpoints[0]["path"].endswith(
        f"step{summary['steps']}"
    )
    assert summary["final_loss"] < summary["first_loss"]


def test_a_bf16_run_on_the_gpu_resumes_from_its_checkpoint():
    inits = [event for event in events(ONE_GPU) if event["event"] == "init"]
    assert [(event["device"], event["dtype"], event["backend"]) for event in inits] == [
        ("cuda (NVIDIA H200)", "bf16", "nccl")
    ] * 2
    summary = training_summary(ONE_GPU)
    assert summary["resumed_from"] == [30] and summary["steps"] == 40
    assert summary["last_checkpoint"].endswith("/step40")
    report = format_report(summary, detect_transport(ONE_GPU))
    # One GPU, no NCCL_DEBUG: the report says it cannot tell the transport, and why.
    assert "NCCL_DEBUG=INFO" in report
