#!/usr/bin/env python3
"""Ansible dynamic inventory of a local clusterbake cluster (running nodes only).

    ansible-inventory -i inventories/local.py --graph
    CLUSTERBAKE_CONFIG=path/to/cluster.yaml inventories/local.py --list

Shape: docs/architecture.md (the AWS and Azure inventories emit the same).
"""

import json
import os
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]

try:
    from clusterbake.inventory_script import main
except ImportError:
    # Not run from the project's venv: use it if it exists.
    venv_python = REPO / ".venv" / "bin" / "python"
    if venv_python.exists() and Path(sys.executable).resolve() != venv_python.resolve():
        os.execv(str(venv_python), [str(venv_python), __file__, *sys.argv[1:]])
    sys.path.insert(0, str(REPO / "src"))
    from clusterbake.inventory_script import main

if __name__ == "__main__":
    sys.exit(main("local", sys.argv[1:], default_config=REPO / "clusterbake.yaml", dump=json.dumps))
