"""Placeholder GPUs on the local provider: GRES, gres.conf, GPU binding and one rank per GPU.

The nodes of tests/integration/gpu.yaml have 4 placeholder GPUs each: character
devices /dev/nvidia0..3 with NVIDIA's major number that no driver answers. Slurm
schedules, counts and binds them as it would real GPUs (gres.conf File= devices,
CUDA_VISIBLE_DEVICES), which is what these tests check; CUDA itself is not run.
"""

from __future__ import annotations

import re
import sys
import time

import pytest
from localtest import REPO, cb, on, run

sys.path.insert(0, str(REPO / "tests" / "unit"))
from test_aws_slurm_conf import as_template_input, p5_inventory
from test_slurm_conf import render
from timetable import boots_cluster

pytestmark = pytest.mark.integration
CONFIG = REPO / "tests" / "integration" / "gpu.yaml"


@pytest.fixture(scope="module")
@boots_cluster("local 1+2 placeholder GPUs (gpu.yaml)")
def gpus(image):
    run(["make", "cluster", f"CONFIG={CONFIG}"], timeout=600)
    yield
    run(["make", "destroy", f"CONFIG={CONFIG}"], timeout=300)


def head(command, **kwargs):
    return on("head", command, config=CONFIG, **kwargs)


def test_nodes_register_their_gpus_from_the_configless_gres_conf(gpus):
    assert "Gres=gpu:placeholder:4" in head("scontrol show node gpu-1").stdout
    assert head("sinfo --noheader --Node --format='%N %t %G'").stdout.split() == [
        "gpu-1", "idle", "gpu:placeholder:4", "gpu-2", "idle", "gpu:placeholder:4",
    ]  # fmt: skip
    served = on("gpu-2", "cat /var/spool/slurmd/conf-cache/gres.conf", config=CONFIG).stdout
    assert "NodeName=gpu-[1-2] Name=gpu Type=placeholder File=/dev/nvidia[0-3]" in served
    assert (
        on("gpu-2", "slurmd -G -f /var/spool/slurmd/conf-cache/slurm.conf", config=CONFIG).stderr.count(
            "Gres Name=gpu Type=placeholder Count=4"
        )
        == 1
    )


def test_a_step_sees_the_gpus_it_asked_for(gpus):
    result = head("srun -N1 -w gpu-1 --gpus-per-node=2 bash -c 'echo $CUDA_VISIBLE_DEVICES $SLURM_GPUS_ON_NODE'")
    assert result.stdout.split() == ["0,1", "2"]


def test_two_jobs_share_a_node_on_disjoint_gpus(gpus):
    # Each job writes when it started and ended: overlapping spans show they ran at the same time,
    # however long the scheduler took to start them (a fixed `sleep; squeue` raced it on a busy host).
    submit = (
        "sbatch --parsable -N1 -w gpu-2 --gpus-per-node=2 --mem=100M -o /shared/gpu-{n}.out --wrap '"
        "echo gpus=$CUDA_VISIBLE_DEVICES node=$SLURMD_NODENAME start=$(date +%s.%N); "
        "test -r /dev/nvidia3 && echo nvidia3=readable; sleep 8; echo end=$(date +%s.%N)'"
    )
    jobs = [head(submit.format(n=n)).stdout.strip() for n in (1, 2)]
    head(f"while squeue --noheader --jobs={','.join(jobs)} | grep -q .; do sleep 1; done", timeout=90)
    out = [head(f"cat /shared/gpu-{n}.out").stdout for n in (1, 2)]
    seen = [dict(w.split("=", 1) for w in text.split() if "=" in w) for text in out]
    assert sorted(s["gpus"] for s in seen) == ["0,1", "2,3"], seen
    assert [s["node"] for s in seen] == ["gpu-2", "gpu-2"], seen  # on one node
    assert max(float(s["start"]) for s in seen) < min(float(s["end"]) for s in seen), f"one after the other: {seen}"
    # What is enforced here: the allocation and CUDA_VISIBLE_DEVICES. Device access is not:
    # the nodes' cgroups are not Slurm's (docs/local-provider.md), so no ConstrainDevices.
    assert all(s.get("nvidia3") == "readable" for s in seen), seen


def test_sacct_records_the_gpus_of_each_job(gpus):
    """Accounting (on by default) tracks gres/gpu (AccountingStorageTRES): sacct shows what a job had."""
    job = head("sbatch --parsable --wait -N1 -w gpu-1 --gpus-per-node=3 --mem=100M -o /dev/null --wrap true").stdout
    fields = "NodeList,State,AllocTRES"

    def record():
        out = head(f"sacct -j {job.strip()} -X -n -P -o {fields}").stdout.strip()
        return dict(zip(fields.split(","), out.split("|"), strict=True)) if out else {}

    deadline = time.monotonic() + 30
    while record().get("State") != "COMPLETED" and time.monotonic() < deadline:
        time.sleep(1)
    assert record()["NodeList"] == "gpu-1" and record()["State"] == "COMPLETED", record()
    assert "gres/gpu=3" in record()["AllocTRES"].split(","), record()


def test_a_job_on_gpu_nodes_that_asks_for_no_gpu_is_refused(gpus):
    result = head(
        "cd /shared/jobs/researcher && runuser -u researcher -- sbatch --parsable --wait -N1 -o nogpu.out "
        "/opt/clusterbake/jobs/deepspeed.sbatch train.py; cat nogpu.out",
        check=False,
        timeout=120,
    )
    assert "has 4 GPUs but job" in result.stdout and "submit with --gpus-per-node=4" in result.stdout


def test_the_deepspeed_template_runs_one_rank_per_gpu(gpus):
    result = run(["make", "job", f"CONFIG={CONFIG}", "STEPS=4"], timeout=900)
    assert "nodes: gpu-1, gpu-2 (world size 8)" in result.stdout, result.stdout[-3000:]
    assert "4 GPUs per node" in result.stderr
    assert len(re.findall(r"gpu-\d: 4 rank\(s\), 1 thread\(s\) each, GPUs 0,1,2,3", result.stdout)) == 2


def test_the_p5_gres_conf_is_what_slurmd_reads(gpus, tmp_path):
    """slurmd -G parses examples/aws-p5.yaml's rendered slurm.conf and gres.conf on a node named gpu-1
    with eight GPU device files (four placeholders plus four made for this check)."""
    conf = {
        "slurm.conf": render("slurm.conf.j2", as_template_input(p5_inventory())),
        "gres.conf": render("gres.conf.j2", as_template_input(p5_inventory())),
    }
    node = "gpu-1"
    on(node, "mkdir -p /tmp/p5 && for i in 4 5 6 7; do mknod /dev/nvidia$i c 195 $i; done", config=CONFIG)
    try:
        for name, text in conf.items():
            cb("ssh", node, "--", f"cat > /tmp/p5/{name}", config=CONFIG, input=text)
        parsed = on(node, "slurmd -G -f /tmp/p5/slurm.conf", config=CONFIG).stderr
    finally:
        on(node, "rm -f /dev/nvidia4 /dev/nvidia5 /dev/nvidia6 /dev/nvidia7; rm -rf /tmp/p5", config=CONFIG)
    lines = [line for line in parsed.splitlines() if "Gres Name=gpu" in line]
    assert len(lines) == 1, parsed
    assert re.search(r"Gres Name=gpu Type=h100 Count=8 Index=0 ID=\d+ File=/dev/nvidia\[0-7\]", lines[0])
    assert "error" not in parsed.lower(), parsed
