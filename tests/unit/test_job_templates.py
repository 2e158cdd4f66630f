"""The job templates' own shell logic, run by bash with stand-ins for srun, scontrol and the training.

What Slurm does is tested on real clusters (tests/integration); here only what the
templates decide: requeue or not after a checkpoint request, the exit status they
pass on, and the arguments they hand to srun.
"""

from __future__ import annotations

import json
import os
import pwd
import signal
import subprocess
import time
from pathlib import Path

import pytest

from clusterbake.job_report import EVENT_PREFIX, detect_transport

REPO = Path(__file__).resolve().parents[2]
JOBS = REPO / "scripts" / "jobs"

SRUN = """#!/bin/bash
echo "srun $*" >> "$STUB_LOG"
while [ $# -gt 0 ] && [ "${1#-}" != "$1" ]; do shift; done
exec "$@"
"""
SCONTROL = """#!/bin/bash
echo "scontrol $*" >> "$STUB_LOG"
[ "$1" = show ] && echo node-1
exit 0
"""
# The training: `finish` ends normally without looking at the request; `checkpoint`
# waits for the request, consumes it (as examples/deepspeed/train.py does) and stops.
TRAINING = """#!/bin/bash
request="$CLUSTERBAKE_CHECKPOINT_DIR/CHECKPOINT_REQUESTED"
case "$STUB_MODE" in
  finish) sleep 1.5; exit 0 ;;
  save) mkdir -p "$CLUSTERBAKE_CHECKPOINT_DIR/step5" && echo weights > "$CLUSTERBAKE_CHECKPOINT_DIR/step5/model.pt" \
        && echo step5 > "$CLUSTERBAKE_CHECKPOINT_DIR/latest"; sleep 0.3; exit 0 ;;
  resume) cat "$CLUSTERBAKE_CHECKPOINT_DIR/latest" "$CLUSTERBAKE_CHECKPOINT_DIR/step5/model.pt"; exit 0 ;;
  checkpoint) for _ in $(seq 100); do [ -e "$request" ] && rm -f "$request" && exit 0; sleep 0.05; done; exit 9 ;;
esac
"""


@pytest.fixture
def stubs(tmp_path):
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for name, text in (("srun", SRUN), ("scontrol", SCONTROL), ("torchrun-node", TRAINING)):
        (bin_dir / name).write_text(text)
        (bin_dir / name).chmod(0o755)
    # The jobs directory: the stand-ins, and the real gpu-check (a node without GPUs here),
    # container-args (no container asked) and checkpoint-copy.
    for real in ("gpu-check", "container-args", "checkpoint-copy"):
        (bin_dir / real).write_text((JOBS / real).read_text())
        (bin_dir / real).chmod(0o755)
    return tmp_path


def run_template(stubs: Path, mode: str, usr1_after: float | None, **extra: str) -> tuple[int, str, str]:
    log = stubs / "stub.log"
    env = {
        **os.environ,
        "PATH": f"{stubs / 'bin'}:{os.environ['PATH']}",
        "STUB_LOG": str(log),
        "STUB_MODE": mode,
        "CLUSTERBAKE_JOBS_DIR": str(stubs / "bin"),
        "CLUSTERBAKE_CHECKPOINT_DIR": str(stubs / "ckpt"),
        "SLURM_JOB_ID": "42",
        "SLURM_JOB_NAME": "t",
        "SLURM_JOB_NODELIST": "node-1",
        "SLURM_NNODES": "1",
        **extra,
    }
    process = subprocess.Popen(
        ["bash", str(JOBS / "deepspeed.sbatch"), "train.py"], env=env, stdout=subprocess.PIPE, text=True
    )
    if usr1_after is not None:
        time.sleep(usr1_after)
        process.send_signal(signal.SIGUSR1)  # what Slurm's --signal=B:USR1@120 sends the batch shell
    out, _ = process.communicate(timeout=30)
    return process.returncode, out, log.read_text() if log.exists() else ""


def test_a_training_that_finished_before_the_request_is_not_requeued(stubs):
    status, out, calls = run_template(stubs, "finish", usr1_after=0.5)
    assert status == 0, out  # not 138, the status of the interrupted wait
    assert "scontrol requeue" not in calls
    assert "not requeueing" in out
    assert not (stubs / "ckpt" / "CHECKPOINT_REQUESTED").exists()


def test_a_training_that_checkpointed_for_the_request_is_requeued(stubs):
    status, out, calls = run_template(stubs, "checkpoint", usr1_after=0.5)
    assert status == 0, out
    assert "scontrol requeue 42" in calls


def test_no_signal_no_requeue(stubs):
    status, _, calls = run_template(stubs, "finish", usr1_after=None)
    assert status == 0 and "scontrol requeue" not in calls


def test_each_checkpoint_is_copied_to_durable_storage_before_the_job_ends(stubs):
    durable = stubs / "durable" / "t"
    status, out, _ = run_template(stubs, "save", usr1_after=None, CLUSTERBAKE_CHECKPOINT_COPY=str(durable))
    assert status == 0, out
    assert f"checkpoint copies in {durable}" in out
    assert (durable / "latest").read_text() == "step5\n"
    assert (durable / "step5" / "model.pt").read_text() == "weights\n"


def test_a_run_without_its_checkpoint_directory_restores_from_the_copy(stubs):
    durable = stubs / "durable" / "t"
    (durable / "step5").mkdir(parents=True)
    (durable / "step5" / "model.pt").write_text("weights\n")
    (durable / "latest").write_text("step5\n")
    status, out, _ = run_template(stubs, "resume", usr1_after=None, CLUSTERBAKE_CHECKPOINT_COPY=str(durable))
    assert status == 0, out
    assert "step5\nweights\n" in out  # the training found the checkpoint in its directory


def test_the_copy_root_comes_from_the_nodes_settings_plus_the_user_and_the_job_name(stubs, tmp_path):
    settings = tmp_path / "checkpoints.env"
    settings.write_text(f"CLUSTERBAKE_CHECKPOINT_COPY_ROOT={tmp_path / 'root'}/\n")
    script = (JOBS / "deepspeed.sbatch").read_text().replace("/etc/clusterbake/checkpoints.env", str(settings))
    (stubs / "bin" / "job.sbatch").write_text(script)
    env = {**os.environ, "PATH": f"{stubs / 'bin'}:{os.environ['PATH']}", "STUB_LOG": str(stubs / "log"),
           "STUB_MODE": "save", "CLUSTERBAKE_JOBS_DIR": str(stubs / "bin"), "SLURM_JOB_ID": "1",
           "SLURM_JOB_NAME": "named", "CLUSTERBAKE_CHECKPOINT_DIR": str(stubs / "ckpt"),
           "SLURM_JOB_NODELIST": "node-1", "SLURM_NNODES": "1"}  # fmt: skip
    subprocess.run(["bash", str(stubs / "bin" / "job.sbatch"), "train.py"], env=env, check=True, capture_output=True)
    # A prefix per user: another user's copies are never what a restore reads.
    user = pwd.getpwuid(os.getuid()).pw_name
    assert (tmp_path / "root" / user / "named" / "latest").read_text() == "step5\n"


def test_nccl_tests_passes_its_default_arguments_as_separate_words(tmp_path):
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "srun").write_text(
        '#!/bin/bash\nfor a in "$@"; do printf "<%s>" "$a" >> "$STUB_LOG"; done\necho >> "$STUB_LOG"\n'
    )
    (bin_dir / "srun").chmod(0o755)
    tests = tmp_path / "all_reduce_perf"
    tests.write_text("#!/bin/sh\n")
    tests.chmod(0o755)
    env = {
        **os.environ,
        "PATH": f"{bin_dir}:{os.environ['PATH']}",
        "STUB_LOG": str(tmp_path / "log"),
        "NCCL_TESTS": str(tests),
        "SLURM_GPUS_ON_NODE": "8",
        "SLURM_NNODES": "2",
    }
    subprocess.run(["bash", str(JOBS / "nccl-tests.sbatch")], env=env, check=True, capture_output=True)
    srun = (tmp_path / "log").read_text().strip()
    assert srun.endswith(f"<{tests}><-b><8><-e><8G><-f><2><-g><1>")
    # Every rank sees all of the node's GPUs (NVLink found), none is bound to one (hardware review item 9).
    assert "<--ntasks-per-node=8><--gpus-per-node=8><--gpu-bind=none>" in srun and "gpus-per-task" not in srun


# A 22.05 slurmctld's `scontrol show job` lines (TRES: with accounting of gres/gpu an --exclusive job's TRES
# counts the node's GPUs, asked for or not).
GPU_SCONTROL = """#!/bin/bash
case "$1 $2" in
  "show node") echo "   Gres=gpu:h100:8(S:0-1)" ;;
  "show job") echo "   TRES=cpu=192,mem=1900G,node=1,billing=192$TRES_GPUS"; [ -n "$ASKED" ] && echo "   $ASKED" ;;
esac
exit 0
"""


@pytest.mark.parametrize(
    "asked, tres_gpus, allowed",
    [
        ("", "", False),
        ("", ",gres/gpu=8", False),  # exclusive, no GPU asked: accounting's TRES is no request
        ("TresPerNode=gres:gpu:8", ",gres/gpu=8", True),
        ("TresPerJob=gres:gpu:16", ",gres/gpu=8", True),
        ("TresPerTask=gres:gpu:1", ",gres/gpu=8", True),
    ],
)
def test_a_gpu_nodes_job_must_ask_for_its_gpus(tmp_path, asked, tres_gpus, allowed):
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "scontrol").write_text(GPU_SCONTROL)
    (bin_dir / "scontrol").chmod(0o755)
    script = f". {JOBS / 'gpu-check'} || exit $?\necho allowed\n"
    env = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}", "SLURM_JOB_ID": "7", "ASKED": asked}
    env["TRES_GPUS"] = tres_gpus
    env["SLURM_GPUS_ON_NODE"] = "8"  # what the batch shell of an --exclusive job may see without GPUs
    result = subprocess.run(["bash", "-c", script], env=env, capture_output=True, text=True)
    if allowed:
        assert (result.returncode, result.stdout.strip()) == (0, "allowed")
    else:
        assert result.returncode == 2
        assert "has 8 GPUs but job 7 asked for none: submit with --gpus-per-node=8" in result.stderr


# torch as a driver it cannot use leaves it (device count 0; hardware review item 1), and as one that works.
FAKE_PYTHON = """#!/bin/bash
[ "$2" = "import torch; print(torch.cuda.device_count(), torch.version.cuda)" ] && echo "$TORCH_SEES"
"""


def _torchrun_node(tmp_path: Path, settings: dict[str, str]) -> subprocess.CompletedProcess:
    """torchrun-node of a one-node job, with fakes of torch (FAKE_PYTHON), nvidia-smi, torchrun and scontrol."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for name, text in (
        ("python3", FAKE_PYTHON),
        ("nvidia-smi", "#!/bin/sh\necho 570.172.08\n"),
        ("torchrun", "#!/bin/sh\necho torchrun started\n"),
        ("scontrol", "#!/bin/sh\necho node-1\n"),
    ):
        (bin_dir / name).write_text(text)
        (bin_dir / name).chmod(0o755)
    (tmp_path / "train.env").write_text(f"PATH={bin_dir}:$PATH\n")
    env = {
        **os.environ,
        "PATH": f"{bin_dir}:{os.environ['PATH']}",
        "CLUSTERBAKE_TRAIN_ENV": str(tmp_path / "train.env"),
        "SLURM_JOB_ID": "7",
        "SLURM_NNODES": "1",
        "SLURM_JOB_NODELIST": "node-1",
        **settings,
    }
    return subprocess.run([str(JOBS / "torchrun-node"), "train.py"], env=env, capture_output=True, text=True)


@pytest.mark.parametrize(
    "gpus, torch_sees, placeholder, allow, trains",
    [
        ("8", "0 13.0", False, "", False),  # R570 with a CUDA 13 torch: no device
        ("8", "Traceback: ImportError", False, "", False),  # no torch at all
        ("8", "8 13.0", False, "", True),
        ("0", "0 13.0", False, "", True),  # a CPU job on a CPU node
        ("8", "0 13.0", False, "1", True),  # CLUSTERBAKE_ALLOW_CPU=1
    ],
)
def test_a_job_given_gpus_that_torch_cannot_use_stops_instead_of_training_on_the_cpu(
    tmp_path, gpus, torch_sees, placeholder, allow, trains
):
    result = _torchrun_node(
        tmp_path, {"SLURM_GPUS_ON_NODE": gpus, "TORCH_SEES": torch_sees, "CLUSTERBAKE_ALLOW_CPU": allow}
    )
    if trains:
        assert (result.returncode, result.stdout.splitlines()[-1]) == (0, "torchrun started"), result.stderr
    else:
        assert result.returncode == 4, result.stdout + result.stderr
        assert f"gave this job {gpus} GPU(s), but torch finds none" in result.stderr
        assert "driver: 570.172.08" in result.stderr and "refusing to train on the CPU" in result.stderr
        assert "torchrun started" not in result.stdout


def test_the_log_of_every_template_names_the_nodes_fabric_so_the_report_catches_tcp_on_infiniband(tmp_path):
    """hello-distributed.sbatch printed no fabric: its gloo run over TCP on an `ib` node passed the job report
    unflagged (found on the Azure twin's InfiniBand example). torchrun-node, which every template runs,
    names it."""
    result = _torchrun_node(tmp_path, {"SLURM_GPUS_ON_NODE": "0", "TORCH_SEES": "0 13.0", "CLUSTERBAKE_FABRIC": "ib"})
    assert result.returncode == 0, result.stderr
    hello = {"event": "hello", "rank": 0, "world_size": 2, "ok": True, "backend": "gloo"}
    transport = detect_transport(result.stdout + f"{EVENT_PREFIX}{json.dumps(hello)}\n")
    assert (transport.fabric, transport.transport, transport.mismatch) == ("ib", "gloo-tcp", True)
