"""The user data every node boots with: cloud-init sets its name and lets the controller in.

The hostname must equal the inventory name (`head`, `<group>-<n>`): slurmd finds its
NodeName by hostname. Each node gets its own user data at launch (RunInstances
UserData overrides the launch template's). Later, the node group's join bundle
(docs/architecture.md) goes the same way, as a `write_files` entry that
clusterbake-node-join.service applies at first boot.
"""

from __future__ import annotations

import yaml


def cloud_config(hostname: str, authorized_keys: list[str]) -> str:
    config = {
        "hostname": hostname,
        "preserve_hostname": False,
        # Only the node's own 127.0.1.1 line; the common role writes the cluster's /etc/hosts.
        "manage_etc_hosts": "localhost",
        # For the default user (aws.ssh_user, ubuntu on Ubuntu AMIs): the cluster's controller key.
        "ssh_authorized_keys": list(authorized_keys),
    }
    return "#cloud-config\n" + yaml.safe_dump(config, sort_keys=False)
