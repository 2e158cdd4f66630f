"""Phase timing on stderr and a log file per run: what is happening, how long it took."""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

from clusterbake.errors import CommandFailed
from clusterbake.state import open_private


def say(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


@contextmanager
def phase(title: str) -> Iterator[None]:
    """Print a phase's start and its duration, also when it fails."""
    say(f"==> {title}")
    started = time.monotonic()
    try:
        yield
    except BaseException:
        say(f"<== {title}: failed after {time.monotonic() - started:.1f}s")
        raise
    say(f"<== {title}: {time.monotonic() - started:.1f}s")


def run_logged(
    argv: list[str],
    log_file: Path,
    *,
    env: dict[str, str] | None = None,
    cwd: Path | None = None,
    on_line: Callable[[str], None] | None = None,
    what: str | None = None,
) -> list[str]:
    """Run a command with its output appended to log_file; each line goes to on_line.

    Raises CommandFailed naming the log file when the command fails.
    """
    lines: list[str] = []
    with open_private(log_file, "a") as log:  # Ansible's and Packer's output: the cluster's to read
        log.write(f"\n$ {' '.join(argv)}\n")
        log.flush()
        with subprocess.Popen(
            argv,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            text=True,
            env=env,
            cwd=cwd,
            bufsize=1,
        ) as proc:
            assert proc.stdout is not None
            for line in proc.stdout:
                log.write(line)
                line = line.rstrip("\n")
                lines.append(line)
                if on_line:
                    on_line(line)
        log.flush()
    if proc.returncode != 0:
        tail = "\n".join("    " + line for line in lines[-15:])
        raise CommandFailed(
            f"{what or argv[0]} failed (exit {proc.returncode}); last lines:\n{tail}\nfull log: {log_file}",
            log_file=str(log_file),
        )
    return lines
