"""roles/training_env/tasks/gpu_check.yml, which GPU image builds run (hardware review item 1: a torch
whose CUDA the driver cannot run finds no GPU, and every GPU job trained on the CPU). The venv's python
is a stand-in that answers `torch.__version__, torch.version.cuda, torch.cuda.device_count()`."""

from __future__ import annotations

import json
import subprocess

import pytest
from playbook_run import ANSIBLE_PLAYBOOK, PLAYBOOKS, playbook_env


@pytest.mark.parametrize(
    "answer, passes",
    [("2.13.0+cu130 13.0 8", True), ("2.13.0+cu130 13.0 0", False), ("", False)],
    ids=["eight-gpus", "driver-too-old", "no-torch"],
)
def test_the_build_stops_when_torch_finds_no_gpu(tmp_path, answer, passes):
    if not ANSIBLE_PLAYBOOK.exists():
        pytest.fail("ansible-playbook is not in the venv (make venv)")
    python = tmp_path / "venv" / "bin" / "python"
    python.parent.mkdir(parents=True)
    script = f"#!/bin/sh\necho '{answer}'\n" if answer else "#!/bin/sh\necho 'No module named torch' >&2\nexit 1\n"
    python.write_text(script)
    python.chmod(0o755)
    record = tmp_path / "record.json"
    proc = subprocess.run(
        [str(ANSIBLE_PLAYBOOK), "-i", str(PLAYBOOKS / "inventory.yml"), "-e",
         f"training_env_prefix={tmp_path / 'venv'}", str(PLAYBOOKS / "torch_gpu_check.yml")],
        env=playbook_env(tmp_path, tmp_path / "no-fakes", record), capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert (proc.returncode == 0) == passes, proc.stdout[-3000:]
    if not passes:
        (check,) = [
            r
            for r in json.loads(record.read_text())
            if r["task"].endswith("Check that torch sees the builder's GPUs (GPU builders)")
        ]
        assert "GPU jobs would train on the CPU" in check["result"]["msg"]
        assert "clusterbake image versions" in check["result"]["msg"]
