"""The local power agent's transport (security finding 17): the agent (providers/local/power_agent.py)
serves on a Unix socket, and the head's power program (role slurm_power, LocalAgent) calls it there
with its token. Both real; the nodes behind the agent are a stand-in (the integration tests,
tests/integration/test_elastic.py, start real ones through it)."""

from __future__ import annotations

import stat
import threading
import time
from pathlib import Path

import programs
import pytest

from clusterbake.providers.local import power_agent


class Nodes:
    """What the agent asks of the provider: the machines and powering them."""

    token = "the-token"

    def __init__(self):
        self.asked: list[tuple[str, list[str]]] = []

    def nodes(self) -> dict:
        return {"running": ["cpu-1"], "planned": ["cpu-1", "cpu-2"]}

    def power(self, action: str, nodes: list[str]) -> dict[str, str]:
        self.asked.append((action, nodes))
        return {n: "ok" for n in nodes}


@pytest.fixture
def agent(tmp_path):
    socket_path = tmp_path / "power-agent" / power_agent.SOCKET_NAME
    socket_path.parent.mkdir()
    nodes = Nodes()
    threading.Thread(target=power_agent.serve, args=(nodes, socket_path), daemon=True).start()
    deadline = time.monotonic() + 10
    while not socket_path.exists():
        assert time.monotonic() < deadline, "the agent did not listen"
        time.sleep(0.05)
    return socket_path, nodes


@pytest.fixture
def power(tmp_path, monkeypatch):
    return programs.power_program(monkeypatch, tmp_path / "state.json")


def client(power, tmp_path: Path, url: str, token: str):
    token_file = tmp_path / "power.token"
    token_file.write_text(token + "\n")
    return power.local.LocalAgent({"agent": url, "token_file": str(token_file)})


def test_the_head_calls_the_agent_on_its_socket_with_its_token(agent, power, tmp_path):
    socket_path, nodes = agent
    assert stat.S_IMODE(socket_path.stat().st_mode) == 0o666  # the head's SlurmUser connects; the token decides
    head = client(power, tmp_path, f"unix://{socket_path}", Nodes.token)
    assert head.running() == {"cpu-1"}
    assert head.power("start", ["cpu-2"]) == {"cpu-2": "ok"}
    assert nodes.asked == [("start", ["cpu-2"])]


def test_a_caller_without_the_token_is_refused(agent, power, tmp_path):
    socket_path, nodes = agent
    intruder = client(power, tmp_path, f"unix://{socket_path}", "guessed")
    with pytest.raises(power.core.PowerError, match="HTTP 401"):
        intruder.power("start", ["cpu-2"])
    assert nodes.asked == []


def test_an_agent_on_the_network_is_not_called(power, tmp_path):
    with pytest.raises(power.core.PowerError, match="expected unix://"):
        client(power, tmp_path, "http://10.77.0.1:6820", Nodes.token)
