"""A thin wrapper around the `packer` binary (the python-packer package is broken
with any Packer >= 1.5). Reads `-machine-readable` output for progress and artifacts.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from dataclasses import dataclass, field
from pathlib import Path

from clusterbake.errors import ClusterbakeError, CommandFailed
from clusterbake.progress import run_logged, say


@dataclass
class MachineReadableLine:
    timestamp: str
    target: str
    kind: str
    data: list[str]


def parse_machine_readable(line: str) -> MachineReadableLine | None:
    """`timestamp,target,type,data...`; commas inside data are escaped as %!(PACKER_COMMA)."""
    parts = line.split(",")
    if len(parts) < 3 or not parts[0].isdigit():
        return None
    data = [p.replace("%!(PACKER_COMMA)", ",").replace("\\n", "\n").replace("\\r", "\r") for p in parts[3:]]
    return MachineReadableLine(parts[0], parts[1], parts[2], data)


@dataclass
class BuildResult:
    artifacts: dict[str, dict[str, str]] = field(default_factory=dict)
    errors: list[str] = field(default_factory=list)


def packer_binary() -> str:
    binary = shutil.which("packer")
    if not binary:
        raise ClusterbakeError("packer is not installed; run `make image` (it installs it) or apt-get install packer")
    return binary


def packer_version() -> str:
    out = subprocess.run([packer_binary(), "version"], capture_output=True, text=True).stdout
    match = re.search(r"(\d+\.\d+\.\d+)", out)
    return match.group(1) if match else "unknown"


_ANSIBLE_PROGRESS = re.compile(r"(TASK|PLAY) \[(.+?)\]")


def build(
    template_dir: Path,
    variables: dict[str, str],
    log_file: Path,
    only: str | None = None,
    env: dict[str, str] | None = None,
) -> BuildResult:
    argv = [packer_binary(), "build", "-machine-readable", "-color=false", "-on-error=cleanup"]
    if only:
        argv.append(f"-only={only}")
    for key, value in sorted(variables.items()):
        argv.append(f"-var={key}={value}")
    argv.append(str(template_dir))
    result = BuildResult()

    def on_line(line: str) -> None:
        parsed = parse_machine_readable(line)
        if parsed is None:
            return
        if parsed.kind == "ui" and parsed.data and parsed.data[0] in ("say", "message", "error"):
            text = parsed.data[1] if len(parsed.data) > 1 else ""
            for chunk in text.splitlines():
                match = _ANSIBLE_PROGRESS.search(chunk)
                if match:
                    say(f"    {match.group(1).lower()}: {match.group(2)}")
                elif parsed.data[0] in ("say", "error"):
                    say(f"    {chunk.strip()}")
            if parsed.data[0] == "error" or "fatal:" in text or "[ERROR]" in text:
                result.errors.append(text)
        elif parsed.kind == "artifact" and len(parsed.data) >= 3:
            index, key, value = parsed.data[0], parsed.data[1], ",".join(parsed.data[2:])
            result.artifacts.setdefault(index, {})[key] = value

    try:
        run_logged(argv, log_file, env={**os.environ, **(env or {})}, on_line=on_line, what="packer build")
    except CommandFailed as exc:
        # The provisioner's own error is far above packer's closing lines.
        fatal = [e.strip() for e in result.errors if "fatal:" in e or "FAILED!" in e or "[ERROR]" in e]
        if fatal:
            raise CommandFailed(f"{exc}\nprovisioner errors:\n" + "\n".join(fatal[:5]), exc.log_file) from None
        raise
    return result
