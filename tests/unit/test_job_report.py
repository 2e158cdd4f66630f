"""Transport detection on saved logs of each kind, and the training summary.

The fixtures in tests/unit/data imitate named NCCL / aws-ofi-nccl releases (their first
line says which, README.md says from which source files); the inline snippets below are
lines of those releases, each commented with where its format comes from.
"""

import json
import re
from pathlib import Path

import pytest

from clusterbake.job_report import detect_transport, format_report, training_summary

DATA = Path(__file__).parent / "data"
FIXTURES = sorted(DATA.glob("nccl-*.log"))
HEADER = re.compile(r"^# fixture: imitates NCCL (?P<nccl>\d+\.\d+\.\d+) ")


def transport(name: str):
    return detect_transport((DATA / name).read_text())


def lines_of(name: str, *needles: str) -> list[str]:
    """The fixture's lines that contain any of the needles, in order."""
    return [line for line in (DATA / name).read_text().splitlines() if any(n in line for n in needles)]


@pytest.mark.parametrize("path", FIXTURES, ids=lambda p: p.name)
def test_each_fixture_names_the_release_it_imitates_and_the_detector_ignores_that(path):
    text = path.read_text()
    header = HEADER.match(text)
    assert header, f"{path.name}: first line must be '# fixture: imitates NCCL <version> ...'"
    assert path.name in (DATA / "README.md").read_text()
    found = detect_transport(text)
    without_header = detect_transport("\n".join(line for line in text.splitlines() if not line.startswith("# ")))
    assert found == without_header
    # The version the log itself prints is the one the header names.
    assert f"(NCCL {header['nccl']})" in found.description


def test_efa_through_aws_ofi_nccl_with_gpudirect():
    found = transport("nccl-efa.log")
    assert (found.library, found.transport, found.fabric) == ("nccl", "efa", "efa")
    assert found.gpudirect_rdma and not found.mismatch and not found.advice
    assert "via NET/AWS Libfabric/0/GDRDMA" in found.evidence
    assert found.description == "NCCL over EFA (libfabric, aws-ofi-nccl) with GPUDirect RDMA (NCCL 2.21.5)"
    assert found.net_plugin == ""  # the plugin loaded: NCCL prints no NET/Plugin line for a v8 plugin


def test_infiniband():
    found = transport("nccl-ib.log")
    assert (found.transport, found.fabric, found.gpudirect_rdma, found.mismatch) == ("ib", "ib", True, False)
    assert "via NET/IB/0/GDRDMA" in found.evidence
    # NCCL's own IB transport is what an IB cluster runs: no net plugin is not a problem there.
    assert "libnccl-net.so not found" in found.net_plugin and not found.advice


def test_sockets_on_a_tcp_cluster_are_fine():
    found = transport("nccl-socket.log")
    assert (found.transport, found.fabric, found.mismatch) == ("socket", "tcp", False)
    assert found.description == "NCCL over TCP sockets (NCCL 2.21.5)"
    assert not found.advice


def test_efa_cluster_training_over_sockets_is_caught_and_the_missing_plugin_named():
    found = transport("nccl-efa-fell-back-to-socket.log")
    assert (found.transport, found.fabric, found.mismatch, found.gpudirect_rdma) == ("socket", "efa", True, False)
    assert "via NET/Socket/0" in found.evidence
    assert "aws-ofi-nccl" in found.advice
    assert "libnccl-net.so not found" in found.advice
    assert "WARNING" in format_report(training_summary(""), found)


def test_plugin_noise_alone_is_no_transport_at_all():
    # NET/Plugin and TUNER/Plugin lines mention libnccl-net.so; the EFA log's collnet lines
    # come from a loaded aws-ofi-nccl. None of them says which network carried anything.
    noise = lines_of("nccl-efa-fell-back-to-socket.log", "clusterbake: job", "/Plugin:", "NCCL version")
    noise += lines_of("nccl-efa.log", "/Plugin:", "NET/OFI Initializing", "Bootstrap : Using")
    found = detect_transport("\n".join(noise))
    assert found.transport == "unknown" and found.transport != "efa" and not found.mismatch


def test_using_network_socket_after_a_failed_plugin_load_is_tcp_and_a_mismatch_on_efa():
    log = lines_of("nccl-efa-fell-back-to-socket.log", "clusterbake: job", "NET/Plugin:", "NET/IB :", "Using network")
    found = detect_transport("\n".join(log))
    assert (found.transport, found.fabric, found.mismatch) == ("socket", "efa", True)
    assert found.evidence.endswith("NCCL INFO Using network Socket")
    assert "libnccl-net.so not found" in found.advice


def test_nccl_2_23_plugin_not_found_format():
    # NCCL 2.23.4 output as captured (host names and addresses changed): the version line has
    # the INFO prefix from 2.23 on, and the plugin loader prints one "Could not find" line.
    log = """\
clusterbake: job 5 (restart 0) on gpu-[1-2], rendezvous gpu-1:29405, checkpoints in /c, fabric efa
gpu-1:58239:58239 [0] NCCL INFO Bootstrap : Using ens5:10.0.0.5<0>
gpu-1:58239:58239 [0] NCCL INFO cudaDriverVersion 12050
gpu-1:58239:58239 [0] NCCL INFO NCCL version 2.23.4+cuda12.1
gpu-1:58239:58245 [0] NCCL INFO NET/Plugin: Could not find: libnccl-net.so. Using internal network plugin.
gpu-1:58239:58245 [0] NCCL INFO Failed to open libibverbs.so[.1]
gpu-1:58239:58245 [0] NCCL INFO NET/Socket : Using [0]ens5:10.0.0.5<0>
gpu-1:58239:58245 [0] NCCL INFO PROFILER/Plugin: Could not find: libnccl-profiler.so.
gpu-1:58239:58245 [0] NCCL INFO Using network Socket
"""
    found = detect_transport(log)
    assert (found.transport, found.mismatch) == ("socket", True)
    assert found.description == "NCCL over TCP sockets (NCCL 2.23.4)"
    assert "libnccl-net.so not found" in found.net_plugin and "libnccl-net.so not found" in found.advice


@pytest.mark.parametrize(
    ("using", "via"),
    [
        # aws-ofi-nccl <= 1.11 calls itself "AWS Libfabric", 1.12 and later "Libfabric", or "OFI"
        # when NCCL_NET=OFI asks for it (nccl_ofi_interface_nvidia.c, nvidia_plugin_name_fixup).
        ("AWS Libfabric", "AWS Libfabric/0/GDRDMA"),
        ("Libfabric", "Libfabric/2/GDRDMA"),
        ("OFI", "OFI/0/GDRDMA"),
        # A PXN send goes out through another local rank's NIC (net.cc: "NET/%s/%d(%d)%s%s").
        ("Libfabric", "Libfabric/0(1)/GDRDMA"),
    ],
)
def test_every_name_aws_ofi_nccl_goes_by_is_efa(using, via):
    log = (
        "clusterbake: job 1 (restart 0) on a-[1-2], rendezvous a-1:1, checkpoints in /c, fabric efa\n"
        "a-1:1:2 [0] NCCL INFO NET/OFI Selected Provider is efa (found 32 nics)\n"
        f"a-1:1:2 [0] NCCL INFO Using network {using}\n"
        f"a-1:1:2 [0] NCCL INFO Channel 00/0 : 0[0] -> 8[0] [send] via NET/{via}\n"
    )
    found = detect_transport(log)
    assert (found.transport, found.gpudirect_rdma, found.mismatch) == ("efa", True, False)
    assert f"via NET/{via}" in found.evidence


def test_hpcx_ib_plugin_is_infiniband_with_its_gpudirect_flag():
    # HPC-X's nccl-rdma-sharp-plugins call their verbs transport "IBext_v8" (ib_plugin.c);
    # "NET/IBext_v8/0" must not be read as NCCL's "NET/IB" with no flags.
    log = (
        "clusterbake: job 2 (restart 0) on nd-[1-2], rendezvous nd-1:1, checkpoints in /c, fabric ib\n"
        "nd-1:1:2 [0] NCCL INFO Using network IBext_v8\n"
        "nd-1:1:2 [0] NCCL INFO Channel 00/0 : 15[7] -> 0[0] [receive] via NET/IBext_v8/0/GDRDMA\n"
    )
    found = detect_transport(log)
    assert (found.transport, found.gpudirect_rdma, found.mismatch) == ("ib", True, False)


def test_nccl_net_naming_a_missing_plugin_is_not_efa():
    # NCCL_NET="AWS Libfabric" without the plugin: NCCL 2.21's net.cc stops with this WARN.
    log = "\n".join(
        [
            *lines_of("nccl-efa-fell-back-to-socket.log", "clusterbake: job", "NET/Plugin:", "NCCL version"),
            "gpu-1:3100:3180 [0] net.cc:790 NCCL WARN Error: network AWS Libfabric not found.",
        ]
    )
    found = detect_transport(log)
    assert (found.library, found.transport, found.mismatch) == ("nccl", "unknown", False)
    assert found.description == "NCCL stopped: no network named 'AWS Libfabric' (NCCL_NET)"
    assert "libnccl-net.so not found" in found.advice and "NCCL_DEBUG" not in found.advice


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


def test_progress_lines_for_people_and_other_lines_as_they_are():
    from clusterbake.job_report import progress_line

    step = {"event": "step", "time": 1.0, "step": 3, "loss": 4.80259, "tokens_per_s": 4574.3, "step_s": 0.4477}
    assert progress_line(event(step)) == "[rank0]: step 3: loss 4.8026, 4,574 tokens/s, 0.45 s/step"
    checkpoint = {"event": "checkpoint", "step": 6, "path": "/shared/checkpoints/x/step6", "reason": "interval"}
    assert progress_line(f"CLUSTERBAKE_EVENT {json.dumps(checkpoint)}") == (
        "checkpoint at step 6: /shared/checkpoints/x/step6 (interval)"
    )
    done = {"event": "done", "steps": 12, "first_loss": 5.638, "final_loss": 3.41}
    assert progress_line(f"CLUSTERBAKE_EVENT {json.dumps(done)}") == "done: 12 steps, loss 5.638 -> 3.410"
    assert progress_line("plain output") == "plain output"
    assert progress_line("garbage CLUSTERBAKE_EVENT {not json") == "garbage CLUSTERBAKE_EVENT {not json"


def test_streamed_output_is_rendered_by_whole_lines():
    import io

    from clusterbake.jobs import LineStream

    out = io.StringIO()
    stream = LineStream(out, str.upper)
    stream.write("first li")
    assert out.getvalue() == ""
    stream.write("ne\nsecond\nthi")
    stream.write("rd", final=True)
    assert out.getvalue() == "FIRST LINE\nSECOND\nTHIRD\n"
