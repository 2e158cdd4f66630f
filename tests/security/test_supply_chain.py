"""What the build and the controller install is pinned to exact bytes or exact versions (review finding 15)."""

from __future__ import annotations

import re
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[2]


def lock_entries(text: str) -> dict[str, list[str]]:
    """requirements.lock's requirements: name==version -> its hashes."""
    entries: dict[str, list[str]] = {}
    current = None
    for line in text.splitlines():
        if re.match(r"^[A-Za-z0-9]", line):
            current = line.split()[0]
            entries[current] = []
        elif current and "--hash=sha256:" in line:
            entries[current].append(line.split("--hash=sha256:")[1].split()[0])
    return entries


def test_the_controller_venv_installs_only_hashed_exact_versions():
    entries = lock_entries((REPO / "requirements.lock").read_text())
    assert len(entries) > 50  # the transitive closure, not only the direct dependencies
    assert [name for name in entries if "==" not in name] == []
    assert [name for name, hashes in entries.items() if not hashes] == []
    assert all(re.fullmatch(r"[0-9a-f]{64}", h) for hashes in entries.values() for h in hashes)
    # The build backend too: the project is installed without build isolation, from the lock's setuptools.
    assert any(name.startswith("setuptools==") for name in entries)
    recipe = (REPO / "Makefile").read_text()
    assert "pip install -q --require-hashes -r requirements.lock" in recipe
    assert "pip install -q --no-deps --no-build-isolation -e ." in recipe
    assert "--upgrade pip" not in recipe


def test_packer_plugins_are_pinned_to_one_release():
    text = (REPO / "packer" / "plugins" / "required_plugins.pkr.hcl").read_text()
    versions = re.findall(r'version\s*=\s*"([^"]*)"', text)
    assert len(versions) == 3
    assert all(re.fullmatch(r"= \d+\.\d+\.\d+", v) for v in versions), versions


def test_the_default_cluster_trusts_no_extra_certificate_authority():
    config = yaml.safe_load((REPO / "clusterbake.yaml").read_text())
    assert config["image"].get("extra_ca_certificates", []) == []
