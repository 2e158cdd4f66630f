"""`clusterbake exec --stdin FILE`: every node's command gets FILE on its input, and the log never
has it (it may be a secret: ops munge_key hands the new key to the nodes so)."""

from __future__ import annotations

from clusterbake import cli, fanout, remote
from clusterbake.providers.base import NodeStatus

CONFIG = "cluster_name: demo\nnode_groups:\n  - name: cpu\n    count: 2\n"


def test_a_missing_stdin_file_is_bad_input(tmp_path, capsys):
    path = tmp_path / "cluster.yaml"
    path.write_text(CONFIG)
    assert cli.main(["-c", str(path), "exec", "--stdin", str(tmp_path / "nope"), "--", "true"]) == 2
    assert "exec --stdin: cannot read" in capsys.readouterr().err


def test_stdin_reaches_every_running_node_and_stays_out_of_the_log(tmp_path, monkeypatch):
    class Provider:
        def status(self):
            return [
                NodeStatus("cpu-1", "compute", "cpu", "a", "running"),
                NodeStatus("cpu-2", "compute", "cpu", "b", "stopped"),
            ]

        def endpoint(self, name):
            return name

    seen = {}

    def run_many(endpoints, command, *, stdin=None, timeout=120, check=False):
        seen.update(endpoints=sorted(endpoints), command=command, stdin=stdin)
        return {name: remote.Result(name, command, 0, b"ok\n", b"") for name in endpoints}

    monkeypatch.setattr(remote, "run_many", run_many)
    log = tmp_path / "exec.log"
    rows = fanout.run(Provider(), ["cpu-1", "cpu-2"], "cat > /tmp/key", 10, log, stdin=b"s3cret")
    assert seen == {"endpoints": ["cpu-1"], "command": "cat > /tmp/key", "stdin": b"s3cret"}
    assert [(r.node, r.status, r.tried) for r in rows] == [("cpu-1", "0", True), ("cpu-2", "stopped", False)]
    assert "s3cret" not in log.read_text()
