#!/usr/bin/env python3
"""Ansible dynamic inventory of an AWS clusterbake cluster (running instances only).

    CLUSTERBAKE_CONFIG=examples/aws-p5.yaml ansible-inventory -i inventories/aws_ec2.py --graph
    CLUSTERBAKE_CONFIG=path/to/cluster.yaml inventories/aws_ec2.py --list

Instances are found by the tag clusterbake:cluster (CLUSTERBAKE_CLUSTER, else the
config's cluster_name) and named by their clusterbake:name tag. AWS credentials,
profile and endpoint come from the standard environment (AWS_PROFILE, ...).
Shape: docs/architecture.md (the same as inventories/local.py).
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
    sys.exit(main("aws", sys.argv[1:], default_config=REPO / "clusterbake.yaml", dump=json.dumps))
