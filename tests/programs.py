"""The node programs of roles/*/files (scripts without a .py suffix) as modules, for the tests."""

from __future__ import annotations

import importlib
import importlib.machinery
import importlib.util
import sys
from pathlib import Path
from types import ModuleType

POWER_FILES = Path(__file__).resolve().parents[1] / "roles" / "slurm_power" / "files"
POWER_MODULES = ("core", "cloud", "local", "aws", "azure", "network", "commands")


def load_program(name: str, path: Path) -> ModuleType:
    """The program at `path` as module `name` (run once, not put in sys.modules)."""
    loader = importlib.machinery.SourceFileLoader(name, str(path))
    spec = importlib.util.spec_from_loader(loader.name, loader)
    module = importlib.util.module_from_spec(spec)
    loader.exec_module(module)
    return module


def power_program(monkeypatch, state: Path) -> ModuleType:
    """Role slurm_power's package clusterbake_power with its modules (`core`, `cloud`, `aws`, ...), its
    state file at `state`. Patch a name where the program looks it up: scontrol and expand in
    `core`, the backend in `commands`."""
    if str(POWER_FILES) not in sys.path:
        sys.path.insert(0, str(POWER_FILES))
    package = importlib.import_module("clusterbake_power")
    for name in POWER_MODULES:
        importlib.import_module(f"clusterbake_power.{name}")
    monkeypatch.setattr(package.core, "STATE", state)
    return package


def power_settings(**changes) -> dict:
    """What every power.json holds, as role slurm_power writes it from the schema's defaults (an
    inventory of a cluster without elastic nodes), then `changes`."""
    from clusterbake.config import PowerConfig, RecoveryConfig

    power, recovery = PowerConfig(), RecoveryConfig()
    return {
        "provider": "local",
        "elastic_nodes": [],
        "static_nodes": [],
        "replace_lost_nodes": recovery.replace_lost_nodes,
        "failed_node_cooldown": power.failed_node_cooldown,
        "resume_timeout": power.effective_resume_timeout(False),
        "orphan_grace": power.orphan_grace,
        "capacity_cooldown": power.capacity_cooldown,
    } | changes
