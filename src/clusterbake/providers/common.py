"""What the cloud providers (aws, azure) share: SSH access to their nodes (the options, Ansible connection
vars, endpoints and the wait for the head to answer) and the check of a group's fallback sizes.

Host keys are new on every instance/VM. AWS pins them before the first connection from the
instance's console output (the boot program prints them there, `host_keys_from_console`); a host
whose keys are not pinned yet is trusted on first use (the bastion, Azure's VMs), once: a known
host that offers any other key is refused. Commands run as root (sudo) through the provider's
login user, by way of its bastion if any.
"""

from __future__ import annotations

import fnmatch
import time
from collections.abc import Callable, Iterable

from clusterbake import remote
from clusterbake.config import ClusterConfig
from clusterbake.errors import ClusterbakeError, ConfigError
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


HOST_KEYS_BEGIN = "-----BEGIN SSH HOST KEY KEYS-----"
HOST_KEYS_END = "-----END SSH HOST KEY KEYS-----"


def host_keys_from_console(text: str) -> list[str]:
    """The SSH host keys of the last complete block cloud-init (or the boot program) wrote to the
    console: `type base64` each; [] when there is none yet."""
    blocks, current = [], None
    for raw in text.splitlines():
        line = raw.split(": ", 1)[1] if raw.startswith(("ec2: ", "ci-info: ")) else raw
        line = line.strip()
        if line == HOST_KEYS_BEGIN:
            current = []
        elif line == HOST_KEYS_END and current is not None:
            blocks.append(current)
            current = None
        elif current is not None and len(line.split()) >= 2 and line.split()[0].startswith(("ssh-", "ecdsa-")):
            current.append(" ".join(line.split()[:2]))
    return blocks[-1] if blocks else []


# How long a new machine may take to print its host keys on its serial console, and how often
# the console is read again.
HOST_KEYS_TIMEOUT = 600.0
HOST_KEYS_POLL = 3.0


def pin_from_console(
    cluster: ClusterDir,
    node: str,
    address: str,
    read_console: Callable[[], str],
    where: str,
    timeout: float | None = None,
) -> None:
    """The node's SSH host keys into known_hosts from its serial console (the cloud's API; the
    boot program prints them there) before anything connects to it: never trust on first use
    for a node that receives the cluster's secrets (security review finding 8). `where`: how to
    look at that console by hand, for the error."""
    if remote.knows_host(cluster.known_hosts, address):
        return
    timeout = HOST_KEYS_TIMEOUT if timeout is None else timeout
    deadline = time.monotonic() + timeout
    while True:
        keys = host_keys_from_console(read_console())
        if keys:
            remote.pin_host_keys(cluster.known_hosts, [address, node], keys)
            return
        if time.monotonic() > deadline:
            raise ClusterbakeError(
                f"{node} has not shown its SSH host keys on its serial console in {timeout:.0f} s "
                f"(its boot program prints them; see {where}): nothing connected to it"
            )
        time.sleep(HOST_KEYS_POLL)


def controller_files(cluster: ClusterDir) -> dict:
    """Where the roles find the cluster's secrets and join bundles on this machine (every provider)."""
    return {
        "munge_key_file": str(cluster.munge_key),
        "slurm_accounting_local_password_file": str(cluster.db_password),
        "slurm_jwt_key_file": str(cluster.jwt_key),
        "node_join_controller_dir": str(cluster.join_bundles),
    }


def connection_vars(cluster: ClusterDir, user: str, options: list[str], extra: dict) -> dict:
    """The inventory's connection vars: `user` with sudo, the cluster's key and `options`, then `extra`."""
    return {
        "ansible_user": user,
        "ansible_become": True,
        "ansible_ssh_private_key_file": str(cluster.ssh_key),
        "ansible_ssh_common_args": " ".join(options),
        **controller_files(cluster),
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


def resource_name(cluster: str, *parts: str) -> str:
    """clusterbake-<cluster>[-<part>...]: how both clouds' resources of a cluster are named."""
    return "-".join(("clusterbake", cluster, *parts))


def instance_type_fields(config: ClusterConfig) -> list[tuple[str, str]]:
    """(field path, instance type or VM size) of the head, the login nodes and every node group (each
    of a group's instance_types), those that are set."""
    fields = [("head.instance_type", config.head.instance_type)]
    if config.login_nodes is not None:
        fields.append(("login_nodes.instance_type", config.login_nodes.instance_type))
    for i, group in enumerate(config.node_groups):
        if group.instance_types:
            fields += [(f"node_groups.{i}.instance_types.{j}", t) for j, t in enumerate(group.instance_types)]
        else:
            fields.append((f"node_groups.{i}.instance_type", group.instance_type))
    return [(field, value) for field, value in fields if value]


def check_fallback_types(field: str, infos: list) -> None:
    """Every fallback type can take the primary's Slurm spec: the same vCPUs (slurmd drains a node
    with other CPUs than slurm.conf says), at least its memory and its GPUs (model and count)."""
    primary, *fallbacks = infos
    for index, info in enumerate(fallbacks, start=1):
        where = f"{field}.instance_types.{index}"
        if info.vcpus != primary.vcpus:
            raise ConfigError(
                f"{where}: {info.name} has {info.vcpus} vCPUs, the primary {primary.name} {primary.vcpus}; "
                "a fallback type needs the same vCPUs (Slurm would drain the node)"
            )
        if info.memory_mib < primary.memory_mib:
            raise ConfigError(
                f"{where}: {info.name} has {info.memory_mib} MiB of memory, less than the primary {primary.name}'s "
                f"{primary.memory_mib} MiB (Slurm would drain the node)"
            )
        gpus = dict(info.gpus)
        short = [f"{count} x {model}" for model, count in primary.gpus if gpus.get(model, 0) < count]
        if short:
            have = ", ".join(f"{c} x {m}" for m, c in info.gpus) or "no GPUs"
            raise ConfigError(
                f"{where}: {info.name} has {have}, the primary {primary.name} {', '.join(short)}; "
                "a fallback type needs at least the primary's GPUs"
            )


def action_allowed(patterns: Iterable[str], action: str) -> bool:
    """Whether a pattern names `action`, as IAM and ARM match them: case-insensitive, `*` a wildcard."""
    return any(fnmatch.fnmatchcase(action.lower(), pattern.lower()) for pattern in patterns)
