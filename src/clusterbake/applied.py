"""What the last configure applied: the digest of its inputs and the head's managed files
and services. A `cluster up` whose inputs did not change and whose head shows no drift
skips Ansible (a fast no-op); drift found on the head is reported, then configured away.

Inputs: the inventory the play would get (every host's variables and the cluster's), the
playbooks and roles, the cluster's secrets (munge key, passwords, tokens: their digest
only) and the extra CA files. The head's state: sha256 of every file under the
directories the head play manages, and whether its daemons are active.
"""

from __future__ import annotations

import hashlib
import json
import shlex
from dataclasses import dataclass
from pathlib import Path

from clusterbake import remote
from clusterbake.config import ClusterConfig, extra_ca_files
from clusterbake.images.inputs import hash_repository_inputs
from clusterbake.paths import repo_root
from clusterbake.remote import Endpoint
from clusterbake.state import open_private

# What the head play writes (roles common, munge, slurm, slurm_accounting, slurm_power, shared_storage,
# prometheus, node_exporter, slurm_exporter, node_join) and the daemons it runs (a daemon a cluster does
# not use stays "inactive", as recorded).
HEAD_PATHS = (
    "/etc/slurm", "/etc/clusterbake", "/etc/munge", "/etc/mysql", "/etc/prometheus", "/etc/default/prometheus",
    "/etc/default/prometheus-node-exporter", "/etc/exports", "/etc/exports.d", "/etc/systemd/system",
)  # fmt: skip
HEAD_SERVICES = (
    "munge", "slurmctld", "mariadb", "slurmdbd", "prometheus", "prometheus-node-exporter",
    "clusterbake-slurm-exporter",
)  # fmt: skip
# Bundles the play renders (outputs, not inputs).
RENDERED = ("join",)


# Whether a node runs now is not an input of the head's configuration (slurm.conf lists every
# planned node, running or not): a node that booted or powered down since is no reason to play.
POWER_HOSTVARS = ("clusterbake_running", "clusterbake_power_state")


def _without_power(inventory: dict) -> dict:
    hostvars = inventory.get("_meta", {}).get("hostvars", {})
    stable = {host: {k: v for k, v in hv.items() if k not in POWER_HOSTVARS} for host, hv in hostvars.items()}
    return {**inventory, "_meta": {**inventory.get("_meta", {}), "hostvars": stable}}


def inputs_digest(config: ClusterConfig, inventory: dict, secrets_dir: Path) -> str:
    h = hashlib.sha256(json.dumps(_without_power(inventory), sort_keys=True, default=str).encode())
    hash_repository_inputs(h, repo_root())
    if secrets_dir.exists():
        for path in sorted(secrets_dir.rglob("*")):
            relative = path.relative_to(secrets_dir)
            if path.is_file() and relative.parts[0] not in RENDERED:
                h.update(str(relative).encode() + b"\0" + hashlib.sha256(path.read_bytes()).digest())
    for ca in extra_ca_files(config):
        h.update(Path(ca).read_bytes())
    # An external accounting database's password and CA bundle (their digest only).
    database = config.accounting.database if config.accounting.enabled else None
    for name in (database.password_file, database.ca_file) if database else ():
        if name:
            h.update(hashlib.sha256(Path(name).read_bytes()).digest())
    return h.hexdigest()


@dataclass(frozen=True)
class HeadState:
    files: dict[str, str]  # path -> sha256
    services: dict[str, str]  # unit -> systemctl is-active

    def as_dict(self) -> dict:
        return {"files": self.files, "services": self.services}

    def drift(self, applied: dict) -> list[str]:
        """What differs from the state recorded after the last configure, in words."""
        changes = []
        before = applied.get("files", {})
        for path in sorted(set(before) | set(self.files)):
            if path not in self.files:
                changes.append(f"{path} removed")
            elif path not in before:
                changes.append(f"{path} added")
            elif before[path] != self.files[path]:
                changes.append(f"{path} changed")
        for unit, state in sorted(self.services.items()):
            if state != applied.get("services", {}).get(unit, "active"):
                changes.append(f"{unit} is {state}")
        return changes


def head_state(head: Endpoint) -> HeadState:
    """One command on the head: the managed files' digests and the daemons' states."""
    paths = " ".join(shlex.quote(p) for p in HEAD_PATHS)
    command = (
        f"find {paths} -xdev -type f -print0 2>/dev/null | sort -z | xargs -0r sha256sum; "
        f"echo --; systemctl is-active {' '.join(HEAD_SERVICES)} || true"
    )
    text = remote.run(head, command, timeout=60).text()
    listing, _, states = text.partition("--\n")
    files = {}
    for line in listing.splitlines():
        digest, _, path = line.partition("  ")
        if path:
            files[path] = digest
    return HeadState(files, dict(zip(HEAD_SERVICES, states.split(), strict=False)))


def record_path(cluster_root: Path) -> Path:
    return cluster_root / "applied.json"


def read_record(cluster_root: Path) -> dict:
    try:
        return json.loads(record_path(cluster_root).read_text())
    except (OSError, ValueError):
        return {}


def write_record(cluster_root: Path, inputs: str, head: HeadState) -> None:
    """After a configure that succeeded (digests only; 0600 all the same: they are of secrets)."""
    path = record_path(cluster_root)
    tmp = path.with_suffix(".tmp")
    with open_private(tmp) as handle:  # 0600 from its first byte
        handle.write(json.dumps({"inputs": inputs, "head": head.as_dict()}, indent=1, sort_keys=True) + "\n")
    tmp.replace(path)
