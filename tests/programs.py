"""The node programs of roles/*/files (scripts without a .py suffix) as modules, for the tests."""

from __future__ import annotations

import importlib.machinery
import importlib.util
from pathlib import Path
from types import ModuleType


def load_program(name: str, path: Path) -> ModuleType:
    """The program at `path` as module `name` (run once, not put in sys.modules)."""
    loader = importlib.machinery.SourceFileLoader(name, str(path))
    spec = importlib.util.spec_from_loader(loader.name, loader)
    module = importlib.util.module_from_spec(spec)
    loader.exec_module(module)
    return module
