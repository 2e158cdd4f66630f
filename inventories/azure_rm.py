#!/usr/bin/env python3
"""Ansible dynamic inventory of an Azure clusterbake cluster.

    CLUSTERBAKE_CONFIG=examples/azure-ndv5.yaml ansible-inventory -i inventories/azure_rm.py --graph
    CLUSTERBAKE_CONFIG=path/to/cluster.yaml inventories/azure_rm.py --list

VMs are found by the tag clusterbake-cluster (CLUSTERBAKE_CLUSTER, else the config's
cluster_name) in azure.resource_group (a paged listing) and named by their
clusterbake-name tag; each one's power state comes from its instance view. Credentials
and endpoint come from the standard environment (AZURE_CLIENT_ID, ..., a managed identity
or `az login`; AZURE_RESOURCE_MANAGER_ENDPOINT for another ARM endpoint).
Shape: docs/architecture.md (the same as inventories/local.py and aws_ec2.py), plus group
`ib` (nodes of a group on one InfiniBand fabric: an RDMA size, infiniband not false).
"""

import os
import sys
from pathlib import Path

VENV_PYTHON = Path(__file__).resolve().parents[1] / ".venv" / "bin" / "python"

if __name__ == "__main__":
    # Outside a virtual environment, use the project's (the Azure SDK is installed there). Not by
    # comparing resolved paths: a venv's python is a symlink to the very interpreter it runs on.
    if sys.prefix == sys.base_prefix and VENV_PYTHON.exists():
        os.execv(str(VENV_PYTHON), [str(VENV_PYTHON), __file__, *sys.argv[1:]])
    from _bootstrap import run

    sys.exit(run("azure"))
