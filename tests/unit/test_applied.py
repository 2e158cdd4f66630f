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
