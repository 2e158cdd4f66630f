#!/usr/bin/python3
"""The Azure twin's stand-in for blobfuse2 (and fusermount3) inside its nodes.

This machine's nodes have no FUSE and cannot reach Azure, so the Azure twin binds each
node's `/usr/bin/blobfuse2` and `/usr/bin/fusermount3` to this program. It is called as
role blobfuse2's unit calls blobfuse2:

    blobfuse2 mount PATH --config-file=FILE --foreground=true
    fusermount3 -u PATH

`mount` reads the config file the role rendered (blobfuse2's YAML: `azstorage`
account-name, container, endpoint, mode, appid; `read-only`), does what blobfuse2 does
first with `mode: msi` (a token for https://storage.azure.com from the VM's metadata
service, for the user-assigned identity `appid`), asks the account's blob service whether
that identity may list the container (the twin's blob service applies the account's
network rules and the identity's role assignments, as Azure Storage does), and only then
bind-mounts the container's directory of the twin (read-only when the config says so).
It stays in the foreground until it is stopped (SIGTERM) or the mount is gone, like
`blobfuse2 --foreground=true` under systemd. Only the twins' nodes ever run it; what it
cannot show (FUSE, the file cache, blob semantics, throughput): docs/twin.md.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path

STORAGE = Path("/run/clusterbake-twin/storage/blobs")
IMDS = "http://169.254.169.254/metadata/identity/oauth2/token"
STORAGE_RESOURCE = "https://storage.azure.com/"
API_VERSION = "2021-08-06"  # x-ms-version of the blob requests


def read_config(path: Path) -> dict:
    """The two levels of blobfuse2's YAML the role writes (to_nice_yaml): top-level keys and sections."""
    config: dict = {}
    section: dict | None = None
    for raw in path.read_text().splitlines():
        line = raw.split(" #", 1)[0].rstrip()
        if not line.strip() or line.lstrip().startswith(("#", "- ")):
            continue
        key, _, value = line.strip().partition(":")
        value = value.strip().strip("'\"")
        if not raw.startswith(" "):
            section = {} if not value else None
            config[key] = section if section is not None else value
        elif section is not None:
            section[key] = value
    return config


def token(client_id: str) -> str:
    query = urllib.parse.urlencode({"api-version": "2018-02-01", "resource": STORAGE_RESOURCE, "client_id": client_id})
    request = urllib.request.Request(f"{IMDS}?{query}", headers={"Metadata": "true"})
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    with opener.open(request, timeout=10) as response:
        return json.loads(response.read())["access_token"]


def check_access(endpoint: str, container: str, access_token: str) -> None:
    """List Blobs (maxresults=1): what a mount needs the identity to be allowed."""
    url = f"{endpoint.rstrip('/')}/{container}?restype=container&comp=list&maxresults=1"
    request = urllib.request.Request(
        url, headers={"Authorization": f"Bearer {access_token}", "x-ms-version": API_VERSION}
    )
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    with opener.open(request, timeout=15) as response:
        response.read()


def mounted(path: str) -> bool:
    return subprocess.run(["mountpoint", "-q", path]).returncode == 0


def mount(path: str, config_file: Path) -> int:
    config = read_config(config_file)
    storage = config.get("azstorage") or {}
    account, container = storage.get("account-name", ""), storage.get("container", "")
    endpoint = storage.get("endpoint") or f"https://{account}.blob.core.windows.net"
    if storage.get("mode") != "msi" or not storage.get("appid"):
        print("blobfuse2 (twin): only azstorage mode msi with an appid is emulated", file=sys.stderr)
        return 1
    try:
        check_access(endpoint, container, token(storage["appid"]))
    except urllib.error.HTTPError as exc:
        code = exc.headers.get("x-ms-error-code", "")
        print(f"blobfuse2 (twin): {account}/{container}: HTTP {exc.code} {code}", file=sys.stderr)
        return 1
    except (urllib.error.URLError, OSError, ValueError, KeyError) as exc:
        print(f"blobfuse2 (twin): {account}/{container}: {exc}", file=sys.stderr)
        return 1
    source = STORAGE / account / container
    if not source.is_dir():
        print(f"blobfuse2 (twin): the twin keeps no directory for {account}/{container}", file=sys.stderr)
        return 1
    Path(path).mkdir(parents=True, exist_ok=True)
    options = "bind,ro" if config.get("read-only") == "true" else "bind"
    result = subprocess.run(["mount", "-o", options, str(source), path], capture_output=True, text=True)
    if result.returncode != 0:
        print(f"blobfuse2 (twin): bind {source} at {path}: {result.stderr.strip()}", file=sys.stderr)
        return 1
    print(f"blobfuse2 (twin): {account}/{container} mounted at {path} ({options})", flush=True)
    stop = []
    signal.signal(signal.SIGTERM, lambda *_: stop.append(True))
    signal.signal(signal.SIGINT, lambda *_: stop.append(True))
    while not stop and mounted(path):
        time.sleep(1)
    if mounted(path):
        subprocess.run(["umount", path], check=False)
    return 0


def main(argv: list[str]) -> int:
    name = Path(argv[0]).name
    args = argv[1:]
    if name == "fusermount3":
        if len(args) == 2 and args[0] == "-u":
            return subprocess.run(["umount", args[1]]).returncode
        print("usage: fusermount3 -u PATH", file=sys.stderr)
        return 1
    if len(args) >= 2 and args[0] == "mount":
        files = [a.split("=", 1)[1] for a in args if a.startswith("--config-file=")]
        if files:
            return mount(args[1], Path(files[0]))
    if args == ["--version"]:
        print("blobfuse2 version (the Azure twin's stand-in)")
        return 0
    print("usage: blobfuse2 mount PATH --config-file=FILE [--foreground=true]", file=sys.stderr)
    return 1


if __name__ == "__main__":
    os.umask(0o022)
    sys.exit(main(sys.argv))
