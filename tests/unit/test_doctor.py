"""`clusterbake doctor`'s reading of a node's probe (recorded outputs of probe_command) and of
Slurm's node states: what is a problem, and the fix it names. The live checks run in
tests/integration/test_local_cluster.py (a stopped munge)."""

from __future__ import annotations

from clusterbake.doctor import FAIL, OK, node_findings, parse_probe, probe_command

HEALTHY_COMPUTE = """fabric=tcp
socket_ifname=host0
fi_provider=
nccl_ib_hca=
enabled_munge=enabled
active_munge=active
enabled_slurmd=enabled
active_slurmd=active
enabled_slurmctld=disabled
active_slurmctld=inactive
munge_cred=ok
mount=/home:ok
mount=/shared:ok
"""


def _findings(text: str, role: str = "compute", name: str = "cpu-1"):
    return node_findings(name, role, parse_probe(text))


def test_a_healthy_node_is_one_ok_line_with_its_fabric():
    (finding,) = _findings(HEALTHY_COMPUTE)
    assert finding.status == OK
    assert finding.what == "munge, slurmd active; fabric tcp: NCCL and gloo over sockets on host0"


def test_stopped_munge_and_missing_mount_are_problems_with_fixes():
    text = HEALTHY_COMPUTE.replace("active_munge=active", "active_munge=inactive").replace(
        "mount=/shared:ok", "mount=/shared:missing"
    )
    problems = [f for f in _findings(text) if f.status == FAIL]
    assert [p.what for p in problems] == ["munge is inactive", "/shared is not mounted"]
    assert problems[0].fix.startswith("clusterbake ssh cpu-1 -- systemctl restart munge")


def test_the_head_needs_slurmctld_not_slurmd():
    text = HEALTHY_COMPUTE.replace("active_slurmd=active", "active_slurmd=inactive")
    text = text.replace("active_slurmctld=inactive", "active_slurmctld=failed")
    problems = [f for f in _findings(text, role="head", name="head") if f.status == FAIL]
    assert [p.what for p in problems] == ["slurmctld is failed"]


def test_ib_fabric_without_an_active_port_and_efa_without_a_device_fail():
    ib = HEALTHY_COMPUTE.replace("fabric=tcp", "fabric=ib") + "ib_active=0\nib_ports=8\n"
    problems = [f for f in _findings(ib) if f.status == FAIL]
    assert [p.what for p in problems] == ["fabric ib, but no InfiniBand port is Active"]
    healthy_ib = ib.replace("ib_active=0", "ib_active=8")
    assert _findings(healthy_ib)[-1].what.endswith("fabric ib: NCCL over InfiniBand verbs (8 of 8 ports Active)")
    efa = HEALTHY_COMPUTE.replace("fabric=tcp", "fabric=efa") + "efa_providers=0\n"
    assert [f.what for f in _findings(efa) if f.status == FAIL] == [
        "fabric efa, but `fi_info -p efa` finds no EFA device"
    ]


def test_the_probe_checks_each_mount_point_quoted():
    command = probe_command(["/home", "/data dir"])
    assert "findmnt -n /home " in command and "findmnt -n '/data dir' " in command


def test_a_compute_node_whose_slurmd_lost_oci_conf_is_a_problem():
    """Slurm 22.05 then runs --container steps on the node itself (roles/containers/README.md)."""
    assert [f.status for f in _findings(HEALTHY_COMPUTE + "oci_conf=ok\n")] == [OK]
    problems = [f for f in _findings(HEALTHY_COMPUTE + "oci_conf=missing\n") if f.status == FAIL]
    assert [p.fix for p in problems] == ["clusterbake ssh cpu-1 -- systemctl start clusterbake-oci-conf.service"]
    assert "/var/spool/slurmd/conf-cache/oci.conf" in probe_command([])
