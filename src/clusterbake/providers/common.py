"""SSH access to a cloud provider's nodes (aws, azure): the options, Ansible connection vars, endpoints
and the wait for the head to answer.

Host keys are new on every instance/VM: trust on first use, pinned per cluster (known_hosts);
commands run as root (sudo) through the provider's login user, by way of its bastion if any.
"""

from __future__ import annotations

from clusterbake import remote
from clusterbake.errors import ClusterbakeError
from clusterbake.remote import Endpoint
from clusterbake.state import ClusterDir


def ssh_options(cluster: ClusterDir, bastion: str | None) -> list[str]:
    """The ssh -o options for the cluster's nodes (ProxyJump through `bastion` when set)."""
    options = [
        "-o",
        f"UserKnownHostsFile={cluster.known_hosts}",
        "-o",
        "StrictHostKeyChecking=accept-new",
        "-o",
        "IdentitiesOnly=yes",
        "-o",
        "LogLevel=ERROR",
    ]
    if bastion:
        options += ["-o", f"ProxyJump={bastion}"]
    return options


def connection_vars(cluster: ClusterDir, user: str, options: list[str], extra: dict) -> dict:
    """The inventory's connection vars: `user` with sudo, the cluster's key and `options`, then `extra`."""
    return {
        "ansible_user": user,
        "ansible_become": True,
        "ansible_ssh_private_key_file": str(cluster.ssh_key),
        "ansible_ssh_common_args": " ".join(options),
        "munge_key_file": str(cluster.munge_key),
        "node_join_controller_dir": str(cluster.join_bundles),
        **extra,
    }


def endpoint(cluster: ClusterDir, node: str, address: str, user: str, bastion: str | None) -> Endpoint:
    """The node at `address` as `user`, with sudo, through `bastion` when set."""
    return Endpoint(
        name=node,
        host=address,
        user=user,
        key_file=cluster.ssh_key,
        known_hosts=cluster.known_hosts,
        host_key_policy="accept-new",
        sudo=True,
        gateway=bastion,
    )


def wait_ssh(endpoint: Endpoint, timeout: float, hint: str) -> None:
    """Wait until `endpoint` answers SSH; a changed host key as is, any other failure as a
    ClusterbakeError that ends with `hint` (what to check)."""
    try:
        remote.wait_ready({endpoint.name: endpoint}, timeout)
    except remote.HostKeyError:
        raise
    except remote.RemoteError as exc:
        raise ClusterbakeError(f"{exc}\n{hint}") from exc
