"""What decides that a `cluster up` may skip Ansible: the inputs' digest and the head's drift."""

from clusterbake.applied import HeadState, inputs_digest, read_record, write_record
from clusterbake.config import ClusterConfig

CONFIG = ClusterConfig.model_validate({"cluster_name": "applied", "node_groups": [{"name": "cpu", "count": 1}]})
INVENTORY = {"all": {"vars": {"slurm_cluster_name": "applied"}}, "_meta": {"hostvars": {"head": {"a": 1}}}}


def test_the_digest_follows_inventory_and_secrets_not_rendered_bundles(tmp_path):
    secrets = tmp_path / "secrets"
    (secrets / "join").mkdir(parents=True)
    (secrets / "munge.key").write_bytes(b"k" * 32)
    first = inputs_digest(CONFIG, INVENTORY, secrets)
    assert inputs_digest(CONFIG, INVENTORY, secrets) == first
    (secrets / "join" / "cpu.json").write_text("{}")  # the play's own output
    assert inputs_digest(CONFIG, INVENTORY, secrets) == first
    changed = {**INVENTORY, "_meta": {"hostvars": {"head": {"a": 2}}}}
    assert inputs_digest(CONFIG, changed, secrets) != first
    (secrets / "munge.key").write_bytes(b"n" * 32)
    assert inputs_digest(CONFIG, INVENTORY, secrets) != first


def test_drift_names_each_file_and_service():
    applied = {"files": {"/etc/slurm/slurm.conf": "aa", "/etc/munge/munge.key": "bb"}, "services": {"munge": "active"}}
    same = HeadState(dict(applied["files"]), {"munge": "active", "slurmctld": "active"})
    assert same.drift(applied) == []
    now = HeadState(
        {"/etc/slurm/slurm.conf": "cc", "/etc/slurm/extra.conf": "dd"}, {"munge": "active", "slurmctld": "failed"}
    )
    assert now.drift(applied) == [
        "/etc/munge/munge.key removed",
        "/etc/slurm/extra.conf added",
        "/etc/slurm/slurm.conf changed",
        "slurmctld is failed",
    ]


def test_the_record_is_private_and_round_trips(tmp_path):
    assert read_record(tmp_path) == {}
    write_record(tmp_path, "d" * 64, HeadState({"/etc/x": "aa"}, {"munge": "active"}))
    assert (tmp_path / "applied.json").stat().st_mode & 0o777 == 0o600
    assert read_record(tmp_path) == {
        "inputs": "d" * 64,
        "head": {"files": {"/etc/x": "aa"}, "services": {"munge": "active"}},
    }


def test_whether_a_node_runs_is_not_an_input(tmp_path):
    # slurm.conf lists every planned node, running or not: a node that booted, stopped or powered
    # down since the last configure is no reason to run the play again.
    def inventory(running: bool, power: str) -> dict:
        hostvars = {"head": {"a": 1}, "cpu-1": {"a": 1, "clusterbake_running": running}}
        hostvars["cpu-1"]["clusterbake_power_state"] = power
        return {**INVENTORY, "_meta": {"hostvars": hostvars}}

    first = inputs_digest(CONFIG, inventory(True, "running"), tmp_path)
    assert inputs_digest(CONFIG, inventory(False, "deallocated"), tmp_path) == first


def test_ops_playbooks_and_docs_are_not_inputs(tmp_path):
    import hashlib

    from clusterbake.images.inputs import hash_repository_inputs

    for name, text in (("ansible/cluster.yml", "a"), ("ansible/ops/drain.yml", "b"), ("roles/x/README.md", "c")):
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(text)

    def digest() -> str:
        h = hashlib.sha256()
        hash_repository_inputs(h, tmp_path)
        return h.hexdigest()

    first = digest()
    (tmp_path / "ansible/ops/drain.yml").write_text("changed")
    (tmp_path / "roles/x/README.md").write_text("changed")
    assert digest() == first
    (tmp_path / "ansible/cluster.yml").write_text("changed")
    assert digest() != first
