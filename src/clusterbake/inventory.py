"""The Ansible inventory shape shared by every provider (docs/architecture.md)."""

from __future__ import annotations

from clusterbake.config import HEAD_NAME, MONITORING_PORTS, ClusterConfig, extra_ca_files
from clusterbake.plan import NodeSpec
from clusterbake.topology import switches

# With a backup controller (head.count 2): where both heads mount the storage they share (the local
# provider: a host directory), and slurmctld's StateSaveLocation and the power program's state in it.
CONTROLLER_SHARED_DIR = "/srv/clusterbake/controller"
# The inventory group of the heads after the first (backup controllers); `slurm_head` is the primary alone,
# which runs what a cluster has once (slurmdbd, Prometheus, the NFS exports, the ops playbooks' plays).
BACKUP_HEAD_GROUP = "slurm_backup_head"

# Features of a node whose boot takes minutes (power.resume_timeout's longer default).
ACCELERATED_FEATURES = frozenset({"gpu", "efa", "ib", "nvswitch"})


def group_name(name: str) -> str:
    """Ansible group names cannot hold dashes; node group and feature names can."""
    return name.replace("-", "_")


def cluster_vars(config: ClusterConfig) -> dict:
    """Group `all` vars derived from the config, so playbooks need no extra vars."""
    plugins = config.slurm_plugins()
    return {
        "clusterbake_cluster_name": config.cluster_name,
        "clusterbake_provider": config.provider,
        "clusterbake_partitions": [
            {
                "name": p.name,
                "nodegroups": list(p.node_groups),
                "default": p.default,
                "max_time": p.max_time,
                "max_nodes": p.max_nodes,
                "state": "UP",
            }
            for p in config.effective_partitions()
        ],
        "clusterbake_users": [
            {
                "name": u.name,
                "uid": u.uid,
                "gid": u.gid or u.uid,
                "groups": [],
                "shell": u.shell,
                "sudo": u.sudo,
                "ssh_authorized_keys": list(u.ssh_authorized_keys),
            }
            for u in config.users
        ],
        "clusterbake_storage": [s.model_dump() for s in config.effective_storage()],
        # Elastic node groups: their idle time and the cluster's power settings (role slurm_power).
        "clusterbake_power": {
            **config.power.model_dump(),
            "idle_times": {g.name: g.idle_time for g in config.node_groups if g.elastic},
        },
        # Health checks of the compute nodes (role node_health) and lost-node recovery.
        "clusterbake_health": config.health.model_dump(),
        "clusterbake_recovery": config.recovery.model_dump(),
        "clusterbake_checkpoint_copy_to": config.checkpoints.copy_to or "",
        "clusterbake_accounting": accounting_vars(config),
        "clusterbake_monitoring": {**config.monitoring.model_dump(), "ports": MONITORING_PORTS},
        "clusterbake_rest_api": config.rest_api.model_dump(),
        # Its files are read on this machine by the roles (lookups), never sent elsewhere but in bundles.
        "clusterbake_directory": config.directory.model_dump() if config.directory else {},
        # The configure half keeps the same CAs the image was baked with.
        "clusterbake_extra_ca_certificates": extra_ca_files(config),
        # The network's switches (topology.conf): on the local provider from local.topology; the
        # clouds' come from their APIs (providers' extra vars).
        "clusterbake_topology": switches(config.local_topology_paths(), config.compute_node_names()),
        "slurm_proctrack_type": plugins["proctrack_type"],
        "slurm_task_plugin": plugins["task_plugin"],
        "slurm_jobacct_gather_type": plugins["jobacct_gather_type"],
        "slurm_cgroup_enabled": plugins["proctrack_type"] == "proctrack/cgroup",
        "slurm_slurmctld_timeout": config.head.controller_timeout,
        **controller_ha_vars(config),
    }


def controller_ha_vars(config: ClusterConfig) -> dict:
    """A backup controller's settings: the state both heads share lives on storage both mount."""
    if config.head.count == 1:
        return {}
    return {
        "slurm_state_save_location": f"{CONTROLLER_SHARED_DIR}/slurmctld",
        "slurm_power_state_file": f"{CONTROLLER_SHARED_DIR}/power/state.json",
    }


def accounting_vars(config: ClusterConfig) -> dict:
    """The accounting section as roles slurm and slurm_accounting read it: every user with its account."""
    accounting = config.accounting
    accounts = accounting.effective_accounts()
    return {
        **accounting.model_dump(exclude={"accounts"}),
        "accounts": [a.model_dump(exclude_none=True) for a in accounts],  # unset limits: none
        "users": [{"name": u.name, "account": u.account or accounts[0].name} for u in config.users],
        # The directory group's members, in the directory's account (registered by the head).
        "directory": (
            {"group": config.directory.users_group, "account": config.directory.default_account or accounts[0].name}
            if config.directory
            else {}
        ),
    }


def build_inventory(
    config: ClusterConfig,
    nodes: list[NodeSpec],
    addresses: dict[str, str],
    extra_vars: dict | None = None,
    extra_hostvars: dict[str, dict] | None = None,
) -> dict:
    """`ansible-inventory --list` JSON for the given nodes (only those with an address)."""
    present = [n for n in nodes if n.name in addresses]
    groups: dict[str, list[str]] = {"slurm_head": [], BACKUP_HEAD_GROUP: [], "slurm_login": [], "slurm_compute": []}
    for group in config.node_groups:
        groups[f"nodegroup_{group_name(group.name)}"] = []
    hostvars: dict[str, dict] = {}
    for node in present:
        backup = node.role == "head" and node.name != HEAD_NAME
        groups[BACKUP_HEAD_GROUP if backup else f"slurm_{node.role}"].append(node.name)
        if node.role == "compute":
            groups[f"nodegroup_{group_name(node.nodegroup)}"].append(node.name)
        for feature in node.features:
            groups.setdefault(group_name(feature), []).append(node.name)
        hostvars[node.name] = {
            "ansible_host": addresses[node.name],
            "clusterbake_node_role": node.role,
            "clusterbake_nodegroup": node.nodegroup,
            "clusterbake_slurm_node": node.slurm.as_dict(),
            "clusterbake_elastic": node.elastic,
            **(extra_hostvars or {}).get(node.name, {}),
        }
    # The compute play renders each node group's join bundle. Self-joining nodes take it
    # from the controller (Ansible never connects to them), so one host per group is
    # enough: Ansible's cost then stays flat however many nodes a group has.
    # ansible/cluster.yml renders self-joining groups' bundles in the head's play (join_with_head);
    # nodes Ansible joins start slurmd, so they wait for the controller (join_after_controller).
    # Login nodes are one more such group (bundle `login`).
    if (extra_vars or {}).get("node_join_self_join"):
        groups["join_bundle_hosts"] = [
            hosts[0]
            for name, hosts in groups.items()
            if (name.startswith("nodegroup_") or name == "slurm_login") and hosts
        ]
        groups["join_with_head"], groups["join_after_controller"] = list(groups["join_bundle_hosts"]), []
    else:
        groups["join_bundle_hosts"] = groups["slurm_login"] + groups["slurm_compute"]
        groups["join_with_head"], groups["join_after_controller"] = [], list(groups["join_bundle_hosts"])
    inventory: dict = {name: {"hosts": hosts} for name, hosts in groups.items()}
    variables = cluster_vars(config)
    accelerated = any(n.elastic and ACCELERATED_FEATURES & set(n.features) for n in nodes)
    variables["clusterbake_power"]["resume_timeout"] = config.power.effective_resume_timeout(accelerated)
    inventory["all"] = {
        "children": sorted([*groups, "ungrouped"]),
        "vars": {**variables, **(extra_vars or {})},
    }
    inventory["_meta"] = {"hostvars": hostvars}
    return inventory
