"""ansible/tasks/kernel_pin.yml, which cloud images run (hardware review item 8: unattended upgrades
stayed on, so a kernel update left the DKMS and Lustre modules behind at the next boot), in check
mode on this machine: nothing on the host changes."""

from __future__ import annotations

import json
import platform
import subprocess

import pytest
from playbook_run import ANSIBLE_PLAYBOOK, PLAYBOOKS, playbook_env


def _run(tmp_path, series: str) -> tuple[subprocess.CompletedProcess, list[dict]]:
    if not ANSIBLE_PLAYBOOK.exists():
        pytest.fail("ansible-playbook is not in the venv (make venv)")
    record = tmp_path / "record.json"
    env = playbook_env(tmp_path, PLAYBOOKS / "fakebin-kernel", record)
    proc = subprocess.run(
        [str(ANSIBLE_PLAYBOOK), "--check", "--diff", "-i", str(PLAYBOOKS / "inventory.yml"),
         "-e", f"kernel_pin_series={series}", str(PLAYBOOKS / "kernel_pin.yml")],
        env=env, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    return proc, json.loads(record.read_text()) if record.exists() else []


def _task(records: list[dict], name: str) -> dict:
    (found,) = [r for r in records if r["task"].endswith(name)]
    return found


def test_unattended_upgrades_are_masked_and_the_kernel_packages_held(tmp_path):
    series = ".".join(platform.release().split(".")[:2])
    proc, records = _run(tmp_path, series)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-2000:]
    masked = _task(records, "Mask unattended upgrades and APT's daily timers")["result"]["results"]
    assert [(r["item"], r["src"], r["diff"]["after"]["state"]) for r in masked] == [
        ("unattended-upgrades.service", "/dev/null", "link"),
        ("apt-daily.timer", "/dev/null", "link"),
        ("apt-daily-upgrade.timer", "/dev/null", "link"),
    ]
    periodic = _task(records, "Turn APT's periodic updates and upgrades off")["result"]["diff"]
    after = (periodic[0] if isinstance(periodic, list) else periodic)["after"]
    assert 'APT::Periodic::Unattended-Upgrade "0";' in after and 'Update-Package-Lists "0";' in after
    held = _task(records, "Hold the kernel packages")["result"]["results"]
    assert sorted(r["item"] for r in held) == [
        "linux-aws",
        "linux-headers-6.17.0-1008-aws",
        "linux-headers-aws",
        "linux-image-6.17.0-1008-aws",
        "linux-image-aws",
        "linux-modules-6.17.0-1008-aws",
    ]  # not linux-base or linux-libc-dev, nor a removed kernel (rc)


def test_a_base_image_of_another_kernel_series_stops_the_build(tmp_path):
    proc, records = _run(tmp_path, "5.4")
    assert proc.returncode != 0
    check = _task(records, "Check that the base image boots the manifest's kernel series")
    assert check["status"] == "failed"
    assert f"The base image boots kernel {platform.release()}, not of series 5.4" in check["result"]["msg"]
    assert not [r for r in records if r["task"].endswith("Hold the kernel packages")]
