"""A thin wrapper around the `packer` binary (the python-packer package is broken
with any Packer >= 1.5). Reads `-machine-readable` output for progress and artifacts.

Also what the cloud builders share about Packer versions (packer/README.md): cloud
builds need Packer >= 1.10 with the plugins (`packer init packer/plugins`), and
the template staged with packer/plugins/required_plugins.pkr.hcl, which Debian's
Packer 1.6.6 rejects (it only validates the templates).
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from dataclasses import dataclass, field
from pathlib import Path

from clusterbake.errors import ClusterbakeError, CommandFailed
from clusterbake.paths import repo_root
from clusterbake.progress import phase, run_logged, say

# Packer >= 1.7 has `packer init` and required_plugins; 1.10 dropped the bundled
# amazon, azure and ansible plugins, so from there the plugins are a must.
PLUGIN_PACKER = (1, 7, 0)
BUILD_PACKER = (1, 10, 0)
# Where a template takes its plugin-only settings (packer/plugins/<source type>.plugin-settings.hcl).
MARKER = "# clusterbake:plugin-settings"
# The cloud images' templates: their one build (cloud.pkr.hcl) names both sources.
CLOUD_TEMPLATES = ("aws.pkr.hcl", "azure.pkr.hcl", "cloud.pkr.hcl")


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


# --- Packer versions and plugin builds (the cloud builders) -----------------------------------


def parse_version(text: str) -> tuple[int, ...]:
    match = re.search(r"(\d+)\.(\d+)\.(\d+)", text)
    if not match:
        raise ClusterbakeError(f"cannot read a Packer version from {text!r}")
    return tuple(int(part) for part in match.groups())


def plugin_mode(version: str | None = None) -> bool:
    """Whether this Packer takes required_plugins (and so the staged templates)."""
    return parse_version(version or packer_version()) >= PLUGIN_PACKER


def require_plugin_packer(what: str, why: str) -> str:
    """The Packer version, if it can build `what` (>= 1.10 with plugins); else a ClusterbakeError."""
    version = packer_version()
    if parse_version(version) < BUILD_PACKER:
        raise ClusterbakeError(
            f"{what} builds need Packer >= {'.'.join(map(str, BUILD_PACKER))} with the plugins "
            f"(this is {version}): {why}. Install Packer from HashiCorp, then `packer init packer/plugins`; "
            "see packer/README.md"
        )
    return version


def init_plugins(log_file: Path, root: Path | None = None) -> None:
    """`packer init packer/plugins`: installs the plugins required_plugins.pkr.hcl pins."""
    root = root or repo_root()
    with phase("packer init (plugins)"):
        run_logged([packer_binary(), "init", str(root / "packer/plugins")], log_file, what="packer init")


def stage_template(
    template: str, dest: Path | str, root: Path | None = None, plugin_settings: str | None = None
) -> Path:
    """A template directory for Packer >= 1.7: packer/<template> (with packer/plugins/<plugin_settings>
    inserted at its marker line, when given), the other cloud templates (the build of cloud.pkr.hcl
    names every cloud source), the shared variables (ansible.pkr.hcl) and the plugin requirements.
    Paths in it point back to the checkout (var.repo_root)."""
    root = root or repo_root()
    dest = Path(dest)
    dest.mkdir(parents=True, exist_ok=True)
    text = (root / "packer" / template).read_text()
    if plugin_settings:
        settings = (root / "packer/plugins" / plugin_settings).read_text()
        lines = text.splitlines(keepends=True)
        marked = [i for i, line in enumerate(lines) if line.strip().startswith(MARKER)]
        if len(marked) != 1:
            raise ClusterbakeError(f"packer/{template} must hold the line '{MARKER}' once, found {len(marked)}")
        lines[marked[0] : marked[0] + 1] = [settings if settings.endswith("\n") else settings + "\n"]
        text = "".join(lines)
    (dest / template).write_text(text)
    for other in CLOUD_TEMPLATES:
        if other != template:
            shutil.copyfile(root / "packer" / other, dest / other)
    shutil.copyfile(root / "packer/ansible.pkr.hcl", dest / "ansible.pkr.hcl")
    shutil.copyfile(root / "packer/plugins/required_plugins.pkr.hcl", dest / "required_plugins.pkr.hcl")
    return dest
