"""The join of a head and compute nodes through the real ansible/tasks/join.yml (tests/playbooks/join.yml),
for the tests of the roles that add parts to the bundles (test_slurm_accounting.py, test_monitoring_roles.py).

All hosts use the local connection; the join program is a fake that keeps the bundle it gets on stdin,
so a test reads each node's exact bundle. `play` writes the inventory from the hosts and variables it is
given, runs the playbook with -v and returns the bundles, Ansible's output and every task result.
"""

from __future__ import annotations

import base64
import binascii
import json
import re
import secrets
import sys
from pathlib import Path

import yaml
from playbook_run import playbook_env, run_playbook

FAKE_JOIN = """#!{python}
# Keeps the bundle it gets on stdin at --bundle, as clusterbake-node-join --install does, and the
# arguments it was given beside it (<bundle>.argv.json).
import json, sys
path = sys.argv[sys.argv.index("--bundle") + 1]
open(path, "w").write(sys.stdin.read())
open(path + ".argv.json", "w").write(json.dumps(sys.argv[1:]))
print(json.dumps({{"changed": [], "restart_held": []}}))
"""
SPEC = {"cpus": 2, "sockets": 1, "cores_per_socket": 2, "threads_per_core": 1, "gres": [], "features": []}


def host(address: str, nodegroup: str, memory: int = 4096, **hostvars) -> dict:
    return {
        "ansible_host": address,
        "clusterbake_nodegroup": nodegroup,
        "clusterbake_slurm_node": {**SPEC, "real_memory": memory},
        **hostvars,
    }


def play(tmp: Path, hosts: dict[str, dict], groups: dict[str, list[str]], variables: dict) -> dict:
    """Join `hosts` (inventory name -> hostvars; groups: slurm_head, slurm_compute, feature groups)."""
    (tmp / "bundles").mkdir()
    (tmp / "munge.key").write_bytes(secrets.token_bytes(32))
    password = secrets.token_urlsafe(32)
    (tmp / "slurmdbd.password").write_text(password)
    (tmp / "power.token").write_text(secrets.token_urlsafe(32))
    fake = tmp / "fake-join"
    fake.write_text(FAKE_JOIN.format(python=sys.executable))
    fake.chmod(0o755)
    inventory = {
        "all": {
            "vars": {
                "ansible_connection": "local",
                "ansible_python_interpreter": "/usr/bin/python3",
                "clusterbake_cluster_name": "t",
                "clusterbake_storage": [{"name": "shared", "mount_point": "/shared", "type": "hostdir"}],
                "munge_key_file": str(tmp / "munge.key"),
                "slurm_accounting_local_password_file": str(tmp / "slurmdbd.password"),
                "slurm_power_token_controller_file": str(tmp / "power.token"),
                "slurm_power_agent_url": "unix:///run/clusterbake-power-agent/agent.sock",
                "node_join_program": str(fake),
                "node_join_bundle_path": str(tmp / "bundles") + "/{{ inventory_hostname }}.json",
                **variables,
            },
            "hosts": hosts,
            "children": {name: {"hosts": {h: {} for h in members}} for name, members in groups.items()},
        }
    }
    (tmp / "inventory.yml").write_text(yaml.safe_dump(inventory))
    record = tmp / "record.json"
    proc = run_playbook("join.yml", tmp / "inventory.yml", playbook_env(tmp, tmp / "bin", record), "-v")
    return {
        "password": password,
        "bundles": {
            p.stem: json.loads(p.read_text()) for p in (tmp / "bundles").glob("*.json") if ".argv" not in p.name
        },
        # The join program's arguments on each host Ansible joined.
        "argv": {p.name.split(".")[0]: json.loads(p.read_text()) for p in (tmp / "bundles").glob("*.argv.json")},
        "output": proc.stdout + proc.stderr,
        "records": record.read_text(),
    }


def files(bundle: dict) -> dict[str, dict]:
    """A bundle's files by path, each with its decoded text."""
    return {
        f["path"]: {**f, "text": base64.b64decode(f["content_b64"]).decode(errors="replace")} for f in bundle["files"]
    }


def revealed(text: str, secret: str) -> bool:
    """Whether `secret` is in `text` as is, or inside any base64 in it (a file's content_b64)."""
    if secret in text:
        return True
    for blob in re.findall(r"[A-Za-z0-9+/]{16,}={0,2}", text):
        try:
            decoded = base64.b64decode(blob + "=" * (-len(blob) % 4), validate=False)
        except binascii.Error:  # not base64 after all (a path matches the alphabet too)
            continue
        if secret.encode() in decoded:
            return True
    return False
