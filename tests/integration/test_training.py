"""The researchers' path on a real cluster (the suite's shared one, tests/integration/cluster.yaml):
DeepSpeed across nodes with sbatch, checkpoint and requeue, clear failures, and a report that names
the transport."""

import json
import re
import time

import pytest
from localtest import CONFIG, REPO, cb, on, run

from clusterbake.job_report import events

TRAIN = ["deepspeed/train.py", "--deepspeed_config", "deepspeed/ds_config.json"]


def tcb(*args, **kwargs):
    return cb(*args, config=CONFIG, **kwargs)


def job_state(job_id: str) -> str:
    out = on("head", f"scontrol show job -o {job_id}", config=CONFIG, check=False).stdout
    match = re.search(r"JobState=(\S+)", out)
    return match.group(1) if match else "GONE"


def test_requeued_job_resumes_from_its_checkpoint(cluster):
    submitted = tcb(
        "job", "submit", "deepspeed", "--nodes", "2", "--upload", str(REPO / "examples/deepspeed"),
        "--job-name", "ci-requeue", "--", *TRAIN, "--steps", "30", "--checkpoint-every", "10",
    ).stdout  # fmt: skip
    job_id = re.search(r"submitted job (\d+)", submitted).group(1)
    output = f"/shared/jobs/researcher/ci-requeue-{job_id}.out"

    def first_checkpoint_written() -> bool:
        log = on("head", f"cat {output} 2>/dev/null || true", config=CONFIG).stdout
        return any(e["event"] == "checkpoint" for e in events(log))

    deadline = time.monotonic() + 300
    while not first_checkpoint_written():
        assert time.monotonic() < deadline, "no checkpoint within 300 s"
        assert job_state(job_id) in ("PENDING", "RUNNING", "CONFIGURING"), job_state(job_id)
        time.sleep(1)
    on("head", f"scontrol requeue {job_id}", config=CONFIG)
    deadline = time.monotonic() + 600
    while job_state(job_id) not in ("COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "GONE"):
        assert time.monotonic() < deadline, "requeued job did not finish"
        time.sleep(2)
    assert job_state(job_id) in ("COMPLETED", "GONE")
    log = on("head", f"cat {output}", config=CONFIG).stdout
    found = events(log)
    checkpoints = [e["step"] for e in found if e["event"] == "checkpoint"]
    resumed = next(e for e in found if e["event"] == "resumed")
    done = next(e for e in found if e["event"] == "done")
    assert resumed["step"] in checkpoints and resumed["step"] >= 10
    assert done["steps"] == 30
    # No more than one checkpoint interval redone: the last step before the requeue
    # is at most 10 past the checkpoint the job resumed from.
    first_run = log.split("(restart 1)")[0]
    last_step_before = max(e["step"] for e in events(first_run) if e["event"] == "step")
    assert last_step_before - resumed["step"] <= 10


def test_node_group_without_training_environment_fails_clearly(cluster):
    result = tcb(
        "job", "submit", "deepspeed", "--partition", "util", "--upload", str(REPO / "examples/deepspeed"),
        "--job-name", "ci-util", "--wait", "--", *TRAIN, "--steps", "5",
        check=False, timeout=300,
    )  # fmt: skip
    assert result.returncode != 0
    assert "no training environment on util-1" in result.stdout
    assert "lacks the train feature" in result.stdout


def test_bad_deepspeed_config_fails_clearly(cluster):
    on("head", "printf '{\"train_micro_batch_size_per_gpu\": ' > /shared/jobs/researcher/bad_ds.json", config=CONFIG)
    result = tcb(
        "job", "submit", "deepspeed", "--nodes", "2", "--job-name", "ci-badconfig", "--wait", "--",
        "deepspeed/train.py", "--deepspeed_config", "bad_ds.json", "--steps", "5",
        check=False, timeout=300,
    )  # fmt: skip
    assert result.returncode != 0
    assert "clusterbake: bad DeepSpeed config bad_ds.json" in result.stdout


def test_make_job_trains_across_two_nodes_reports_the_transport_and_fails_on_failure(cluster):
    """`make job`, the README's main job (`job submit deepspeed --wait` on every compute node): its
    summary, the job's own events and report, the checkpoint it leaves; non-zero when training fails.
    (One training for both `make job` and the example: each costs the suite a DeepSpeed start per rank.)"""
    ok = run(["make", "job", f"CONFIG={CONFIG}", "STEPS=12", "JOB_NAME=ci-make-job"], timeout=900)
    assert re.search(r"training: 12 steps, loss [\d.]+ -> [\d.]+, \d+ tokens/s", ok.stdout)
    # A progress line per step, not the JSON the job writes (its output file keeps that).
    assert re.search(r"^(\[rank\d+\]: )?step 12: loss [\d.]+, [\d,]+ tokens/s, [\d.]+ s/step$", ok.stdout, re.M)
    assert "CLUSTERBAKE_EVENT" not in ok.stdout
    assert "nodes: cpu-1, cpu-2" in ok.stdout and "checkpoint: /shared/checkpoints/researcher/ci-make-job/" in ok.stdout
    # The summary names the transport the collective library used.
    assert "transport: gloo over TCP" in ok.stdout
    assert "[fabric tcp]" in ok.stdout
    submitted = re.search(r"submitted job (\d+) \(output: (\S+)\)", ok.stdout)
    job_id, output = submitted.group(1), submitted.group(2)
    found = events(on("head", f"cat {output}", config=CONFIG).stdout)
    init = next(e for e in found if e["event"] == "init")
    done = next(e for e in found if e["event"] == "done")
    assert init["world_size"] == 2 and sorted(init["hosts"]) == ["cpu-1", "cpu-2"]
    assert done["steps"] == 12
    assert done["final_loss"] < done["first_loss"]
    report = json.loads(tcb("job", "report", job_id, "--json").stdout)
    assert report["transport"]["transport"] == "gloo-tcp" and not report["transport"]["mismatch"]
    assert report["training"]["completed"] and report["training"]["world_size"] == 2
    listing = on("cpu-1", "ls /shared/checkpoints/researcher/ci-make-job", config=CONFIG).stdout.split()
    assert listing.count("latest") == 1
    failed = run(["make", "job", f"CONFIG={CONFIG}", "STEPS=0", "JOB_NAME=ci-make-job-bad"], check=False, timeout=600)
    assert failed.returncode != 0


def test_hello_distributed_all_reduce(cluster):
    result = tcb("job", "submit", "hello-distributed", "--nodes", "2", "--wait", "--raw", timeout=300)
    hello = [e for e in events(result.stdout) if e["event"] == "hello"]
    assert len(hello) == 2 and all(e["ok"] and e["sum"] == 1.0 for e in hello)


def test_sweep_over_one_and_two_nodes_writes_its_table_and_plot(cluster, tmp_path):
    result = tcb("sweep", "--nodes", "1,2", "--steps", "6", "--out", str(tmp_path), timeout=900)
    rows = (tmp_path / "sweep.txt").read_text().splitlines()
    assert result.stdout.startswith("\n".join(rows))  # printed as written
    one, two = rows[1].split(), rows[2].split()
    assert one[:2] == ["1", "1"] and two[:2] == ["2", "2"]  # one rank per CPU-only node
    assert one[4:6] == ["1.00x", "100%"]
    assert two[4].endswith("x") and two[5].endswith("%")
    assert rows[3].startswith("note: local nodes share this one machine's CPUs")
    points = json.loads((tmp_path / "sweep.json").read_text())
    assert [(p["nodes"], p["state"]) for p in points] == [(1, "COMPLETED"), (2, "COMPLETED")]
    assert points[1]["efficiency"] == pytest.approx(points[1]["tokens_per_s"] / (2 * points[0]["tokens_per_s"]))
    assert (tmp_path / "sweep.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    outputs = sorted(p.name for p in tmp_path.glob("sweep-*.out"))
    assert len(outputs) == 2 and all("CLUSTERBAKE_EVENT" in (tmp_path / o).read_text() for o in outputs)
