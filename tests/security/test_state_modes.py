"""Security review finding 10: the controller's state and logs were world-readable (the state
directory and each cluster's 0755; `clusterbake exec`'s output, every node's, in a 0644 file)."""

from __future__ import annotations

import os
import stat

import pytest

from clusterbake.state import ClusterDir, open_private


def mode(path) -> int:
    return stat.S_IMODE(os.lstat(path).st_mode)


def test_cluster_state_lives_in_directories_only_their_owner_reads(tmp_path):
    state = tmp_path / "state"
    state.mkdir(mode=0o755)  # as an older clusterbake left it
    os.chmod(state, 0o755)
    cluster = ClusterDir(state / "clusters" / "c")
    cluster.write_state({"nodes": {}})
    assert (mode(state), mode(state / "clusters" / "c")) == (0o700, 0o700)
    assert mode(cluster.state_file) == 0o600


def test_logs_are_written_0600_even_over_an_older_readable_one_and_never_through_a_link(tmp_path):
    logs = tmp_path / "logs"
    logs.mkdir(mode=0o755)
    old = logs / "exec.log"
    old.write_text("old output\n")
    old.chmod(0o644)
    with open_private(old) as out:
        out.write("node output\n")
    assert (mode(old), mode(logs), old.read_text()) == (0o600, 0o700, "node output\n")
    with open_private(old, "a") as out:
        out.write("more\n")
    assert old.read_text() == "node output\nmore\n"
    target = tmp_path / "elsewhere"
    target.write_text("not a log\n")
    (logs / "linked.log").symlink_to(target)
    with pytest.raises(OSError):
        open_private(logs / "linked.log")
    assert target.read_text() == "not a log\n"
