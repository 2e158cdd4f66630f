"""The roles' fallbacks for the config's sections (what a play without clusterbake's inventory
gets) are the schema's defaults: the numbers live in the schema, and the roles' copies may not
drift from it. The inventory passes each section complete (test_inventory.py)."""

from __future__ import annotations

from pathlib import Path

import yaml

from clusterbake.config import HealthConfig, PowerConfig, RecoveryConfig

ROLES = Path(__file__).resolve().parents[2] / "roles"


def role_vars(role: str) -> dict:
    return yaml.safe_load((ROLES / role / "vars" / "main.yml").read_text())


def test_slurm_power_falls_back_to_the_schemas_power_and_recovery_defaults():
    variables = role_vars("slurm_power")
    power = PowerConfig()
    expected = power.model_dump() | {"resume_timeout": power.effective_resume_timeout(False), "idle_times": {}}
    assert variables["__slurm_power_schema_settings"] == expected
    assert variables["__slurm_power_schema_recovery"] == RecoveryConfig().model_dump()


def test_node_health_falls_back_to_the_schemas_health_defaults():
    assert role_vars("node_health")["__node_health_schema_settings"] == HealthConfig().model_dump()


def test_the_inventory_passes_every_key_the_roles_fall_back_for():
    from clusterbake.config import ClusterConfig
    from clusterbake.inventory import cluster_vars

    config = ClusterConfig.model_validate({"cluster_name": "x", "node_groups": [{"name": "cpu", "count": 1}]})
    variables = cluster_vars(config)
    assert set(variables["clusterbake_power"]) == set(role_vars("slurm_power")["__slurm_power_schema_settings"])
    assert set(variables["clusterbake_recovery"]) == set(role_vars("slurm_power")["__slurm_power_schema_recovery"])
    assert set(variables["clusterbake_health"]) == set(role_vars("node_health")["__node_health_schema_settings"])
