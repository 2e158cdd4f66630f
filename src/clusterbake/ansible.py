"""Run ansible-playbook as a subprocess: task names as progress, full output to a log."""

from __future__ import annotations

import os
import re
import sys
from dataclasses import dataclass, field
from pathlib import Path

from clusterbake.paths import repo_root
from clusterbake.progress import run_logged, say

_RECAP = re.compile(
    r"^(?P<host>\S+)\s+:\s+ok=(?P<ok>\d+)\s+changed=(?P<changed>\d+)\s+unreachable=(?P<unreachable>\d+)"
    r"\s+failed=(?P<failed>\d+)"
)
_TASK = re.compile(r"^(TASK|PLAY|RUNNING HANDLER) \[(.+?)\]")


@dataclass
class PlaybookResult:
    recap: dict[str, dict[str, int]] = field(default_factory=dict)

    @property
    def changed(self) -> int:
        return sum(host["changed"] for host in self.recap.values())

    @property
    def ok(self) -> int:
        return sum(host["ok"] for host in self.recap.values())


def parse_recap(lines: list[str]) -> dict[str, dict[str, int]]:
    recap = {}
    for line in lines:
        match = _RECAP.match(line)
        if match:
            recap[match["host"]] = {k: int(v) for k, v in match.groupdict().items() if k != "host"}
    return recap


def ansible_env(config_path: Path, state_dir: Path) -> dict[str, str]:
    bin_dir = str(Path(sys.executable).parent)
    return {
        **os.environ,
        "PATH": f"{bin_dir}:{os.environ.get('PATH', '')}",
        "ANSIBLE_CONFIG": str(repo_root() / "ansible" / "ansible.cfg"),
        "ANSIBLE_FORCE_COLOR": "0",
        "ANSIBLE_NOCOLOR": "1",
        "CLUSTERBAKE_CONFIG": str(config_path.resolve()),
        "CLUSTERBAKE_STATE_DIR": str(state_dir),
    }


def run_playbook(
    playbook: str,
    inventory: Path,
    log_file: Path,
    env: dict[str, str],
    extra_args: list[str] | None = None,
) -> PlaybookResult:
    argv = [
        str(Path(sys.executable).with_name("ansible-playbook")),
        "-i",
        str(inventory),
        str(repo_root() / "ansible" / playbook),
        *(extra_args or []),
    ]

    def on_line(line: str) -> None:
        match = _TASK.match(line)
        if match:
            say(f"    {match.group(1).lower()}: {match.group(2)}")

    lines = run_logged(argv, log_file, env=env, on_line=on_line, what=f"ansible-playbook {playbook}")
    return PlaybookResult(parse_recap(lines))
