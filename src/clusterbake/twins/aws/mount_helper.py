#!/usr/bin/python3
"""The EC2 twin's stand-in for mount.nfs / mount.nfs4 / mount.lustre inside its nodes.

This machine's kernel has no NFS or Lustre client, so the twin binds each node
`/usr/sbin/mount.nfs{,4}` and `/usr/sbin/mount.lustre` to this program. mount(8)
calls it as `mount.<type> SPEC DIR [-o OPTIONS] [-s] [-f] [-n] [-v]`. It looks SPEC up
in the twin's storage map (an EFS mount target's address, or an FSx for Lustre
file system's DNS name) and bind-mounts that file system's directory, which every
node of the twin shares, at DIR. Only the twin's nodes ever run it; see docs/twin.md
for what this cannot show (NFS and Lustre semantics, mount target reachability,
security groups, performance).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

STORAGE = Path("/run/clusterbake-twin/storage")
EXIT_USAGE, EXIT_FAILURE = 1, 32  # mount(8)'s codes for helpers


def source_of(spec: str) -> Path | None:
    """The directory of the file system SPEC names, or None."""
    endpoints = json.loads((STORAGE / "endpoints.json").read_text()) if (STORAGE / "endpoints.json").exists() else {}
    if "@tcp:/" in spec:  # lustre: <dns name>@tcp:/<mount name>[/subdir]
        host, _, rest = spec.partition("@tcp:/")
        subdir = rest.partition("/")[2]
    else:  # nfs: <address or name>:/<path>
        host, _, rest = spec.partition(":")
        subdir = rest.lstrip("/")
    entry = endpoints.get(host)
    if entry is None:
        return None
    return STORAGE / entry["kind"] / entry["id"] / subdir


def main(argv: list[str]) -> int:
    args = [a for a in argv if not a.startswith("-") or a == "-o"]
    if len(args) < 2:
        print("usage: mount.nfs4 SPEC DIR [-o OPTIONS]", file=sys.stderr)
        return EXIT_USAGE
    spec, target = args[0], args[1]
    source = source_of(spec)
    if source is None or not source.is_dir():
        print(
            f"clusterbake twin: no EFS or FSx file system at {spec} (the twin binds the directories of the "
            "file systems its API created; see docs/twin.md)",
            file=sys.stderr,
        )
        return EXIT_FAILURE
    # _netdev goes into libmount's utab for this very mount: systemd then treats it as the
    # network mount it stands for (ordered after the network, before remote-fs.target).
    # Without it, a bind of a local directory looks local and breaks the boot's ordering.
    result = subprocess.run(["mount", "-o", "bind,_netdev", str(source), target], capture_output=True, text=True)
    if result.returncode != 0:
        print(f"clusterbake twin: bind {source} at {target}: {result.stderr.strip()}", file=sys.stderr)
        return EXIT_FAILURE
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
