"""slurm.conf rendering: the role's real template and filters, no Ansible run.

The golden files in tests/unit/golden/ are the expected output; after an
intended change, regenerate them with `UPDATE_GOLDEN=1 pytest tests/unit` and
review the diff.
"""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path

import jinja2
import pytest
import yaml
from jinja2.nativetypes import NativeEnvironment

ROLE = Path(__file__).resolve().parents[2] / "roles" / "slurm"
GOLDEN = Path(__file__).resolve().parent / "golden"


def _load_filters():
    spec = importlib.util.spec_from_file_location("slurm_conf_filters", ROLE / "filter_plugins" / "slurm_conf.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


filters = _load_filters()


def _environment(cls=jinja2.Environment, **options):
    # trim_blocks and keep_trailing_newline as Ansible's template module renders.
    env = cls(undefined=jinja2.StrictUndefined, trim_blocks=True, keep_trailing_newline=True, **options)
    env.filters.update(filters.FilterModule().filters())
    return env


def _role_vars(context):
    """The role's defaults and Debian vars, templated defaults resolved against `context`."""
    resolver = _environment(NativeEnvironment)
    values = {}
    for name in ("defaults/main.yml", "vars/Debian.yml"):
        for key, value in yaml.safe_load((ROLE / name).read_text()).items():
            if isinstance(value, str) and "{{" in value:
                value = resolver.from_string(value).render({**context, **values})
            values[key] = value
    return values


def render(template, inventory, inventory_hostname="head", extra=None):
    """Render a role template for one host of an inventory-like dict (`extra`: the role's vars it reads)."""
    context = {
        **inventory["vars"],
        "groups": inventory["groups"],
        "hostvars": inventory["hostvars"],
        "inventory_hostname": inventory_hostname,
    }
    context = {**_role_vars(context), **context, **(extra or {})}
    env = _environment(loader=jinja2.FileSystemLoader(ROLE / "templates"))
    return env.get_template(template).render(context)


def render_string(text, context):
    """A templated value of the role's vars (native types, as Ansible resolves them)."""
    return _environment(NativeEnvironment).from_string(text).render(context)


def node(cpus, real_memory, sockets=1, threads_per_core=1, gres=(), features=()):
    return {
        "cpus": cpus,
        "sockets": sockets,
        "cores_per_socket": cpus // (sockets * threads_per_core),
        "threads_per_core": threads_per_core,
        "real_memory": real_memory,
        "gres": list(gres),
        "features": list(features),
    }


def inventory(nodegroups, partitions, **extra_vars):
    """Inventory in the docs/architecture.md shape: a head plus `nodegroups` {name: (hosts, spec)}."""
    hostvars = {"head": {"ansible_host": "10.77.0.10", "clusterbake_slurm_node": node(2, 2048)}}
    groups = {"slurm_head": ["head"], "slurm_compute": []}
    address = 11
    for name, (hosts, spec) in nodegroups.items():
        groups[f"nodegroup_{name.replace('-', '_')}"] = list(hosts)
        groups["slurm_compute"] += hosts
        for host in hosts:
            hostvars[host] = {"ansible_host": f"10.77.0.{address}", "clusterbake_slurm_node": spec}
            address += 1
    groups["all"] = list(hostvars)
    return {
        "groups": groups,
        "hostvars": hostvars,
        "vars": {"clusterbake_cluster_name": "local", "clusterbake_partitions": partitions, **extra_vars},
    }


def partition(name, nodegroups, default=False, max_time="INFINITE", max_nodes=None):
    return {
        "name": name,
        "nodegroups": nodegroups,
        "default": default,
        "max_time": max_time,
        "max_nodes": max_nodes,
        "state": "UP",
    }


# The local provider's choice: nspawn nodes cannot use Slurm's cgroup plugins.
LOCAL_PLUGINS = {
    "slurm_proctrack_type": "proctrack/linuxproc",
    "slurm_task_plugin": "task/affinity",
    "slurm_jobacct_gather_type": "jobacct_gather/linux",
    "slurm_cgroup_enabled": False,
}

CASES = {
    "local": inventory(
        {"cpu": (["cpu-1", "cpu-2"], node(2, 4096, features=["cpu"]))},
        [partition("cpu", ["cpu"], default=True)],
        **LOCAL_PLUGINS,
    ),
    "gpu": inventory(
        {
            "cpu": ([f"cpu-{i}" for i in range(1, 5)], node(32, 128000, sockets=2, features=["cpu"])),
            # Listed out of order on purpose: the output must not depend on it.
            "gpu-h100": (
                [f"gpu-{i}" for i in (9, 1, 2, 3, 4, 5, 6, 7, 8, 16, 10, 11, 12, 13, 14, 15)],
                node(96, 1900000, sockets=2, threads_per_core=2, gres=["gpu:h100:8"], features=["gpu", "h100"]),
            ),
        },
        [partition("cpu", ["cpu"], default=True), partition("gpu", ["gpu-h100"], max_time="2-00:00:00", max_nodes=8)],
        slurm_config={"slurmdtimeout": 600, "EnforcePartLimits": True, "PropagateResourceLimitsExcept": "MEMLOCK"},
    ),
    # The config's accounting defaults (clusterbake_accounting), on the local shape.
    "accounting": inventory(
        {"cpu": (["cpu-1", "cpu-2"], node(2, 4096, features=["cpu"]))},
        [partition("cpu", ["cpu"], default=True)],
        clusterbake_accounting={
            "enabled": True,
            "enforce_associations": True,
            "fairshare_weight": 10000,
            "age_weight": 1000,
            "decay_half_life": "7-0",
        },
        **LOCAL_PLUGINS,
    ),
}

# cgroup.conf only exists where slurm_cgroup_enabled (not in the local case).
GOLDEN_FILES = [("local", "slurm.conf"), ("gpu", "slurm.conf"), ("gpu", "cgroup.conf"), ("accounting", "slurm.conf")]


@pytest.mark.parametrize(("case", "template"), GOLDEN_FILES)
def test_template_matches_golden_file(case, template):
    rendered = render(f"{template}.j2", CASES[case])
    golden = GOLDEN / f"{case}.{template}"
    if os.environ.get("UPDATE_GOLDEN") == "1":
        golden.write_text(rendered)
    assert rendered == golden.read_text(), f"{golden.name} differs; UPDATE_GOLDEN=1 regenerates it"


def test_local_case_has_one_line_per_node_spec_and_the_local_plugins():
    lines = render("slurm.conf.j2", CASES["local"]).splitlines()
    spec = "CPUs=2 Sockets=1 CoresPerSocket=2 ThreadsPerCore=1 RealMemory=4096 Features=cpu State=UNKNOWN"
    assert f"NodeName=cpu-[1-2] {spec}" in lines
    assert "PartitionName=cpu Nodes=cpu-[1-2] Default=YES MaxTime=INFINITE State=UP" in lines
    assert "ProctrackType=proctrack/linuxproc" in lines
    assert "SlurmctldHost=head(10.77.0.10)" in lines
    assert not any(line.startswith(("GresTypes=", "NodeName=head")) for line in lines)


def test_gpu_case_compresses_hosts_and_declares_gres():
    lines = render("slurm.conf.j2", CASES["gpu"]).splitlines()
    assert "GresTypes=gpu" in lines
    assert any(line.startswith("NodeName=gpu-[1-16] ") and " Gres=gpu:h100:8 " in line for line in lines)
    assert "PartitionName=gpu Nodes=gpu-[1-16] Default=NO MaxTime=2-00:00:00 MaxNodes=8 State=UP" in lines
    # slurm_config overrides in place (case-insensitive) and adds new keys.
    assert "SlurmdTimeout=600" in lines
    assert "EnforcePartLimits=YES" in lines
    assert not any(line.lower().startswith("slurmdtimeout=300") for line in lines)


def test_accounting_sends_jobs_to_slurmdbd_with_gpus_and_orders_by_fair_share():
    lines = render("slurm.conf.j2", CASES["accounting"]).splitlines()
    assert {
        "AccountingStorageType=accounting_storage/slurmdbd",
        "AccountingStorageHost=head",
        "AccountingStoragePort=6819",
        "AccountingStorageTRES=gres/gpu",
        "AccountingStorageEnforce=associations,limits,qos,safe",
        "PriorityType=priority/multifactor",
    } <= set(lines)
    # Without accounting (the local case) none of it, and no enforcement without its switch.
    assert not any(
        line.startswith(("Accounting", "Priority")) for line in render("slurm.conf.j2", CASES["local"]).splitlines()
    )
    relaxed = inventory({}, [], clusterbake_accounting={"enabled": True, "enforce_associations": False})
    assert not any(
        line.startswith("AccountingStorageEnforce") for line in render("slurm.conf.j2", relaxed).splitlines()
    )


def test_turning_accounting_on_or_off_restarts_slurmctld():
    off = render("slurm.conf.j2", CASES["local"])
    on = render("slurm.conf.j2", CASES["accounting"])
    assert filters.slurm_conf_restart_required(off, on) and filters.slurm_conf_restart_required(on, off)
    weights = on.replace("PriorityWeightAge=1000", "PriorityWeightAge=10")
    assert not filters.slurm_conf_restart_required(on, weights)  # scontrol reconfigure applies weights


def test_cgroup_conf_renders_booleans_as_yes_no():
    assert "ConstrainCores=YES" in render("cgroup.conf.j2", CASES["gpu"]).splitlines()


@pytest.mark.parametrize(
    ("hosts", "expected"),
    [
        (["cpu-2", "cpu-1"], "cpu-[1-2]"),
        ([f"gpu-{i}" for i in range(16, 0, -1)], "gpu-[1-16]"),
        (["cpu-1", "cpu-2", "cpu-10"], "cpu-[1-2,10]"),
        (["cpu-1", "gpu-1", "gpu-2"], "cpu-1,gpu-[1-2]"),
        (["head"], "head"),
        ([], ""),
    ],
)
def test_hostlist_compression(hosts, expected):
    assert filters.slurm_hostlist(hosts) == expected


@pytest.mark.parametrize(
    ("value", "expected"),
    [(True, "YES"), (False, "NO"), ("yes", "YES"), ("False", "NO"), ("on", "YES"), (0, "NO")],
)
def test_bool_rendering(value, expected):
    assert filters.slurm_bool(value) == expected


def test_bool_rejects_non_booleans():
    with pytest.raises(ValueError, match="not a boolean"):
        filters.slurm_bool("maybe")


def test_values_render_lists_comma_joined():
    assert filters.slurm_value(["task/cgroup", "task/affinity"]) == "task/cgroup,task/affinity"
    assert filters.slurm_value(2) == "2"


def test_settings_override_case_insensitively_and_drop_none():
    base = {"SlurmdTimeout": 300, "MpiDefault": "none"}
    lines = filters.slurm_settings(base, {"slurmdtimeout": 600, "MpiDefault": None, "New": True})
    assert lines == ["SlurmdTimeout=600", "New=YES"]


def test_node_lines_group_identical_specs_across_names_in_natural_order():
    small, big = node(2, 4096), node(4, 8192)
    hostvars = {h: {"clusterbake_slurm_node": small} for h in ("cpu-10", "cpu-2", "b-1")}
    hostvars["cpu-1"] = {"clusterbake_slurm_node": big}
    lines = filters.slurm_node_lines(hostvars, ["cpu-10", "cpu-2", "cpu-1", "b-1"])
    assert lines == [
        "NodeName=b-1,cpu-[2,10] CPUs=2 Sockets=1 CoresPerSocket=2 ThreadsPerCore=1 RealMemory=4096 State=UNKNOWN",
        "NodeName=cpu-1 CPUs=4 Sockets=1 CoresPerSocket=4 ThreadsPerCore=1 RealMemory=8192 State=UNKNOWN",
    ]


def test_node_lines_name_a_host_without_spec():
    with pytest.raises(ValueError, match="cpu-1 has no clusterbake_slurm_node"):
        filters.slurm_node_lines({"cpu-1": {}}, ["cpu-1"])
    with pytest.raises(ValueError, match=r"lacks .*real_memory"):
        filters.slurm_node_lines({"cpu-1": {"clusterbake_slurm_node": {"cpus": 2}}}, ["cpu-1"])


def test_gres_types_are_the_unique_names():
    hostvars = {
        "a": {"clusterbake_slurm_node": node(2, 1, gres=["gpu:h100:8", "nic:1"])},
        "b": {"clusterbake_slurm_node": node(2, 1, gres=["gpu:a100:4"])},
        "c": {"clusterbake_slurm_node": node(2, 1)},
    }
    assert filters.slurm_gres_types(hostvars, ["a", "b", "c"]) == ["gpu", "nic"]


def test_partition_hosts_find_dashed_node_groups():
    groups = {"nodegroup_gpu_h100": ["gpu-1"], "nodegroup_cpu": ["cpu-1", "cpu-2"]}
    assert filters.slurm_partition_hosts(groups, ["cpu", "gpu-h100", "cpu"]) == ["cpu-1", "cpu-2", "gpu-1"]
    assert filters.slurm_partition_hosts(groups, ["missing"]) == []


BASE_CONF = """\
# comment
ClusterName=local
ProctrackType=proctrack/linuxproc
NodeName=cpu-[1-2] CPUs=2 RealMemory=4096 State=UNKNOWN
PartitionName=cpu Nodes=cpu-[1-2] Default=YES MaxTime=INFINITE State=UP
"""


@pytest.mark.parametrize(
    ("new_conf", "restart"),
    [
        (BASE_CONF, False),
        (BASE_CONF.replace("MaxTime=INFINITE", "MaxTime=1-00:00:00"), False),
        (BASE_CONF + "SchedulerParameters=batch_sched_delay=0\n", False),
        (BASE_CONF.replace("ProctrackType=proctrack/linuxproc", "proctracktype=proctrack/linuxproc # same"), False),
        (BASE_CONF.replace("proctrack/linuxproc", "proctrack/cgroup"), True),
        (BASE_CONF.replace("cpu-[1-2]", "cpu-[1-3]"), True),
        (BASE_CONF.replace("RealMemory=4096", "RealMemory=8192"), True),
        (BASE_CONF + "GresTypes=gpu\n", True),
    ],
)
def test_restart_required_only_for_settings_reconfigure_cannot_apply(new_conf, restart):
    assert filters.slurm_conf_restart_required(BASE_CONF, new_conf) is restart


@pytest.mark.parametrize(
    ("new_conf", "restart"),
    [
        (BASE_CONF.replace("MaxTime=INFINITE", "MaxTime=1-00:00:00"), False),
        (BASE_CONF.replace("proctrack/linuxproc", "proctrack/cgroup"), True),
        (BASE_CONF.replace("cpu-[1-2]", "cpu-[1-3]"), True),
    ],
)
def test_restart_digest_changes_exactly_when_slurmd_must_restart(new_conf, restart):
    # The compute nodes' join bundle carries this digest: it must not change from run to
    # run (a second `cluster up` changes nothing), only when slurmd needs a restart.
    before = filters.slurm_conf_restart_digest(BASE_CONF, "cgroup-a")
    assert filters.slurm_conf_restart_digest(BASE_CONF, "cgroup-a") == before
    assert (filters.slurm_conf_restart_digest(new_conf, "cgroup-a") != before) is restart
    assert filters.slurm_conf_restart_digest(BASE_CONF, "cgroup-b") != before


def test_first_config_needs_no_restart():
    assert filters.slurm_conf_restart_required("", BASE_CONF) is False


def test_topology_conf_is_the_file_the_power_program_writes():
    """The aws head's reconcile loop rewrites topology.conf with clusterbake.topology.render (role
    slurm_power, network.py): byte for byte the template's, or every `cluster up` after it would
    change the file and reconfigure slurmctld. topology.conf(5): `SwitchName=... Nodes=...` for a
    leaf, `SwitchName=... Switches=...` above."""
    from clusterbake.topology import render as render_topology
    from clusterbake.topology import switches

    paths = {"p5-1": ["nn-a", "nn-b1", "nn-c1"], "p5-2": ["nn-a", "nn-b1", "nn-c1"], "p5-4": ["nn-a", "nn-b2", "nn-c3"]}
    lines = switches(paths, [f"p5-{i}" for i in range(1, 6)])
    rendered = render("topology.conf.j2", CASES["local"], extra={"slurm_topology": lines})
    assert rendered == render_topology(lines)
    assert rendered.splitlines()[-7:] == [
        "SwitchName=nn-c1 Nodes=p5-[1-2]",
        "SwitchName=nn-c3 Nodes=p5-4",
        "SwitchName=unplaced Nodes=p5-[3,5]",
        "SwitchName=nn-a Switches=nn-b1,nn-b2",
        "SwitchName=nn-b1 Switches=nn-c1",
        "SwitchName=nn-b2 Switches=nn-c3",
        "SwitchName=root Switches=nn-a,unplaced",
    ]
