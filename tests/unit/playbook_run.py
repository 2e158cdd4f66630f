"""Running a test playbook with ansible-playbook: the environment every such test uses."""

from __future__ import annotations

import os
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
PLAYBOOKS = REPO / "tests" / "playbooks"
ANSIBLE_PLAYBOOK = Path(sys.executable).with_name("ansible-playbook")


def playbook_env(tmp: Path, fake_bin: Path, record: Path, **extra: str) -> dict[str, str]:
    """The project's ansible.cfg, the recording callback (writes `record`), temp dirs under tmp,
    and fake_bin first on PATH (stand-ins for tools the host lacks)."""
    return {
        **os.environ,
        "PATH": f"{fake_bin}:{ANSIBLE_PLAYBOOK.parent}:{os.environ.get('PATH', '/usr/bin:/bin')}",
        "ANSIBLE_CONFIG": str(REPO / "ansible" / "ansible.cfg"),
        "ANSIBLE_CALLBACK_PLUGINS": str(PLAYBOOKS / "callback_plugins"),
        "ANSIBLE_CALLBACKS_ENABLED": "clusterbake_record",
        "ANSIBLE_LOCAL_TEMP": str(tmp / "local"),
        "ANSIBLE_REMOTE_TEMP": str(tmp / "remote"),
        "ANSIBLE_NOCOLOR": "1",
        "CLUSTERBAKE_RECORD_FILE": str(record),
        **extra,
    }


def run_playbook(playbook: str, inventory: Path, env: dict[str, str], *options: str):
    """ansible-playbook on a test playbook (tests/playbooks/<playbook>); fails the test on failure."""
    import subprocess

    proc = subprocess.run(
        [str(ANSIBLE_PLAYBOOK), *options, "-i", str(inventory), str(PLAYBOOKS / playbook)],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stdout[-6000:] + proc.stderr[-3000:]
    return proc
