"""clusterbake-health (role node_health): each check against recorded outputs of the tools it
reads, and what it does in Slurm (drain, resume, leave alone).

The commands it runs are stand-ins (data/health/fakecmd) that print recorded outputs
(data/health/README.md says what each imitates) and log their calls; the program itself runs
unchanged, as a subprocess. The checks without hardware (mounts, munge, disk, slurmd, the
timer, the private munged) also run for real on nodes: tests/integration/test_faults.py.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
PROGRAM = REPO / "roles" / "node_health" / "files" / "clusterbake-health"
DATA = Path(__file__).resolve().parent / "data" / "health"
FAKED = [
    "scontrol", "systemctl", "munge", "unmunge", "systemd-detect-virt", "timedatectl", "nvidia-smi",
    "journalctl", "dmesg", "fi_info", "ibstat", "dcgmi", "runuser",
]  # fmt: skip
HEALTHY = {
    "unmunge": {"out": "STATUS:          Success (0)\n"},
    "systemctl show --property=NRestarts --value": {"out": "0\n"},
    "systemd-detect-virt": {"rc": 1},
    "timedatectl": {"out": "yes\n"},
    "scontrol show node": {"out": "NodeName=cpu-1 Arch=x86_64 State=IDLE ThreadsPerCore=1 Partitions=cpu\n"},
}
DRAINED_BY_US = "NodeName=cpu-1 State=IDLE+DRAIN Partitions=cpu Reason=clusterbake-health: /x is not mounted [root@2026-12-01T21:05:00]\n"  # noqa: E501
DRAINED_BY_A_PERSON = (
    "NodeName=cpu-1 State=MIXED+DRAIN Partitions=cpu Reason=disk swap on Monday [root@2026-12-01T21:05:00]\n"
)


@pytest.fixture
def health(tmp_path):
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for name in FAKED:
        (bin_dir / name).symlink_to(DATA / "fakecmd")
    meminfo = tmp_path / "meminfo"
    meminfo.write_text("MemTotal:       24000000 kB\nMemAvailable:    8000000 kB\n")

    prolog = tmp_path / "clusterbake-health-prolog"  # the link slurm.conf's Prolog names
    prolog.symlink_to(PROGRAM)

    def run(config: dict, fakes: dict | None = None, args=(), env=None, as_prolog=False):
        calls = tmp_path / "calls.log"
        calls.write_text("")
        settings = {"mounts": ["/dev/shm"], "disk_paths": ["/"], "disk_min_free_mb": 1, "memory_min_available_mb": 64}
        (tmp_path / "health.json").write_text(json.dumps({**settings, **config}))
        result = subprocess.run(
            [str(prolog if as_prolog else PROGRAM), *args],
            capture_output=True,
            text=True,
            timeout=60,
            env={
                "PATH": f"{bin_dir}:/usr/bin:/bin",
                "HEALTH_CALLS": str(calls),
                "HEALTH_FAKES": json.dumps({**HEALTHY, **(fakes or {})}),
                "CLUSTERBAKE_HEALTH_CONFIG": str(tmp_path / "health.json"),
                "CLUSTERBAKE_HEALTH_STATE": str(tmp_path / "state"),
                "CLUSTERBAKE_HEALTH_LOG": str(tmp_path / "health.log"),
                "CLUSTERBAKE_MEMINFO": str(meminfo),
                "SLURMD_NODENAME": "cpu-1",
                **(env or {}),
            },
        )
        updates = [line for line in calls.read_text().splitlines() if line.startswith("scontrol update")]
        return result, updates, calls.read_text().splitlines()

    run.meminfo = meminfo
    return run


def drain_of(updates: list[str]) -> str:
    (update,) = updates
    assert update.startswith("scontrol update NodeName=cpu-1 State=DRAIN Reason="), update
    return update.split("Reason=", 1)[1]


def test_a_healthy_node_is_left_alone(health):
    result, updates, _ = health({})
    assert result.returncode == 0, result.stdout + result.stderr
    assert updates == []
    assert "ok   mounts" in result.stdout and "FAIL" not in result.stdout


def test_a_missing_mount_drains_with_the_reason(health):
    result, updates, _ = health({"mounts": ["/dev/shm", "/no-such-mount"]})
    assert result.returncode == 1
    assert drain_of(updates) == "clusterbake-health: /no-such-mount is not mounted"


def test_a_mount_that_refuses_writes_drains(health):
    _, updates, _ = health({"mounts": ["/proc"]})
    assert drain_of(updates).startswith("clusterbake-health: /proc is not writable (")


def test_a_read_only_mount_by_design_needs_to_be_there_not_writable(health):
    """A storage entry with read_only: true (a dataset container) is checked mounted, never written to."""
    result, updates, _ = health({"mounts": ["/dev/shm"], "read_only_mounts": ["/proc"]})
    assert result.returncode == 0 and not updates
    _, updates, _ = health({"mounts": ["/dev/shm"], "read_only_mounts": ["/no-such-dataset"]})
    assert drain_of(updates) == "clusterbake-health: /no-such-dataset is not mounted"


def test_munge_down_drains_naming_munge(health):
    fakes = {
        "unmunge": {"rc": 1, "out": "unmunge: Error: No credential specified\n"},
        "systemctl is-active --quiet munge": {"rc": 3},
    }
    _, updates, _ = health({}, fakes)
    assert drain_of(updates) == "clusterbake-health: munge is not running (systemctl status munge)"


def test_a_daemon_systemd_keeps_restarting_drains_the_node(health):
    health({"max_restarts": 3})  # the first sample: 0 restarts
    fakes = {"systemctl show --property=NRestarts --value slurmd": {"out": "4\n"}}
    _, updates, _ = health({"max_restarts": 3}, fakes)
    assert drain_of(updates) == "clusterbake-health: slurmd restarted 4 times in 10 min (journalctl -u slurmd)"


def test_a_full_disk_and_low_memory_drain(health):
    health.meminfo.write_text("MemTotal:       24000000 kB\nMemAvailable:     100000 kB\n")
    _, updates, _ = health({"disk_min_free_mb": 10**9, "memory_min_available_mb": 512})
    reason = drain_of(updates)
    assert reason.startswith("clusterbake-health: / has ")
    assert " MiB free (needs 1000000000); 97 MiB of memory available (needs 512)" in reason


def test_slurmd_not_running_drains_when_the_timer_checks(health):
    fakes = {"systemctl is-active --quiet slurmd": {"rc": 3}}
    _, updates, _ = health({}, fakes, env={"SLURMD_NODENAME": "", "CLUSTERBAKE_NODE": ""})
    assert updates == [
        "scontrol update NodeName=" + os.uname().nodename.split(".")[0] + " State=DRAIN "
        "Reason=clusterbake-health: slurmd is not running (systemctl status slurmd)"
    ]


GPU = {"gpus": 8, "fatal_xids": [48, 63, 64, 74, 79, 92, 94, 95, 119, 120, 154]}


@pytest.mark.parametrize(
    ("fakes", "reason"),
    [
        ({"nvidia-smi": {"file": "nvidia-smi-p5-gpu-lost.csv"}}, "7 of 8 GPUs visible (nvidia-smi)"),
        (
            {"nvidia-smi": {"file": "nvidia-smi-p5-persistence-off.csv"}},
            "persistence mode off on GPU 3 (systemctl status nvidia-persistenced)",
        ),
        (
            {"nvidia-smi": {"rc": 9, "file": "nvidia-smi-no-driver.txt"}},
            "nvidia-smi failed: NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver. Make "
            "sure that the latest NVIDIA driver is installed and running.",
        ),
        (
            {"nvidia-smi": {"file": "nvidia-smi-p5.csv"}, "journalctl": {"file": "kernel-xid.txt"}},
            "Xid 79 on PCI:0000:97:00 (GPU has fallen off the bus)",
        ),
    ],
    ids=["gpu-lost", "persistence-off", "no-driver", "xid-79"],
)
def test_gpu_faults_from_recorded_outputs_drain_with_the_reason(health, fakes, reason):
    _, updates, _ = health(GPU, fakes)
    assert drain_of(updates) == f"clusterbake-health: {reason}"


def test_eight_healthy_gpus_pass_and_a_harmless_xid_is_ignored(health):
    fakes = {"nvidia-smi": {"file": "nvidia-smi-p5.csv"}, "journalctl": {"out": "NVRM: Xid (PCI:0000:53:00): 13, x\n"}}
    result, updates, _ = health(GPU, fakes)
    assert (result.returncode, updates) == (0, []), result.stdout


def test_the_h200s_captured_answer_passes_for_its_one_gpu_and_not_for_eight(health):
    # nvidia-smi-h200.csv is the query's real answer on an H200 VM (data/captured-h200).
    fakes = {"nvidia-smi": {"file": "nvidia-smi-h200.csv"}, "journalctl": {"out": "-- No entries --\n"}}
    result, updates, _ = health({**GPU, "gpus": 1}, fakes)
    assert (result.returncode, updates) == (0, []), result.stdout
    _, updates, _ = health(GPU, fakes)
    assert drain_of(updates) == "clusterbake-health: 1 of 8 GPUs visible (nvidia-smi)"


def test_after_a_gpu_reset_xids_logged_before_it_no_longer_drain(health):
    """Hardware review item 18: Xids were counted since boot, so a node stayed drained after NVIDIA's remedy
    (nvidia-smi -r) until a reboot. --xids-cleared makes the check read the journal from that moment on."""
    fakes = {"nvidia-smi": {"file": "nvidia-smi-p5.csv"}, "journalctl": {"file": "kernel-xid.txt"}}
    _, updates, calls = health(GPU, fakes)
    assert drain_of(updates) == "clusterbake-health: Xid 79 on PCI:0000:97:00 (GPU has fallen off the bus)"
    assert not [c for c in calls if c.startswith("journalctl") and "--since=" in c]
    cleared, _, _ = health(GPU, args=["--xids-cleared"])
    assert cleared.returncode == 0 and "no longer drain this node" in cleared.stdout
    # The journal from the marker on holds nothing: the fake answers as journalctl does then.
    fakes["journalctl"] = {"out": "-- No entries --\n"}
    result, updates, calls = health(GPU, fakes)
    assert (result.returncode, updates) == (0, []), result.stdout
    (query,) = [c for c in calls if c.startswith("journalctl")]
    assert "--since=@" in query and "--boot" in query


def test_xid_46_and_a_fatal_nvswitch_sxid_drain(health):
    # Constructed lines in the NVSwitch driver's SXid format (code, Fatal or Non-fatal, text): no real capture here.
    kernel = (
        "NVRM: Xid (PCI:0000:53:00): 46, pid=1811, name=python, GPU stopped processing\n"
        "nvidia-nvswitch2: SXid (PCI:0000:07:00.0): 12028, Non-fatal, Link 40 egress non-posted PRIV error\n"
        "nvidia-nvswitch3: SXid (PCI:0000:08:00.0): 20034, Fatal, Link 28 LTSSM Fault Up\n"
    )
    fakes = {"nvidia-smi": {"file": "nvidia-smi-p5.csv"}, "journalctl": {"out": kernel}}
    config = {**GPU, "fatal_xids": [46, *GPU["fatal_xids"]], "nvswitch": True}
    _, updates, _ = health(config, fakes)
    assert drain_of(updates) == (
        "clusterbake-health: Xid 46 on PCI:0000:53:00 (GPU stopped processing); "
        "fatal SXid 20034 on NVSwitch PCI:0000:08:00.0"
    )


def test_the_checks_run_side_by_side_and_end_by_the_deadline(health):
    """Hardware review item 19: checks ran one after another with 20 s command timeouts, past Slurm's 60 s
    for HealthCheckProgram. Two checks that take 5 s each both finish within a deadline of 8 s (one after
    the other they could not), and a hung one is reported at the deadline instead of holding the run."""
    slow = {"nvidia-smi": {"sleep": 5, "file": "nvidia-smi-p5.csv"}, "journalctl": {"sleep": 5, "out": ""}}
    result, updates, _ = health(GPU, slow, env={"CLUSTERBAKE_HEALTH_DEADLINE": "8"})
    assert (result.returncode, updates) == (0, []), result.stdout
    hung = {"nvidia-smi": {"sleep": 12, "file": "nvidia-smi-p5.csv"}}
    result, updates, _ = health(GPU, hung, env={"CLUSTERBAKE_HEALTH_DEADLINE": "8"})
    assert drain_of(updates) == "clusterbake-health: no answer within 8 s"
    assert "FAIL gpus: no answer within 8 s" in result.stdout and "ok   munge" in result.stdout


def test_placeholder_gpus_are_not_checked(health):
    result, _, calls = health({"gpus": 0})
    assert result.returncode == 0
    assert not [call for call in calls if call.startswith("nvidia-smi")]


def test_fabric_manager_down_on_an_nvswitch_system(health):
    fakes = {"nvidia-smi": {"file": "nvidia-smi-p5.csv"}, "systemctl is-active --quiet nvidia-fabricmanager": {"rc": 3}}
    _, updates, _ = health({**GPU, "nvswitch": True}, fakes)
    assert "nvidia-fabricmanager is not running" in drain_of(updates)


@pytest.mark.parametrize(
    ("config", "fakes", "reason"),
    [
        ({"efa": True, "efa_devices": 2}, {"fi_info": {"file": "fi_info-efa-p5.txt"}}, None),
        (
            {"efa": True, "efa_devices": 32},
            {"fi_info": {"file": "fi_info-efa-p5.txt"}},
            "2 of 32 EFA devices (fi_info -p efa)",
        ),
        (
            {"efa": True},
            {"fi_info": {"rc": 1, "file": "fi_info-no-efa.txt"}},
            "no EFA device (fi_info -p efa: fi_getinfo: -61 (No data available))",
        ),
        ({"infiniband": {"min_rate": 400, "ports": 8}}, {"ibstat": {"file": "ibstat-ndv5.txt"}}, None),
        (
            {"infiniband": {"min_rate": 400, "ports": 8}},
            {"ibstat": {"file": "ibstat-ndv5-link-down.txt"}},
            "mlx5_ib5 port 1 is Down/Polling",
        ),
        (
            {"infiniband": {"min_rate": 400}},
            {"ibstat": {"rc": 127, "out": "ibstat: not found"}},
            "ibstat failed: ibstat: not found",
        ),
    ],
    ids=["efa-ok", "efa-missing-devices", "no-efa", "ib-ok", "ib-link-down", "no-ibstat"],
)
def test_fabric_checks_from_recorded_outputs(health, config, fakes, reason):
    result, updates, _ = health(config, fakes)
    if reason is None:
        assert (result.returncode, updates) == (0, []), result.stdout
    else:
        assert drain_of(updates) == f"clusterbake-health: {reason}"


def test_a_node_the_checks_drained_is_resumed_once_healthy(health):
    result, updates, _ = health({}, {"scontrol show node": {"out": DRAINED_BY_US}})
    assert result.returncode == 0
    assert updates == ["scontrol update NodeName=cpu-1 State=RESUME"]
    assert "resume cpu-1: every check passes (was: clusterbake-health: /x is not mounted)" in result.stderr


def test_a_node_a_person_drained_is_left_alone(health):
    _, healthy, _ = health({}, {"scontrol show node": {"out": DRAINED_BY_A_PERSON}})
    result, failing, _ = health({"mounts": ["/no-such-mount"]}, {"scontrol show node": {"out": DRAINED_BY_A_PERSON}})
    assert (healthy, failing) == ([], [])
    assert "is drained already (disk swap on Monday): left alone" in result.stderr


def test_the_same_problem_is_not_drained_twice(health):
    show = "NodeName=cpu-1 State=IDLE+DRAIN Reason=clusterbake-health: /no-such-mount is not mounted [root@2026-12-01T21:05:00]\n"  # noqa: E501
    _, updates, _ = health({"mounts": ["/no-such-mount"]}, {"scontrol show node": {"out": show}})
    assert updates == []


def test_report_drains_nothing(health):
    result, updates, _ = health({"mounts": ["/no-such-mount"]}, args=["--report"])
    assert (result.returncode, updates) == (1, [])
    assert "FAIL mounts: /no-such-mount is not mounted" in result.stdout


def test_the_timer_runs_the_checks_only_when_due(health):
    first, _, calls = health({"interval": 3600}, args=["--if-due"])
    second, _, again = health({"interval": 3600}, args=["--if-due"])
    assert first.returncode == second.returncode == 0
    assert any(call.startswith("unmunge") for call in calls)
    assert again == []  # not due: nothing run


DCGM = {"gpus": 8, "dcgm": {"level": 1, "timeout": 2}}


def test_the_prolog_diagnoses_gpu_jobs_and_drains_for_a_person(health):
    fakes = {"dcgmi": {"rc": 226, "file": "dcgmi-diag-r1-row-remap-fail.txt"}}
    result, updates, calls = health(DCGM, fakes, env={"SLURM_JOB_GPUS": "0,1", "SLURM_JOB_ID": "42"}, as_prolog=True)
    assert result.returncode == 1  # Slurm requeues the job elsewhere
    # The job's GPUs only, not another job's on the same node (hardware review item 10).
    assert "dcgmi diag -r 1 -i 0,1" in calls
    assert drain_of(updates) == (
        "clusterbake-dcgm: dcgmi diag -r 1 -i 0,1 before job 42: Page Retirement/Row Remap (run dcgmi diag -r 3, "
        "then scontrol update NodeName=<node> State=RESUME)"
    )


def test_the_prolog_passes_a_healthy_diagnostic_and_skips_jobs_without_gpus(health):
    fakes = {"dcgmi": {"file": "dcgmi-diag-r1-pass.txt"}}
    passed, updates, calls = health(DCGM, fakes, env={"SLURM_JOB_GPUS": "0"}, as_prolog=True)
    skipped, _, none = health(DCGM, fakes, env={"SLURM_JOB_GPUS": ""}, as_prolog=True)
    assert (passed.returncode, updates, skipped.returncode) == (0, [], 0)
    assert "dcgmi diag -r 1 -i 0" in calls and none == []


def test_a_diagnostic_that_hangs_fails_at_its_timeout(health):
    fakes = {"dcgmi": {"sleep": 10, "file": "dcgmi-diag-r1-pass.txt"}}
    result, updates, _ = health(DCGM, fakes, env={"SLURM_JOB_GPUS": "0", "SLURM_JOB_ID": "7"}, as_prolog=True)
    assert result.returncode == 1
    assert "dcgmi: no answer within 2 s" in drain_of(updates)
