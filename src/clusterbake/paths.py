"""Where the repository's playbooks, roles and templates are; named paths below a directory."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path


def repo_root() -> Path:
    override = os.environ.get("CLUSTERBAKE_HOME")
    if override:
        return Path(override)
    # src/clusterbake/paths.py -> the checkout (installed editable by `make venv`)
    return Path(__file__).resolve().parents[2]


def git_revision() -> str:
    try:
        rev = subprocess.run(
            ["git", "-C", str(repo_root()), "rev-parse", "--short=10", "HEAD"],
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
    except (subprocess.CalledProcessError, FileNotFoundError):
        return "nogit"
    return rev or "nogit"


def below(*parts: str, base: str = "root") -> property:
    """A read-only property: the path `parts` below the instance's directory attribute `base`
    (StateDir, ClusterDir, MachinePaths declare their files this way)."""

    def path(self) -> Path:
        return getattr(self, base).joinpath(*parts)

    return property(path, doc="/".join(parts))
