"""Jinja filters that turn clusterbake inventory data into slurm.conf lines.

The functions are pure (no Ansible imports) so that tests/unit can register
them in a plain jinja2 Environment and render the role's real templates.
Host lists are compressed with python-hostlist, which the controller needs.
"""

import hashlib
import json

import hostlist

# Keys of a node's clusterbake_slurm_node spec (docs/architecture.md) and the
# slurm.conf names they become, in the order they are written.
NODE_SPEC_KEYS = (
    ("cpus", "CPUs"),
    ("sockets", "Sockets"),
    ("cores_per_socket", "CoresPerSocket"),
    ("threads_per_core", "ThreadsPerCore"),
    ("real_memory", "RealMemory"),
)
NODE_SPEC_LIST_KEYS = (
    ("gres", "Gres"),
    ("features", "Features"),
)

# slurm.conf keys whose change needs slurmctld and slurmd restarted rather than
# an `scontrol reconfigure` (scontrol(1) "reconfigure", slurm.conf(5)).
# Compared lowercase: slurm.conf keys are case-insensitive.
RESTART_KEYS = frozenset(
    key.lower()
    for key in (
        "AuthType",
        # Auth plugins load when the daemons start (the JWT of slurmrestd: AuthAltTypes=auth/jwt).
        "AuthAltTypes",
        "AuthAltParameters",
        "CredType",
        "ControlMachine",
        "SlurmctldHost",
        "SlurmctldPort",
        "SlurmdPort",
        "SlurmUser",
        "SlurmdUser",
        "StateSaveLocation",
        "SlurmdSpoolDir",
        "PluginDir",
        "ProctrackType",
        "TaskPlugin",
        "JobAcctGatherType",
        "SelectType",
        "SelectTypeParameters",
        "SchedulerType",
        "SwitchType",
        "GresTypes",
        "JobContainerType",
        "TopologyPlugin",
        "PrologFlags",
        "AccountingStorageType",
        # Read when the accounting and priority plugins start (AccountingStorageEnforce: "A restart of
        # slurmctld is required", slurm.conf(5) of 22.05; the TRES are set up at slurmctld's start).
        "AccountingStorageEnforce",
        "AccountingStorageHost",
        "AccountingStoragePort",
        "AccountingStorageTRES",
        "PriorityType",
    )
)

_TRUE_WORDS = frozenset(("yes", "true", "on", "1"))
_FALSE_WORDS = frozenset(("no", "false", "off", "0"))


def slurm_bool(value):
    """Render a boolean the way slurm.conf spells it: YES or NO."""
    if isinstance(value, bool):
        return "YES" if value else "NO"
    word = str(value).strip().lower()
    if word in _TRUE_WORDS:
        return "YES"
    if word in _FALSE_WORDS:
        return "NO"
    raise ValueError(f"slurm_bool: {value!r} is not a boolean")


def slurm_value(value):
    """Render one slurm.conf value: booleans as YES/NO, lists comma-joined."""
    if isinstance(value, bool):
        return slurm_bool(value)
    if isinstance(value, (list, tuple)):
        return ",".join(slurm_value(item) for item in value)
    return str(value)


def slurm_settings(settings, overrides=None):
    """Merge `overrides` into `settings` and return `Key=Value` lines.

    Keys match case-insensitively (as Slurm reads them): an override replaces
    the base entry in place, new keys follow in their given order, and a None
    value drops the key.
    """
    merged = {}
    for source in (settings, overrides or {}):
        for key, value in source.items():
            existing = next((k for k in merged if k.lower() == str(key).lower()), None)
            merged[existing if existing is not None else str(key)] = value
    return [f"{key}={slurm_value(value)}" for key, value in merged.items() if value is not None]


def slurm_hostlist(hosts):
    """Compress host names into Slurm hostlist syntax: gpu-[1-16]."""
    return hostlist.collect_hostlist(list(hosts))


def _node_attributes(hostvars, host):
    """The node's slurm.conf attributes (`CPUs=2`, ...) from its inventory spec."""
    try:
        spec = hostvars[host]["clusterbake_slurm_node"]
    except KeyError:
        raise ValueError(f"host {host} has no clusterbake_slurm_node in the inventory") from None
    missing = [key for key, _ in NODE_SPEC_KEYS if key not in spec]
    if missing:
        raise ValueError(f"clusterbake_slurm_node of host {host} lacks {', '.join(missing)}")
    attributes = [f"{name}={spec[key]}" for key, name in NODE_SPEC_KEYS]
    attributes += [f"{name}={slurm_value(list(spec[key]))}" for key, name in NODE_SPEC_LIST_KEYS if spec.get(key)]
    # Elastic nodes are powered up for jobs and down when idle (slurm.conf(5), State=CLOUD).
    attributes.append("State=CLOUD" if hostvars[host].get("clusterbake_elastic") else "State=UNKNOWN")
    return tuple(attributes)


def slurm_node_lines(hostvars, hosts):
    """One NodeName= line per distinct node spec, hosts merged into a hostlist.

    Lines are ordered by their first host in natural order (cpu-2 before
    cpu-10), so the output does not depend on inventory order.
    """
    hosts_by_attributes = {}
    for host in hosts:
        hosts_by_attributes.setdefault(_node_attributes(hostvars, host), []).append(host)
    ordered = sorted(
        hosts_by_attributes.items(),
        key=lambda item: min(hostlist.numeric_sort_key(host) for host in item[1]),
    )
    return [" ".join((f"NodeName={slurm_hostlist(group_hosts)}", *attributes)) for attributes, group_hosts in ordered]


def slurm_elastic_hosts(hostvars, hosts):
    """The hosts that are powered up and down (State=CLOUD)."""
    return [host for host in hosts if hostvars[host].get("clusterbake_elastic")]


def slurm_partition_suspend_time(hostvars, hosts, idle_times):
    """A partition's SuspendTime: the shortest idle_time of its elastic node groups (None: none)."""
    times = [
        idle_times[hostvars[host]["clusterbake_nodegroup"]]
        for host in hosts
        if hostvars[host].get("clusterbake_elastic") and hostvars[host]["clusterbake_nodegroup"] in idle_times
    ]
    return min(times) if times else None


def slurm_gres_types(hostvars, hosts):
    """Sorted GRES type names (`gpu` of `gpu:h100:8`) used by any of the hosts."""
    names = set()
    for host in hosts:
        for gres in hostvars[host]["clusterbake_slurm_node"].get("gres") or ():
            names.add(str(gres).split(":", 1)[0])
    return sorted(names)


def _gres_parts(gres):
    """`gpu:h100:8` -> ("gpu", "h100", 8); `gpu:8` -> ("gpu", "", 8); `gpu` -> ("gpu", "", 1)."""
    fields = str(gres).split(":")
    if len(fields) > 1 and fields[-1].isdigit():
        count = int(fields[-1])
        fields = fields[:-1]
    else:
        count = 1
    return fields[0], ":".join(fields[1:]), count


def _device_range(first, count):
    return f"/dev/nvidia{first}" if count == 1 else f"/dev/nvidia[{first}-{first + count - 1}]"


def slurm_gres_conf_lines(hostvars, hosts):
    """gres.conf lines: the device files of each node's GPUs, nodes of one spec on one line.

    AutoDetect=nvml would need Slurm's NVML plugin package (Debian 12's slurm-wlm-nvml-plugin, in
    contrib; Ubuntu 24.04, the cloud images' release, has none), so each `gpu[:type]:N` GRES of a node becomes
    `NodeName=<hostlist> Name=gpu Type=<type> File=/dev/nvidia[i-j]`, the devices
    numbered in the order of the node's GRES entries (the NVIDIA driver's minor
    numbers). Other GRES need no gres.conf line (their count is in slurm.conf).
    """
    hosts_by_lines = {}
    for host in hosts:
        lines = []
        first = 0
        for gres in hostvars[host]["clusterbake_slurm_node"].get("gres") or ():
            name, kind, count = _gres_parts(gres)
            if name != "gpu":
                continue
            lines.append(
                " ".join(["Name=gpu", *([f"Type={kind}"] if kind else []), f"File={_device_range(first, count)}"])
            )
            first += count
        if lines:
            hosts_by_lines.setdefault(tuple(lines), []).append(host)
    ordered = sorted(hosts_by_lines.items(), key=lambda item: min(hostlist.numeric_sort_key(host) for host in item[1]))
    return [f"NodeName={slurm_hostlist(group)} {line}" for lines, group in ordered for line in lines]


def slurm_partition_hosts(groups, nodegroups):
    """Hosts of the `nodegroup_<name>` groups of a partition, without repeats.

    Ansible group names cannot hold dashes, so the inventory writes node group
    `gpu-a100` as group `nodegroup_gpu_a100`; both spellings are looked up.
    """
    hosts = []
    for nodegroup in nodegroups:
        group = groups.get(f"nodegroup_{nodegroup}") or groups.get(f"nodegroup_{nodegroup.replace('-', '_')}") or ()
        hosts += [host for host in group if host not in hosts]
    return hosts


def _restart_view(conf_text):
    """The parts of a slurm.conf that reconfigure cannot apply."""
    settings = {}
    nodes = set()
    for raw_line in conf_text.splitlines():
        line = raw_line.split("#", 1)[0].strip()
        if "=" not in line:
            continue
        key, value = line.split("=", 1)
        key = key.strip().lower()
        if key == "nodename":
            nodes.add(line)
        elif key in RESTART_KEYS:
            settings.setdefault(key, []).append(value.strip())
    return settings, nodes


def slurm_conf_restart_required(previous_text, new_text):
    """Whether going from `previous_text` to `new_text` needs daemon restarts.

    True when a key of RESTART_KEYS or any NodeName line (nodes added, removed
    or resized) differs. An empty previous config means nothing runs with an
    old config yet, so the first start applies everything: False.
    """
    if not previous_text.strip():
        return False
    return _restart_view(previous_text) != _restart_view(new_text)


def slurm_conf_restart_digest(conf_text, extra=""):
    """A digest of what slurmd reads only when it starts: the parts of slurm.conf that
    reconfigure cannot apply, plus `extra` (cgroup.conf). A compute node's join bundle
    carries it as a file whose change restarts slurmd, so a bundle is the same on every
    run with the same config (a second run changes nothing) and changes exactly when
    the daemons need a restart."""
    settings, nodes = _restart_view(conf_text)
    view = json.dumps({"settings": settings, "nodes": sorted(nodes), "extra": extra}, sort_keys=True)
    return hashlib.sha256(view.encode()).hexdigest()


class FilterModule:
    """Ansible entry point: exposes the filters above by their function names."""

    def filters(self):
        return {
            function.__name__: function
            for function in (
                slurm_bool,
                slurm_value,
                slurm_settings,
                slurm_hostlist,
                slurm_node_lines,
                slurm_gres_types,
                slurm_gres_conf_lines,
                slurm_elastic_hosts,
                slurm_partition_suspend_time,
                slurm_partition_hosts,
                slurm_conf_restart_required,
                slurm_conf_restart_digest,
            )
        }
