"""The provider tests' CLI (tests/aws, tests/azure): the real CLI and the inventory scripts against a
fake cloud, and stopping the fake's server process.

The CLI runs in this process by default: `clusterbake`'s own main() with the environment, arguments,
working directory and output streams a subprocess would have, and what a process keeps for its life
(the Azure credential, price caches, SSH connections) forgotten before and after each run. A subprocess costs
about a second of CPU before it does anything, most of it imports (the Azure SDK's alone 0.9 s, measured
with py-spy over tests/azure/test_azure_elastic.py: half of its CLI processes' samples were imports), and
the node-less tests start hundreds. `in_subprocess=True` runs the installed console script instead,
for the tests about the process itself (exit status and stderr of an error, no traceback).
"""

from __future__ import annotations

import contextlib
import faulthandler
import io
import json
import os
import subprocess
import sys
import traceback
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from clusterbake import cli, cluster, remote
from clusterbake.config import load_config
from clusterbake.errors import ClusterbakeError
from clusterbake.providers.aws import prices as aws_prices
from clusterbake.providers.azure import api as azure_api
from clusterbake.providers.azure import prices as azure_prices

REPO = Path(__file__).resolve().parents[1]
CB = [str(REPO / ".venv" / "bin" / "clusterbake")]


def write_config(state_dir: Path, config: dict) -> Path:
    path = state_dir / f"{config['cluster_name']}.yaml"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump(config))
    return path


def run_cli(
    env: dict[str, str],
    state_dir: Path,
    config: dict | Path,
    *args: str,
    check: bool,
    timeout: int,
    in_subprocess: bool = False,
) -> subprocess.CompletedProcess:
    """The real CLI with `env` (the fake cloud's) and state_dir, in this process unless in_subprocess; a
    dict config is written to <state_dir>/<cluster_name>.yaml first. check: fail with its output unless
    it exits 0."""
    path = write_config(state_dir, config) if isinstance(config, dict) else config
    argv = ["-c", str(path), *args]
    environ = {**env, "CLUSTERBAKE_STATE_DIR": str(state_dir)}
    if in_subprocess:
        result = subprocess.run([*CB, *argv], capture_output=True, text=True, timeout=timeout, cwd=REPO, env=environ)
    else:
        result = cli_in_process(argv, environ, timeout)
    if check and result.returncode != 0:
        raise AssertionError(
            f"clusterbake {' '.join(args)} exited {result.returncode}\n--- stdout\n{result.stdout[-4000:]}"
            f"\n--- stderr\n{result.stderr[-6000:]}"
        )
    return result


@contextlib.contextmanager
def process_environment(environ: dict[str, str], argv0: str) -> Iterator[None]:
    """os.environ exactly `environ` (as subprocess's env= gives a child), sys.argv[0] `argv0` (argparse's
    program name), the repository the working directory; all as before afterwards."""
    saved_environ, saved_argv = dict(os.environ), sys.argv
    os.environ.clear()
    os.environ.update(environ)
    sys.argv = [argv0]
    try:
        with contextlib.chdir(REPO):
            yield
    finally:
        os.environ.clear()
        os.environ.update(saved_environ)
        sys.argv = saved_argv


def forget_process_state() -> None:
    """What the CLI keeps for a process's life, which the next in-process run must not find."""
    azure_api.credential.cache_clear()
    aws_prices.clear_cache()
    azure_prices.clear_cache()
    remote.close_all()


def cli_in_process(argv: list[str], environ: dict[str, str], timeout: int) -> subprocess.CompletedProcess:
    """`clusterbake ARGV` as cli.main runs it for the console script: its exit status (an uncaught
    exception: its traceback on stderr and 1, as the interpreter does) and its stdout and stderr. One
    that outlives `timeout` ends this process with every thread's traceback (faulthandler): a hung
    run fails its test (xdist reports the worker's crash) instead of hanging the suite."""
    stdout, stderr = io.StringIO(), io.StringIO()
    # Before too: a test's own in-process provider calls (another twin's environment) fill the same
    # caches; a rehearsal's run found another twin's Azure token ("The access token is invalid").
    forget_process_state()
    faulthandler.dump_traceback_later(timeout, exit=True, file=sys.__stderr__)
    try:
        with (
            process_environment(environ, CB[0]),
            contextlib.redirect_stdout(stdout),
            contextlib.redirect_stderr(stderr),
        ):
            try:
                status = cli.main(argv)
            except SystemExit as exit:  # argparse's usage errors, --help
                status = exit.code if isinstance(exit.code, int) else (0 if exit.code is None else 1)
                if isinstance(exit.code, str):
                    print(exit.code, file=sys.stderr)
            except Exception:
                traceback.print_exc()
                status = 1
    finally:
        faulthandler.cancel_dump_traceback_later()
        forget_process_state()
    return subprocess.CompletedProcess([*CB, *argv], status or 0, stdout.getvalue(), stderr.getvalue())


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
        argv = ("cluster", "up", "--provision-only")
        result = run_cli(env, state_dir, config, *argv, check=False, timeout=timeout, in_subprocess=True)
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
