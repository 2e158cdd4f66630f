"""The layering of image building and providers, read from the import graph (every
`import` statement, at module level or inside a function):

    clusterbake.images.*     imports no clusterbake.providers module
    clusterbake.providers.*  reaches no image builder: of clusterbake.images, only the store
                             (and what the store itself imports)
    clusterbake.nspawn.*     (below both) imports neither
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[2] / "src"
PACKAGE = SRC / "clusterbake"
STORE = "clusterbake.images.store"


def module_name(path: Path) -> str:
    parts = list(path.relative_to(SRC).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {module_name(path): path for path in PACKAGE.rglob("*.py")}


def imports_of(name: str) -> set[str]:
    """The clusterbake modules a module imports (`from package import module` counts as the module)."""
    path = MODULES[name]
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[: len(base) - node.level + 1]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            found.add(target)
            found |= {f"{target}.{alias.name}" for alias in node.names if f"{target}.{alias.name}" in MODULES}
    return {m for m in found if m in MODULES}


def reachable(start: str) -> set[str]:
    seen, todo = set(), [start]
    while todo:
        current = todo.pop()
        for imported in imports_of(current):
            # Importing a.b.c runs a/__init__ and a/b/__init__ too.
            parts = imported.split(".")
            for i in range(2, len(parts) + 1):
                module = ".".join(parts[:i])
                if module in MODULES and module not in seen:
                    seen.add(module)
                    todo.append(module)
    return seen


def under(prefix: str) -> list[str]:
    return sorted(m for m in MODULES if m == prefix or m.startswith(prefix + "."))


# What a provider may reach of image building: the store and what the store imports.
STORE_SIDE = {STORE, *(m for m in reachable(STORE) if m.startswith("clusterbake.images"))}
BUILDERS = [m for m in under("clusterbake.images") if m not in STORE_SIDE]


def test_the_graph_sees_the_packages():
    builders = {"local", "aws", "azure", "cloud", "base", "packer"}
    assert {f"clusterbake.images.{name}" for name in builders} <= set(BUILDERS)
    # The store's side is small: the package (empty) and what goes into an image's digest.
    assert {STORE, "clusterbake.images", "clusterbake.images.inputs"} == STORE_SIDE
    assert "clusterbake.providers.local.provider" in MODULES and "clusterbake.nspawn.machines" in MODULES
    # The graph follows function-level imports too (images.base picks builders lazily).
    assert "clusterbake.images.azure" in imports_of("clusterbake.images.base")
    assert "clusterbake.images.store" in imports_of("clusterbake.providers.aws.provider")


@pytest.mark.parametrize("module", under("clusterbake.images"))
def test_image_building_imports_no_provider(module):
    assert not [m for m in reachable(module) if m.startswith("clusterbake.providers")]


@pytest.mark.parametrize("module", under("clusterbake.providers"))
def test_providers_import_only_the_image_store(module):
    direct = sorted(m for m in imports_of(module) if m.startswith("clusterbake.images."))
    assert set(direct) <= {STORE}, f"{module} imports {direct}: providers find images in the store only"
    assert not [m for m in reachable(module) if m in BUILDERS]


@pytest.mark.parametrize("module", under("clusterbake.nspawn"))
def test_nspawn_is_below_both(module):
    assert not [m for m in reachable(module) if m.startswith(("clusterbake.providers", "clusterbake.images"))]


def test_the_package_init_imports_nothing():
    # Importing the store must not import a builder through clusterbake/images/__init__.py.
    assert imports_of("clusterbake.images") == set()
