"""moto_server with the EC2 behaviours these tests need and moto 5.2.5 lacks.

Run as `python tests/aws/moto_ec2_server.py -H 127.0.0.1 -p PORT` (same options as
`moto_server`). Everything is moto's own server and EC2 backend, plus the additions of
src/clusterbake/twins/aws/moto_ext.py (the EC2 twin uses the same ones): placement
groups, launch templates applied as EC2 applies them (subnet, instance profile,
metadata options), the $MOTO_CAPACITY_FILE switch for InsufficientInstanceCapacity,
secret ARNs as the IAM resource of Secrets Manager calls, and each instance's console output
from $MOTO_CONSOLE_DIR. See that module's
docstring for exactly what each adds and why.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

from moto.server import main

from clusterbake.twins.aws import moto_ext

moto_ext.install()
# An instance's console output: $MOTO_CONSOLE_DIR/<instance id>.log when a test wrote one, else what
# a booted node prints (its host keys, as the boot program does; one fixed test key: nothing here
# answers SSH). The twin's is the node's own console.
BOOTED_CONSOLE = (
    "-----BEGIN SSH HOST KEY KEYS-----\n"
    "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIKnLhc+bqT1CV7aEgmuyrkmzHfIzmN2ZRDo8ulTN2JGH\n"
    "-----END SSH HOST KEY KEYS-----\n"
)


def console_log(instance_id: str) -> Path:
    path = Path(os.environ.get("MOTO_CONSOLE_DIR", "/nonexistent")) / f"{instance_id}.log"
    if not path.exists() and path.parent.is_dir():
        path.write_text(BOOTED_CONSOLE)
    return path


moto_ext.CONSOLE_LOG = console_log

if __name__ == "__main__":
    sys.exit(main())
