"""Shared start of the inventory scripts: find the clusterbake package, then answer
Ansible's --list / --host for one provider. Not an inventory itself."""

import json
import os
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def run(provider: str) -> int:
    try:
        from clusterbake.inventory_script import main
    except ImportError:
        # Not run from the project's venv: use it if it exists.
        venv_python = REPO / ".venv" / "bin" / "python"
        # Not resolved paths: the venv's python is a link to the very interpreter it runs.
        if venv_python.exists() and sys.prefix == sys.base_prefix:
            os.execv(str(venv_python), [str(venv_python), sys.argv[0], *sys.argv[1:]])
        sys.path.insert(0, str(REPO / "src"))
        from clusterbake.inventory_script import main
    return main(provider, sys.argv[1:], default_config=REPO / "clusterbake.yaml", dump=json.dumps)
