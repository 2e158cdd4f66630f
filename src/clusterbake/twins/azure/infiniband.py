"""The InfiniBand ports Azure's hardware gives a VM, as the twin's nodes show them.

A VM of an RdmaEnabled size has its size's HCAs (skus.INFINIBAND_PORTS: `mlx5_ib0`, ... as
Azure's HPC images name them, port 1 each, at the size's rate), Active/LinkUp unless a test
took the VM's links down through the twin's control socket (`PUT /vms/<name>/infiniband
{"state": "Down"}`: Down/Polling, as a link without a peer shows; `"Active"` brings them
back). The twin writes them into the node's disk (PORTS_FILE) before each boot and whenever
they change; the node's `ibstat` is the twins' stand-in (twins/ibstat_helper.py), which prints
them. The VM's fabric (`_ib_fabric`, vm_rules.py) is not shown on the node: ibstat on Azure
does not show it either (a VM alone has Active ports too, only no peer to reach).
"""

from __future__ import annotations

import json
from pathlib import Path

from clusterbake.twins.azure import skus

PORTS_FILE = "var/lib/clusterbake-twin/infiniband.json"  # under the node's root
LINK_STATES = {"Active": "LinkUp", "Down": "Polling"}  # state -> physical state


def ports(size: str, state: str = "Active") -> list[dict]:
    """The ports of a VM of `size` (none for a size without InfiniBand), all in `state`."""
    found = next((v for k, v in skus.INFINIBAND_PORTS.items() if k.lower() == size.lower()), None)
    if found is None:
        return []
    count, rate = found
    physical = LINK_STATES[state]
    return [
        {"ca": f"mlx5_ib{i}", "port": 1, "state": state, "physical_state": physical, "rate": rate, "lid": i + 1}
        for i in range(count)
    ]


def write(root: Path, found: list[dict]) -> bool:
    """The ports into a node's disk; False when they were there already."""
    target = root / PORTS_FILE
    text = json.dumps(found, indent=1) + "\n"
    if target.exists() and target.read_text() == text:
        return False
    target.parent.mkdir(parents=True, exist_ok=True)
    temporary = target.with_suffix(".tmp")
    temporary.write_text(text)
    temporary.replace(target)
    return True
