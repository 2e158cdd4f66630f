"""A shell command on a test cluster's node, as `clusterbake ssh NODE -- COMMAND` runs it (through
clusterbake.remote, root or sudo as the provider's endpoint says), but over the connection this
test run keeps open to the node. A command then costs a channel (about 6 ms of CPU here), not a new
process and an SSH login (about 0.45 s): the tests' polling loops were the suite's largest CPU cost.
A connection that dropped (the node restarted) is opened again by clusterbake.remote, and one that
failed is forgotten. The CLI's own `ssh` keeps its tests, which call it as a command."""

from __future__ import annotations

import subprocess


def run_on(endpoint, command: str, check: bool = True, timeout: float = 900, input=None):
    """The command's CompletedProcess (text); 255 and the error when the node cannot be reached
    or the command outlived `timeout`, as ssh; check=True: an AssertionError for a non-zero exit."""
    from clusterbake import remote

    argv = ["on", endpoint.name, command]
    stdin = input.encode() if isinstance(input, str) else input
    try:
        done = remote.run(endpoint, command, stdin=stdin, timeout=timeout, check=False)
        result = subprocess.CompletedProcess(
            argv, done.returncode, done.stdout.decode(errors="replace"), done.stderr.decode(errors="replace")
        )
    except remote.RemoteError as exc:
        remote.disconnect(endpoint)
        result = subprocess.CompletedProcess(argv, 255, "", f"clusterbake: error: {exc}\n")
    if check and result.returncode != 0:
        raise AssertionError(
            f"on {endpoint.name}: {command} exited {result.returncode}\n--- stdout\n{result.stdout[-4000:]}"
            f"\n--- stderr\n{result.stderr[-6000:]}"
        )
    return result
