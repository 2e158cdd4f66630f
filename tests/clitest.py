"""The provider tests' CLI (tests/aws, tests/azure): the real CLI and the inventory scripts against a
fake cloud (the CLI as a subprocess, or `cluster.up` in-process), and stopping the fake's server process."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
import yaml

from clusterbake import cluster
from clusterbake.config import load_config
from clusterbake.errors import ClusterbakeError

REPO = Path(__file__).resolve().parents[1]
CB = [str(REPO / ".venv" / "bin" / "clusterbake")]


def write_config(state_dir: Path, config: dict) -> Path:
    path = state_dir / f"{config['cluster_name']}.yaml"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump(config))
    return path


def run_cli(
    env: dict[str, str], state_dir: Path, config: dict | Path, *args: str, check: bool, timeout: int
) -> subprocess.CompletedProcess:
    """The real CLI as a subprocess with `env` (the fake cloud's) and state_dir; a dict config is
    written to <state_dir>/<cluster_name>.yaml first. check: fail with its output unless it exits 0."""
    path = write_config(state_dir, config) if isinstance(config, dict) else config
    result = subprocess.run(
        [*CB, "-c", str(path), *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=REPO,
        env={**env, "CLUSTERBAKE_STATE_DIR": str(state_dir)},
    )
    if check and result.returncode != 0:
        raise AssertionError(
            f"clusterbake {' '.join(args)} exited {result.returncode}\n--- stdout\n{result.stdout[-4000:]}"
            f"\n--- stderr\n{result.stderr[-6000:]}"
        )
    return result


def run_inventory(script: str, env: dict[str, str], state_dir: Path, config_path: Path, **more: str) -> dict:
    """inventories/<script> --list with `env` (the fake cloud's), state_dir and the config, then `more`."""
    result = subprocess.run(
        [str(REPO / "inventories" / script), "--list"],
        capture_output=True,
        text=True,
        timeout=120,
        env={**env, "CLUSTERBAKE_STATE_DIR": str(state_dir), "CLUSTERBAKE_CONFIG": str(config_path), **more},
    )
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout)


def stop_server(server: subprocess.Popen) -> None:
    """Terminate a fake's server process; kill it if it has not exited within 10 s."""
    server.terminate()
    try:
        server.wait(timeout=10)
    except subprocess.TimeoutExpired:
        server.kill()
        server.wait()


def assert_up_refused(
    env: dict[str, str],
    state_dir: Path,
    config: dict,
    status: int,
    expected: str,
    monkeypatch: pytest.MonkeyPatch,
    *,
    in_subprocess: bool,
    timeout: int,
) -> None:
    """`cluster up --provision-only` of `config` against the fake (`env`) exits with `status`, its
    message naming `expected`: the CLI as a subprocess (stderr, no traceback), or `cluster.up` in
    this process (what the CLI runs; a subprocess costs about a second, most of it imports)."""
    if in_subprocess:
        result = run_cli(env, state_dir, config, "cluster", "up", "--provision-only", check=False, timeout=timeout)
        assert result.returncode == status, result.stderr
        assert expected in result.stderr
        assert "Traceback" not in result.stderr
        return
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    monkeypatch.setenv("CLUSTERBAKE_STATE_DIR", str(state_dir))
    path = state_dir / "cluster.yaml"
    path.write_text(yaml.safe_dump(config))
    with pytest.raises(ClusterbakeError) as info:
        cluster.up(load_config(path), path, provision_only=True)
    assert info.value.exit_code == status, str(info.value)
    assert expected in str(info.value)


# A cluster's life through the CLI, without nodes of its own (the permission tests run it on each twin):
# what the operator's permissions must allow.
CLUSTER_LIFE = (
    ("cluster", "up", "--dry-run"),
    ("cluster", "up", "--provision-only"),
    ("cluster", "up", "--provision-only"),
    ("cluster", "status"),
    ("node", "stop", "gpu-1"),
    ("node", "start", "gpu-1"),
    ("cluster", "down"),
)
