"""The notice agent (roles/notice_agent/files/clusterbake-notice-agent) against the twins' real
metadata services over HTTP on 127.0.0.1: EC2's IMDSv2 (spot/instance-action, rebalance) and
Azure's Scheduled Events (Preempt, acknowledged with StartRequests). Slurm's commands are the
only stand-in (their calls are recorded); the agent on real nodes, with real Slurm and a real
job that checkpoints, is tests/integration/test_faults.py and tests/twin/test_aws_twin.py.
"""

from __future__ import annotations

import json
import threading
from datetime import UTC, datetime, timedelta
from email.utils import format_datetime
from pathlib import Path

import programs
import pytest

from clusterbake.twins.aws import imds as aws_imds
from clusterbake.twins.azure import imds as azure_imds

PROGRAM = Path(__file__).resolve().parents[2] / "roles" / "notice_agent" / "files" / "clusterbake-notice-agent"
IN_TWO_MINUTES = datetime.now(UTC).replace(microsecond=0) + timedelta(minutes=2)


class Slurm:
    """scontrol, squeue, scancel and sinfo as the agent calls them: the calls, and Slurm's answers."""

    def __init__(self):
        self.calls: list[tuple[str, ...]] = []
        self.jobs = "41|clusterbake:checkpoint-on-usr1\n42|\n"
        self.reason = ""

    def __call__(self, *argv: str) -> tuple[int, str]:
        self.calls.append(argv)
        if argv[0] == "squeue":
            return 0, self.jobs
        if argv[0] == "sinfo":
            return 0, self.reason
        return 0, ""


@pytest.fixture
def agent(tmp_path, monkeypatch):
    module = programs.load_program("clusterbake_notice_agent", PROGRAM)
    monkeypatch.setattr(module, "LOG", tmp_path / "notice.log")
    slurm = Slurm()
    monkeypatch.setattr(module, "run", slurm)
    module.slurm = slurm
    return module


def serve(server):
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    return server


@pytest.fixture
def ec2():
    notices: dict = {}

    def lookup(address):
        meta = {"instance-id": "i-0123456789abcdef0", "local-ipv4": "127.0.0.1"}
        if "spot" in notices:
            meta["spot"] = {"instance-action": json.dumps(notices["spot"]), "termination-time": notices["spot"]["time"]}
        if "rebalance" in notices:
            meta["events"] = {"recommendations": {"rebalance": json.dumps(notices["rebalance"])}}
        if "maintenance" in notices:
            meta.setdefault("events", {})["maintenance"] = {"scheduled": json.dumps(notices["maintenance"])}
        settings = {"http_tokens": "required", "http_endpoint": "enabled", "hop_limit": 1, "user_data": b""}
        return {
            "instance_id": "i-0123456789abcdef0",
            **settings,
            "role": None,
            "public_keys": {},
            "identity": {},
            "meta": meta,
        }

    sock = aws_imds.listen("127.0.0.1", 0)
    server = serve(aws_imds.MetadataServer(sock, lookup, lambda *a: {}, lambda message: None))
    yield notices, f"http://127.0.0.1:{sock.getsockname()[1]}"
    server.shutdown()
    server.server_close()


@pytest.fixture
def azure():
    state = {"events": [], "approved": []}
    vm = {"instance": {"compute": {"name": "gpu-1", "vmSize": "Standard_ND96isr_H100_v5"}, "network": {}},
          "identities": [], "vm": "gpu-1"}  # fmt: skip

    def events(name):
        return {
            "DocumentIncarnation": len(state["events"]),
            "Events": [e for e in state["events"] if name in e["Resources"]],
        }

    def approve(name, ids):
        state["approved"] += ids
        state["events"] = [e for e in state["events"] if e["EventId"] not in ids]

    sock = aws_imds.listen("127.0.0.1", 0)
    server = serve(azure_imds.MetadataServer(sock, lambda a: vm, lambda *a: ("t", 0), events, approve, lambda m: None))
    yield state, f"http://127.0.0.1:{sock.getsockname()[1]}"
    server.shutdown()
    server.server_close()


def an_agent(agent, config: dict, **kwargs):
    """The program's Agent for `config`, with the notice source its provider has (SOURCES), as main makes it."""
    return agent.Agent(config, agent.SOURCES[config["provider"]](config), **kwargs)


def assert_drained_and_asked_to_checkpoint(agent, reason: str) -> None:
    """The node drained first, with the notice's reason; the job that checkpoints on USR1 asked to."""
    assert agent.slurm.calls[0] == ("scontrol", "update", "NodeName=gpu-1", "State=DRAIN", f"Reason={reason}")
    assert ("scancel", "--batch", "--signal=USR1", "41") in agent.slurm.calls


def test_a_spot_interruption_drains_signals_the_checkpointing_job_and_requeues_late(agent, ec2):
    notices, url = ec2
    config = {"provider": "aws", "metadata_url": url, "node": "gpu-1", "margin": 10}
    clock = {"now": IN_TWO_MINUTES.timestamp() - 120}
    worker = an_agent(agent, config, clock=lambda: clock["now"])
    worker.step()
    # No notice: nothing asked of Slurm but, once, whether the node is drained by a notice it came back from.
    assert agent.slurm.calls == [("sinfo", "--noheader", "--nodes", "gpu-1", "--format=%E")]
    agent.slurm.calls.clear()
    notices["spot"] = {"action": "terminate", "time": IN_TWO_MINUTES.strftime("%Y-%m-%dT%H:%M:%SZ")}
    worker.step()
    reason = f"clusterbake: spot reclaim at {IN_TWO_MINUTES:%Y-%m-%dT%H:%M:%SZ} (EC2 spot/instance-action terminate)"
    assert_drained_and_asked_to_checkpoint(agent, reason)  # 41 checkpoints on USR1
    assert not [c for c in agent.slurm.calls if c[-1] == "42" and c[0] == "scancel"]  # it does not say so
    assert not [c for c in agent.slurm.calls if c[:2] == ("scontrol", "requeue")]
    worker.step()
    assert [c for c in agent.slurm.calls if c[0] == "scancel"] == [("scancel", "--batch", "--signal=USR1", "41")]
    clock["now"] = IN_TWO_MINUTES.timestamp() - 9  # inside the margin: what is still there is requeued
    worker.step()
    assert [c for c in agent.slurm.calls if c[:2] == ("scontrol", "requeue")] == [
        ("scontrol", "requeue", "41"),
        ("scontrol", "requeue", "42"),
    ]
    assert f"notice: {reason}" in (agent.LOG).read_text()


def test_a_rebalance_recommendation_leaves_the_node_in_service(agent, ec2):
    """Hardware review item 13: a rebalance recommendation drained the node for good (never returned), idle
    and billed. It is logged; the spot interruption notice follows if EC2 does reclaim the instance."""
    notices, url = ec2
    config = {"provider": "aws", "metadata_url": url, "node": "gpu-1"}
    worker = an_agent(agent, config)
    notices["rebalance"] = {"noticeTime": "2026-12-01T10:00:00Z"}
    worker.step()
    worker.step()
    assert [c for c in agent.slurm.calls if c[0] in ("scontrol", "scancel")] == []
    assert "rebalance recommendation at 2026-12-01T10:00:00Z" in agent.LOG.read_text()
    assert "left in service" in agent.LOG.read_text()


def test_an_ec2_scheduled_reboot_drains_checkpoints_and_the_node_returns_after_it(agent, ec2):
    """EC2's scheduled events (IMDS events/maintenance/scheduled, NotBefore in its "21 Jan 2019 09:00:43 GMT"
    form) were not watched. A reboot drains and checkpoints like a reclaim; completed events are ignored;
    after the reboot the agent starts afresh and returns the node it drained."""
    notices, url = ec2
    event = {
        "NotBefore": format_datetime(IN_TWO_MINUTES, usegmt=True).split(", ", 1)[1],
        "Code": "system-reboot",
        "Description": "scheduled reboot",
        "EventId": "instance-event-0d59937288b749b32",
        "State": "active",
    }
    done = {**event, "Code": "instance-stop", "EventId": "instance-event-1", "State": "completed"}
    notices["maintenance"] = [event, done]
    config = {"provider": "aws", "metadata_url": url, "node": "gpu-1"}
    worker = an_agent(agent, config)
    worker.step()
    reason = (
        f"clusterbake: reboot at {IN_TWO_MINUTES:%Y-%m-%dT%H:%M:%SZ} (EC2 scheduled event system-reboot "
        "instance-event-0d59937288b749b32; the machine returns)"
    )
    assert_drained_and_asked_to_checkpoint(agent, reason)
    # The instance rebooted: a new agent, the event no longer active, the node still drained by it.
    notices["maintenance"] = [{**event, "State": "completed"}]
    agent.slurm.calls.clear()
    agent.slurm.reason = reason
    an_agent(agent, config).step()
    assert agent.slurm.calls[-1] == ("scontrol", "update", "NodeName=gpu-1", "State=RESUME")


def test_after_an_azure_reboot_the_node_drained_for_it_returns_and_a_reclaimed_one_does_not(agent, azure):
    _, url = azure
    config = {"provider": "azure", "metadata_url": url, "node": "gpu-1"}
    rebooted = "clusterbake: reboot at 2026-12-01T10:02:00Z (Azure reboot, scheduled event E1; the machine returns)"
    agent.slurm.reason = rebooted
    an_agent(agent, config).step()
    assert agent.slurm.calls[-1] == ("scontrol", "update", "NodeName=gpu-1", "State=RESUME")
    assert "back after reboot at 2026-12-01T10:02:00Z" in agent.LOG.read_text()
    agent.slurm.calls.clear()
    agent.slurm.reason = "clusterbake: spot reclaim at 2026-12-01T10:02:00Z (Azure spot eviction, scheduled event E2)"
    an_agent(agent, config).step()
    agent.slurm.reason = "disk swap on Monday"  # a person's drain
    an_agent(agent, config).step()
    assert not [c for c in agent.slurm.calls if c[:2] == ("scontrol", "update")]


def test_azure_preempt_is_acknowledged_once_the_jobs_are_off_the_node(agent, azure):
    state, url = azure
    not_before = datetime.now(UTC).replace(microsecond=0) + timedelta(seconds=30)
    state["events"] = [
        {"EventId": "602d9444-d2cd-49c7-8624-8643e7171297", "EventType": "Preempt", "ResourceType": "VirtualMachine",
         "Resources": ["gpu-1"], "EventStatus": "Scheduled", "NotBefore": format_datetime(not_before, usegmt=True),
         "Description": "", "EventSource": "Platform", "DurationInSeconds": -1},
        {"EventId": "A123BC45-1234-5678-AB90-ABCDEF123456", "EventType": "Freeze", "ResourceType": "VirtualMachine",
         "Resources": ["gpu-1"], "EventStatus": "Scheduled", "NotBefore": format_datetime(not_before, usegmt=True),
         "Description": "host update", "EventSource": "Platform", "DurationInSeconds": 9},
        {"EventId": "B0000000-0000-0000-0000-000000000000", "EventType": "Preempt", "ResourceType": "VirtualMachine",
         "Resources": ["gpu-2"], "EventStatus": "Scheduled", "NotBefore": format_datetime(not_before, usegmt=True),
         "Description": "", "EventSource": "Platform", "DurationInSeconds": -1},
    ]  # fmt: skip
    config = {"provider": "azure", "metadata_url": url, "node": "gpu-1"}
    worker = an_agent(agent, config)
    worker.step()
    reason = (
        f"clusterbake: spot reclaim at {not_before:%Y-%m-%dT%H:%M:%SZ} "
        "(Azure spot eviction, scheduled event 602d9444-d2cd-49c7-8624-8643e7171297)"
    )
    assert_drained_and_asked_to_checkpoint(agent, reason)
    assert state["approved"] == []  # jobs still on the node
    agent.slurm.jobs = ""
    worker.step()
    assert state["approved"] == ["602d9444-d2cd-49c7-8624-8643e7171297"]  # only ours, only the Preempt
    assert "Freeze (host update): no action" in agent.LOG.read_text()
    drains = [c for c in agent.slurm.calls if c[:2] == ("scontrol", "update")]
    assert len(drains) == 1  # the other VM's eviction is not this node's


def test_the_local_stand_in_reads_the_file_node_interrupt_writes(agent, tmp_path, monkeypatch):
    notice = tmp_path / "notice.json"
    monkeypatch.setattr(agent, "LOCAL_NOTICE", notice)
    config = {"provider": "local", "node": "cpu-1"}
    worker = an_agent(agent, config)
    worker.step()
    agent.slurm.calls.clear()  # the look at an earlier drain (none)
    notice.write_text(json.dumps({"action": "terminate", "time": "2026-12-01T10:02:00Z"}))
    worker.step()
    assert agent.slurm.calls[0] == (
        "scontrol", "update", "NodeName=cpu-1", "State=DRAIN",
        "Reason=clusterbake: spot reclaim at 2026-12-01T10:02:00Z (clusterbake node interrupt: terminate)",
    )  # fmt: skip
