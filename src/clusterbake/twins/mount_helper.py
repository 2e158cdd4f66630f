#!/usr/bin/python3
"""The twins' stand-in for mount.nfs / mount.nfs4 / mount.lustre inside their nodes.

This machine's kernel has no NFS or Lustre client, so a twin binds each node's
`/usr/sbin/mount.nfs{,4}` and `/usr/sbin/mount.lustre` to this program. mount(8)
calls it as `mount.<type> SPEC DIR [-o OPTIONS] [-s] [-f] [-n] [-v]`. It looks SPEC's
host up in the twin's storage map (an EFS mount target's address, an FSx for Lustre
file system's DNS name, an Azure storage account's file host, an Azure Managed Lustre
file system's MGS address) and bind-mounts that
file system's directory, which every node of the twin shares, at DIR. Only the twins'
nodes ever run it; see docs/twin.md for what this cannot show (NFS and Lustre
semantics, reachability, security groups and network rules other than the Azure twin's
check of Managed Lustre's servers below, performance).

The map (`endpoints.json`, written by the twin): host -> {"dir": the file system's
directory under the storage root, "prefix": the part of SPEC's path that names it (an
Azure export's `/<account>`), stripped before the rest is taken as a subdirectory,
"fs_name": the Lustre file system name SPEC must give (Azure Managed Lustre's `lustrefs`),
"refused": {client address: why} the nodes the file system's servers cannot reach (the Azure
twin's NSG check, twins/azure/lustre.py)}. A refused node's mount fails as mount.lustre's does
(exit 32, "failed: Input/output error") with the twin's reason: a real client whose network keeps
the servers' connections out may mount and then hang or be evicted; the twin fails it at once.
"""

from __future__ import annotations

import json
import socket
import subprocess
import sys
from pathlib import Path

STORAGE = Path("/run/clusterbake-twin/storage")
EXIT_USAGE, EXIT_FAILURE = 1, 32  # mount(8)'s codes for helpers


def split(spec: str) -> tuple[str, str | None, str]:
    """(host, Lustre file system name or None for NFS, path below the export) of SPEC."""
    if "@tcp:/" in spec:  # lustre: <dns name or MGS address>@tcp:/<mount or file system name>[/subdir]
        host, _, rest = spec.partition("@tcp:/")
        fs_name, _, subdir = rest.partition("/")
        return host, fs_name, subdir
    host, _, rest = spec.partition(":")  # nfs: <address or name>:/<path>
    return host, None, rest.lstrip("/")


def lookup(spec: str) -> tuple[dict, Path] | None:
    """The map's entry of the file system SPEC names and its directory, or None."""
    endpoints = json.loads((STORAGE / "endpoints.json").read_text()) if (STORAGE / "endpoints.json").exists() else {}
    host, fs_name, subdir = split(spec)
    entry = endpoints.get(host)
    if entry is None or (fs_name is not None and entry.get("fs_name", fs_name) != fs_name):
        return None
    prefix = entry.get("prefix", "").strip("/")
    if prefix:
        head, _, subdir = subdir.partition("/")
        if head != prefix:
            return None
    if ".." in subdir.split("/"):
        return None
    return entry, STORAGE / entry["dir"] / subdir


def own_address(host: str) -> str | None:
    """The address this node reaches `host` from: a UDP socket's connect picks the route, sending nothing."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        try:
            probe.connect((host, 988))
        except OSError:
            return None
        return probe.getsockname()[0]


def refusal(entry: dict, spec: str) -> str | None:
    """Why the file system's servers cannot reach this node (the twin's "refused"), or None."""
    refused = entry.get("refused") or {}
    return refused.get(own_address(split(spec)[0]) or "") if refused else None


def main(argv: list[str]) -> int:
    args = [a for a in argv if not a.startswith("-") or a == "-o"]
    if len(args) < 2:
        print("usage: mount.nfs4 SPEC DIR [-o OPTIONS]", file=sys.stderr)
        return EXIT_USAGE
    spec, target = args[0], args[1]
    found = lookup(spec)
    source = found[1] if found else None
    if source is None or not source.is_dir():
        print(
            f"clusterbake twin: no file system at {spec} (the twin binds the directories of the file systems "
            "and shares its API created and the nodes may reach; see docs/twin.md)",
            file=sys.stderr,
        )
        return EXIT_FAILURE
    why = refusal(found[0], spec)
    if why:
        print(f"mount.lustre: mount {spec} at {target} failed: Input/output error", file=sys.stderr)
        print(f"clusterbake twin: {why} (see docs/twin.md)", file=sys.stderr)
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
