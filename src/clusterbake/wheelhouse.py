"""The training environment's wheelhouse, filled on the build host.

Nodes have no route to a package index, so every wheel they install comes from
here (`pip install --no-index --find-links`). DeepSpeed ships as an sdist whose
build needs torch, so it is built here once, without build isolation, against
the pinned torch. Cached by the pins and the Python version.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path

from clusterbake.paths import repo_root
from clusterbake.progress import run_logged, say

REQUIREMENTS = Path("roles") / "training_env" / "files" / "requirements.in"
# DeepSpeed ops compiled into its wheel (DS_BUILD_<OP>=1): loaded at once instead
# of JIT-compiled on every node at a job's first step. CPU: the shared-memory
# collective op; a GPU build host adds its CUDA ops (DS_BUILD_FUSED_ADAM, ...).
DEEPSPEED_PREBUILT_OPS = ("DS_BUILD_SHM_COMM",)
# Bumped when the way the wheelhouse is built changes (part of its cache key).
WHEELHOUSE_FORMAT = "3"


def requirements_file() -> Path:
    return repo_root() / REQUIREMENTS


def python_tag() -> str:
    return f"cp{sys.version_info.major}{sys.version_info.minor}"


def wheelhouse_key(extra: Sequence[str] = ()) -> str:
    """What the wheelhouse is made from: the pins, the team's extra requirements, the Python, the prebuilt ops."""
    h = hashlib.sha256(requirements_file().read_bytes())
    h.update(python_tag().encode())
    h.update(" ".join(DEEPSPEED_PREBUILT_OPS).encode())
    h.update(WHEELHOUSE_FORMAT.encode())
    if extra:  # (a wheelhouse without them keeps its key)
        h.update(json.dumps(list(extra)).encode())
    return h.hexdigest()[:16]


def ensure_wheelhouse(cache: Path, log_file: Path, extra: Sequence[str] = ()) -> Path:
    """A directory of wheels for the pinned requirements, `extra` (training.extra_requirements, resolved
    with them: one consistent set) and all they need."""
    target = cache / f"wheelhouse-{python_tag()}-{wheelhouse_key(extra)}"
    if (target / "COMPLETE").exists():
        say(f"    wheelhouse cached: {target}")
        return target
    work = target.with_name(target.name + ".tmp")
    shutil.rmtree(work, ignore_errors=True)
    (work / "wheels").mkdir(parents=True)
    try:
        builder = work / "venv"
        run_logged([sys.executable, "-m", "venv", str(builder)], log_file, what="venv for the wheelhouse")
        pip = [str(builder / "bin" / "python"), "-m", "pip", "--disable-pip-version-check"]
        requirements = requirements_file()
        pins = [line.strip() for line in requirements.read_text().splitlines() if "==" in line]
        torch_pin = next(pin for pin in pins if pin.startswith("torch=="))
        deepspeed_pin = next(pin for pin in pins if pin.startswith("deepspeed=="))
        wheels = work / "wheels"
        # torch first: DeepSpeed's build imports it.
        run_logged([*pip, "install", torch_pin, "setuptools", "wheel"], log_file, what="pip install torch")
        ops_env = {**os.environ, **dict.fromkeys(DEEPSPEED_PREBUILT_OPS, "1")}
        run_logged(
            # From the sdist: a prebuilt wheel on an index carries no compiled ops.
            [
                *pip,
                "wheel",
                "--no-deps",
                "--no-build-isolation",
                "--no-binary=deepspeed",
                "--no-cache-dir",
                "-w",
                str(wheels),
                deepspeed_pin,
            ],
            log_file,
            env=ops_env,
            what="building DeepSpeed with its ops",
        )
        extra_file = work / "extra-requirements.txt"
        extra_file.write_text("".join(f"{line}\n" for line in extra))
        run_logged(
            [*pip, "install", "--find-links", str(wheels), "-r", str(requirements), "-r", str(extra_file)],
            log_file,
            what="pip install" + (f" (with {', '.join(extra)})" if extra else ""),
        )
        frozen = subprocess.run([*pip, "freeze", "--all"], capture_output=True, text=True, check=True).stdout
        skip = ("pip==",)
        locked = [line for line in frozen.splitlines() if "==" in line and not line.startswith(skip)]
        (work / "requirements.lock").write_text("\n".join(locked) + "\n")
        run_logged(
            [
                *pip,
                "wheel",
                "--no-deps",
                "--find-links",
                str(wheels),
                "-w",
                str(wheels),
                "-r",
                str(work / "requirements.lock"),
            ],
            log_file,
            what="pip wheel",
        )
        shutil.rmtree(builder)
        (work / "COMPLETE").write_text("ok\n")
    except BaseException:
        shutil.rmtree(work, ignore_errors=True)
        raise
    shutil.rmtree(target, ignore_errors=True)
    work.rename(target)
    return target
