"""The user data every node boots with, on both clouds (EC2 user data, Azure userData/customData):
who it is, who may log in, where its join bundle is.

A MIME multipart document with two parts:

- `text/cloud-config` for cloud-init (the Ubuntu AMIs carry it): the hostname, which
  must equal the node's name (`head`, `<group>-<n>`: slurmd finds its NodeName by
  hostname), and the controller's key for the default user (aws.ssh_user, azure.admin_user).
- `text/x-clusterbake` (JSON) for the image's own boot service (role cloud_boot,
  `clusterbake-node-boot`): the same name and keys, and where the node group's join
  bundle is: a Secrets Manager secret read with the instance role, or a Key Vault secret
  read with the VM's managed identity. The bundle holds
  the munge key, so it never travels in user data, which anything on the instance
  that reaches the metadata service can read.

cloud-init parts are ignored by nodes without cloud-init and the clusterbake part by
cloud-init ("unhandled content type"), so both boot paths read the same document.
"""

from __future__ import annotations

import hashlib
import json
from email.mime.multipart import MIMEMultipart
from email.mime.text import MIMEText

import yaml

PART_TYPE = "x-clusterbake"
FORMAT = 1
# Stands for the node's name in a group's user data template (`user_data_template`): the head's
# power program (role slurm_power) puts each elastic node's name in its place. Upper case, so it
# cannot be part of a name, a cluster name or a user name; a plain scalar in YAML and JSON.
NAME_PLACEHOLDER = "CLUSTERBAKE_NODE_NAME"


def user_data(
    *,
    cluster: str,
    hostname: str,
    ssh_user: str,
    authorized_keys: list[str],
    join: dict[str, str] | None,
) -> str:
    """`join`: {"cloud": "aws", "region", "secret_id", "endpoint_url"} (None: the node joins through Ansible)."""
    cloud_config = {
        "hostname": hostname,
        "preserve_hostname": False,
        # Only the node's own 127.0.1.1 line; the join bundle writes the cluster's /etc/hosts.
        "manage_etc_hosts": "localhost",
        "ssh_authorized_keys": list(authorized_keys),
    }
    ours = {
        "clusterbake": FORMAT,
        "cluster": cluster,
        "hostname": hostname,
        "ssh_user": ssh_user,
        "ssh_authorized_keys": list(authorized_keys),
        "join": join,
    }
    parts = [
        MIMEText("#cloud-config\n" + yaml.safe_dump(cloud_config, sort_keys=False), "cloud-config"),
        MIMEText(json.dumps(ours, indent=2, sort_keys=True) + "\n", PART_TYPE),
    ]
    # The boundary from the content, not random: the same node gets the same user data on every
    # run, so launch templates and the head's power.json change only when the content does.
    digest = hashlib.sha256("".join(part.as_string() for part in parts).encode()).hexdigest()[:32]
    message = MIMEMultipart(boundary=f"==clusterbake-{digest}==")
    for part in parts:
        message.attach(part)
    return message.as_string()


def user_data_template(*, cluster: str, ssh_user: str, authorized_keys: list[str], join: dict[str, str] | None) -> str:
    """The user data of every node of a group, with NAME_PLACEHOLDER for the node's name.

    `template.replace(NAME_PLACEHOLDER, name)` is the node's user data: the MIME parts are
    7bit text (no encoding a substitution could break, no length to keep), and a name is a
    plain scalar in the YAML part and a plain string in the JSON part, like the placeholder.
    """
    text = user_data(
        cluster=cluster, hostname=NAME_PLACEHOLDER, ssh_user=ssh_user, authorized_keys=authorized_keys, join=join
    )
    if text.count(NAME_PLACEHOLDER) != 2:
        raise ValueError(f"user data template: {NAME_PLACEHOLDER} must appear exactly twice (the two hostnames)")
    return text
