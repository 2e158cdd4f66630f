"""The ARM twin (src/clusterbake/twins/azure/arm.py) as the node-less Azure tests run it: the same
server, and each VM's serial console (what boot diagnostics' log returns) from $ARM_TWIN_CONSOLE_DIR
as the tests write it, as the EC2 tests' moto server does with console output.

Run as `python tests/azure/arm_twin_server.py --dir DIR ...` (arm.py's options). A VM whose console a
test did not write shows what a booted node prints: its host keys (one fixed test key; nothing here
answers SSH). The full twin's VMs show their node's own console.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

from clusterbake.twins.azure import arm

BOOTED_CONSOLE = (
    "[    0.000000] Linux version 6.8.0-1021-azure\n"
    "-----BEGIN SSH HOST KEY KEYS-----\n"
    "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIKnLhc+bqT1CV7aEgmuyrkmzHfIzmN2ZRDo8ulTN2JGH\n"
    "-----END SSH HOST KEY KEYS-----\n"
)


def console_log(vm_id: str) -> Path:
    path = Path(os.environ["ARM_TWIN_CONSOLE_DIR"]) / f"{vm_id}.log"
    if not path.exists():
        path.write_text(BOOTED_CONSOLE)
    return path


if __name__ == "__main__":
    arm.Twin.console_log = staticmethod(console_log)  # every twin of this process: the tests' consoles
    sys.exit(arm.main())
