#!/usr/bin/env python3
"""Ansible dynamic inventory of a local clusterbake cluster (running nodes only).

    ansible-inventory -i inventories/local.py --graph
    CLUSTERBAKE_CONFIG=path/to/cluster.yaml inventories/local.py --list

Shape: docs/architecture.md (the AWS and Azure inventories emit the same).
"""

import sys

from _bootstrap import run

if __name__ == "__main__":
    sys.exit(run("local"))
