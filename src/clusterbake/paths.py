"""Where the repository's playbooks, roles and templates are."""

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
