"""clusterbake.remote against a real OpenSSH sshd on 127.0.0.1 (started here, as root)."""

from __future__ import annotations

import os
import shlex
import shutil
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from paramiko.hostkeys import HostKeys

from clusterbake import remote
from clusterbake.remote import Endpoint, HostKeyError, RemoteError, RemoteTimeout

SSHD = "/usr/sbin/sshd"
REPO = Path(__file__).resolve().parents[2]


# Stands in for sudo (not installed on every test host): checks how it is called, then runs the
# command line with sh as sudo would, so the quoting through the login shell is tested end to end.
FAKE_SUDO = """#!/bin/sh
[ "$1" = -n ] && [ "$2" = sh ] && [ "$3" = -c ] && [ $# -eq 4 ] || { echo "fake sudo: bad args: $*" >&2; exit 99; }
SUDO_WRAPPED=yes exec sh -c "$4"
"""


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def keygen(path: Path) -> Path:
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", "", "-f", str(path)], check=True)
    return path


def public_key(path: Path) -> str:
    """`type base64` of a key pair's public half."""
    return " ".join(path.with_name(path.name + ".pub").read_text().split()[:2])


class Sshd:
    """One sshd -D process: a config, a host key, the client's authorized key, a log."""

    def __init__(self, root: Path, client_key: Path, host_key: Path, port: int | None = None):
        self.root = root
        self.port = port or free_port()
        self.host_key = host_key
        self.log = root / f"sshd-{self.port}.log"
        bin_dir = root / "bin"
        bin_dir.mkdir(exist_ok=True)
        (bin_dir / "sudo").write_text(FAKE_SUDO)
        (bin_dir / "sudo").chmod(0o755)
        self.config = root / f"sshd_config-{self.port}"
        self.config.write_text(
            f"Port {self.port}\nListenAddress 127.0.0.1\nHostKey {host_key}\n"
            f"AuthorizedKeysFile {client_key}.pub\nPidFile none\nUsePAM no\nStrictModes no\n"
            "PasswordAuthentication no\nKbdInteractiveAuthentication no\nPermitRootLogin prohibit-password\n"
            f"LogLevel VERBOSE\nSetEnv PATH={bin_dir}:/usr/local/bin:/usr/bin:/bin:/usr/sbin:/sbin\n"
        )
        self.process: subprocess.Popen | None = None

    def start(self) -> Sshd:
        Path("/run/sshd").mkdir(mode=0o755, exist_ok=True)  # sshd's privilege separation directory
        subprocess.run([SSHD, "-t", "-f", str(self.config)], check=True)
        self.process = subprocess.Popen(
            [SSHD, "-D", "-e", "-f", str(self.config)], stdout=subprocess.DEVNULL, stderr=self.log.open("ab")
        )
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=1):
                    return self
            except OSError:
                time.sleep(0.05)
        self.stop()
        raise AssertionError(f"sshd did not listen on {self.port}: {self.log.read_text()}")

    def stop(self) -> None:
        if self.process and self.process.poll() is None:
            self.process.terminate()
            self.process.wait(10)

    def logins(self) -> int:
        return self.log.read_text().count("Accepted publickey for root")

    def known_hosts_line(self, names: str | None = None) -> str:
        return f"{names or f'[127.0.0.1]:{self.port}'} {public_key(self.host_key)}\n"


@pytest.fixture(scope="module")
def keys(tmp_path_factory):
    """Every test with a server needs these (tests without one run anywhere)."""
    missing = None
    if not Path(SSHD).exists():
        missing = "needs OpenSSH's sshd (apt-get install openssh-server; `make deps` installs it)"
    elif os.geteuid() != 0:
        missing = "sshd logs in as root here: run as root"
    if missing and os.environ.get("CLUSTERBAKE_REQUIRE_INTEGRATION"):
        pytest.fail(f"{missing}; this run requires these tests (CI)")
    if missing:
        pytest.skip(missing)
    root = tmp_path_factory.mktemp("remote-keys")
    return {
        "root": root,
        "client": keygen(root / "id_ed25519"),
        "host": keygen(root / "host_ed25519"),
        "other_host": keygen(root / "other_host_ed25519"),
    }


@pytest.fixture(scope="module")
def sshd(keys):
    server = Sshd(keys["root"], keys["client"], keys["host"]).start()
    yield server
    server.stop()


@pytest.fixture(autouse=True)
def fresh_connections():
    remote.close_all()
    yield
    remote.close_all()


def endpoint(sshd: Sshd, keys, known_hosts: Path, **kwargs) -> Endpoint:
    fields = {"name": "node1", "host": "127.0.0.1", "user": "root", "key_file": keys["client"], "port": sshd.port}
    return Endpoint(known_hosts=known_hosts, **{**fields, **kwargs})


@pytest.fixture
def pinned(sshd, keys, tmp_path) -> Endpoint:
    known_hosts = tmp_path / "known_hosts"
    # The local provider's format: `name,address type key` (here with the port, as it is not 22).
    known_hosts.write_text(sshd.known_hosts_line(f"node1,[127.0.0.1]:{sshd.port}"))
    return endpoint(sshd, keys, known_hosts)


def test_providers_do_not_import_the_ssh_stack():
    """The inventory scripts import the providers, maybe with an interpreter outside the venv."""
    code = (
        "import sys, clusterbake.inventory_script, clusterbake.providers.local.provider, "
        "clusterbake.providers.aws.provider, clusterbake.cluster, clusterbake.jobs, clusterbake.remote; "
        "print(sorted(m for m in sys.modules if m.split('.')[0] in ('paramiko', 'fabric', 'invoke')))"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert done.stdout == "[]\n"


# --- commands ----------------------------------------------------------------------------


def test_stdin_bytes_and_binary_stdout(pinned):
    payload = bytes(range(256)) * 4096 + b"\x00\xff end"  # 1 MiB of every byte value, no newline at the end
    result = remote.run(pinned, "cat", stdin=payload)
    assert result.returncode == 0 and result.stdout == payload and result.stderr == b""
    # A tar stream through stdin, unpacked there and read back as bytes.
    result = remote.run(pinned, "wc -c", stdin=payload)
    assert result.stdout.strip() == str(len(payload)).encode()
    # Without stdin the command reads EOF at once (it does not hang).
    assert remote.run(pinned, "cat", timeout=10).stdout == b""


def test_exit_status_stderr_and_check(pinned):
    result = remote.run(pinned, "echo out; echo err >&2; exit 3", check=False)
    assert (result.returncode, result.stdout, result.stderr) == (3, b"out\n", b"err\n")
    with pytest.raises(RemoteError) as info:
        remote.run(pinned, "echo 'no such thing' >&2; exit 7\necho second line")
    message = str(info.value)
    assert message.startswith("on node1: echo 'no such thing' >&2; exit 7 failed (exit status 7)")
    assert message.endswith(": no such thing") and "second line" not in message
    with pytest.raises(RemoteTimeout, match="on node1: sleep 5 did not finish within 1s"):
        remote.run(pinned, "sleep 5", timeout=1)


def test_list_commands_are_quoted(pinned):
    words = ["it's", 'say "hi"', "$HOME", "a  b", "`id`", "x;y", "*", ""]
    result = remote.run(pinned, ["printf", "<%s>\\n", *words])
    assert result.stdout.decode().splitlines() == [f"<{w}>" for w in words]
    # A str is a shell command line: the remote shell expands it.
    assert remote.run(pinned, "echo $((6 * 7)) | tr 4 X").stdout == b"X2\n"


def test_sudo_wraps_the_command_line(sshd, keys, pinned):
    as_root = endpoint(sshd, keys, pinned.known_hosts, sudo=True)
    line = "echo \"$SUDO_WRAPPED\" 'it'\"'\"'s' | tr a-z A-Z"
    assert remote.command_line(as_root, line) == f"sudo -n sh -c {shlex.quote(line)}"
    assert remote.command_line(as_root, ["echo", "a b"]) == "sudo -n sh -c 'echo '\"'\"'a b'\"'\"''"
    assert remote.run(as_root, line).stdout == b"YES IT'S\n"
    assert remote.run(as_root, ["printf", "%s|", "a b", "$HOME", "it's"]).stdout == b"a b|$HOME|it's|"
    assert remote.run(pinned, 'echo "[$SUDO_WRAPPED]"').stdout == b"[]\n"  # no sudo without it


def test_interactive_streams_and_returns_the_exit_status(pinned):
    script = (
        "import sys; from pathlib import Path; from clusterbake import remote; "
        f"ep = remote.Endpoint('node1', '127.0.0.1', 'root', Path({str(pinned.key_file)!r}), "
        f"Path({str(pinned.known_hosts)!r}), port={pinned.port}); "
        "sys.exit(remote.interactive(ep, sys.argv[1:] or None))"
    )
    run = [sys.executable, "-c", script]
    done = subprocess.run([*run, "sh", "-c", "echo out; echo err >&2; tr a-z A-Z; exit 5"], input=b"from stdin\n",
                          capture_output=True, timeout=60)  # fmt: skip
    assert (done.returncode, done.stdout, done.stderr) == (5, b"out\nFROM STDIN\n", b"err\n")
    # No command and stdin not a terminal: a shell reads its commands from stdin, as ssh does.
    done = subprocess.run(run, input=b"echo $((1 + 1))\nexit 6\n", capture_output=True, timeout=60)
    assert (done.returncode, done.stdout) == (6, b"2\n")


@pytest.mark.skipif(not shutil.which("script"), reason="needs script(1) (util-linux) for a terminal")
def test_interactive_shell_on_a_terminal(pinned):
    script = (
        "import sys; from pathlib import Path; from clusterbake import remote; "
        f"ep = remote.Endpoint('node1', '127.0.0.1', 'root', Path({str(pinned.key_file)!r}), "
        f"Path({str(pinned.known_hosts)!r}), port={pinned.port}); "
        "sys.exit(remote.interactive(ep))"
    )
    # script(1) gives the command a terminal as stdin: a pty shell on the node.
    shell = subprocess.Popen(
        ["script", "-qec", shlex.join([sys.executable, "-c", script]), "/dev/null"],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
    )  # fmt: skip
    output: list[bytes] = []
    reader = threading.Thread(target=lambda: output.extend(iter(lambda: shell.stdout.read1(4096), b"")))
    reader.start()
    deadline = time.monotonic() + 30
    while not output and time.monotonic() < deadline:  # typed too early, input is flushed with the local mode change
        time.sleep(0.1)
    time.sleep(1)
    shell.stdin.write(b"tty | sed s,/dev/,on-,; exit 4\n")
    shell.stdin.flush()
    try:
        assert shell.wait(30) == 4
    finally:
        shell.kill()
        reader.join(10)
    assert b"on-pts/" in b"".join(output)


# --- host keys ---------------------------------------------------------------------------


def test_paramiko_reads_the_local_providers_known_hosts_format(tmp_path):
    known_hosts = tmp_path / "known_hosts"
    key = "AAAAC3NzaC1lZDI1NTE5AAAAIKnLhc+bqT1CV7aEgmuyrkmzHfIzmN2ZRDo8ulTN2JGH"
    known_hosts.write_text(f"head,10.77.0.2 ssh-ed25519 {key}\ncpu-1,10.77.0.3 ssh-ed25519 {key}\n")
    keys = HostKeys(str(known_hosts))
    assert keys.lookup("10.77.0.2")["ssh-ed25519"].get_base64() == key
    assert keys.lookup("head") is not None and keys.lookup("10.77.0.4") is None


def test_pinned_rejects_unknown_and_changed_keys(sshd, keys, tmp_path):
    known_hosts = tmp_path / "known_hosts"
    known_hosts.write_text("")
    with pytest.raises(HostKeyError, match=r"host key of node1 \(\[127.0.0.1\]:\d+\) is not in .*known_hosts"):
        remote.run(endpoint(sshd, keys, known_hosts), "true")
    assert known_hosts.read_text() == ""  # pinned never writes
    known_hosts.write_text(f"[127.0.0.1]:{sshd.port} {public_key(keys['other_host'])}\n")
    with pytest.raises(HostKeyError, match=r"host key of node2 .* changed"):
        remote.run(endpoint(sshd, keys, known_hosts, name="node2"), "true")


def test_accept_new_records_the_key_then_rejects_a_changed_one(keys, tmp_path):
    server = Sshd(keys["root"], keys["client"], keys["host"]).start()
    try:
        known_hosts = tmp_path / "ssh" / "known_hosts"
        ep = endpoint(server, keys, known_hosts, host_key_policy="accept-new")
        assert remote.run(ep, "echo ok").stdout == b"ok\n"
        lines = known_hosts.read_text().splitlines()
        assert lines == [server.known_hosts_line(f"[127.0.0.1]:{server.port},[node1]:{server.port}").strip()]
        remote.close_all()
        assert remote.run(ep, "true").ok and len(known_hosts.read_text().splitlines()) == 1  # known now
        # The node is replaced: same address and port, new host key.
        server.stop()
        remote.close_all()
        server = Sshd(keys["root"], keys["client"], keys["other_host"], port=server.port).start()
        with pytest.raises(HostKeyError, match="changed"):
            remote.run(ep, "true")
        # forget_hosts (what the aws provider does for a replaced instance), then trust on first use again.
        assert remote.forget_hosts(known_hosts, ["127.0.0.1"]) == 1
        assert remote.run(ep, "echo again").stdout == b"again\n"
        assert public_key(keys["other_host"]) in known_hosts.read_text()
    finally:
        server.stop()


def test_forget_hosts(tmp_path):
    known_hosts = tmp_path / "known_hosts"
    key = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIKnLhc+bqT1CV7aEgmuyrkmzHfIzmN2ZRDo8ulTN2JGH"
    hashed_gone = HostKeys.hash_host("10.0.0.7")
    hashed_kept = HostKeys.hash_host("10.0.0.8")
    lines = [
        "# a comment\n",
        f"cpu-1,10.0.0.5 {key}\n",  # by name
        f"cpu-2,10.0.0.6 {key}\n",
        f"10.0.0.6 {key}\n",
        f"[10.0.0.5]:2222 {key}\n",  # any port
        f"{hashed_gone} {key}\n",  # OpenSSH's HashKnownHosts (Debian's default)
        f"{hashed_kept} {key}\n",
        f"cpu-10 {key}\n",  # not a prefix match
        "\n",
    ]
    known_hosts.write_text("".join(lines))
    known_hosts.chmod(0o600)
    assert remote.forget_hosts(known_hosts, ["cpu-1", "10.0.0.5", "10.0.0.7", "10.0.0.9"]) == 3
    assert known_hosts.read_text() == "".join(lines[i] for i in (0, 2, 3, 6, 7, 8))
    assert known_hosts.stat().st_mode & 0o777 == 0o600
    assert remote.forget_hosts(known_hosts, ["10.0.0.6"]) == 2
    assert remote.forget_hosts(known_hosts, ["nothing"]) == 0
    assert remote.forget_hosts(tmp_path / "missing", ["cpu-1"]) == 0


# --- connections ---------------------------------------------------------------------------


def test_one_connection_for_many_commands(sshd, keys, pinned):
    before = sshd.logins()
    for i in range(5):
        assert remote.run(pinned, f"echo {i}").stdout == f"{i}\n".encode()
    threads = [threading.Thread(target=remote.run, args=(pinned, "sleep 0.2")) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    time.sleep(0.2)  # the log line is written by sshd's child
    assert sshd.logins() - before == 1
    established = subprocess.run(
        ["ss", "-Htn", "state", "established", "dst", f"127.0.0.1:{sshd.port}"], capture_output=True, text=True
    ).stdout.splitlines() if shutil.which("ss") else ["skip"]  # fmt: skip
    assert len(established) == 1
    remote.close_all()
    remote.run(pinned, "true")
    time.sleep(0.2)
    assert sshd.logins() - before == 2  # closed at exit (close_all), a new one after


def test_gateway_is_one_shared_connection(sshd, keys, pinned):
    """A bastion (here the same sshd) carries the connections to the nodes: direct-tcpip channels."""
    bastion = f"root@127.0.0.1:{sshd.port}"
    before = sshd.logins()
    first = endpoint(sshd, keys, pinned.known_hosts, gateway=bastion)
    second = endpoint(sshd, keys, pinned.known_hosts, name="node2", gateway=bastion)
    assert remote.run(first, "echo one").stdout == b"one\n"
    assert remote.run(second, "echo two").stdout == b"two\n"
    assert remote.run(first, "echo three").stdout == b"three\n"
    time.sleep(0.2)
    assert sshd.logins() - before == 3  # the bastion once, each node once
    behind = endpoint(sshd, keys, pinned.known_hosts, name="dead", gateway=bastion, port=free_port())
    started = time.monotonic()
    with pytest.raises(RemoteError, match=r"cannot reach dead \(root@127.0.0.1:\d+ via root@127.0.0.1:\d+\)"):
        remote.run(behind, "true", timeout=5)
    assert time.monotonic() - started < 5


def test_run_many_runs_in_parallel_and_keeps_each_nodes_outcome(sshd, keys, pinned):
    endpoints = {f"n{i}": endpoint(sshd, keys, pinned.known_hosts, name=f"n{i}") for i in range(4)}
    endpoints["dead"] = endpoint(sshd, keys, pinned.known_hosts, name="dead", port=free_port())
    started = time.monotonic()
    results = remote.run_many(endpoints, 'sleep 1; cat; test "$(cat /dev/null)" = ""', stdin=b"in", timeout=30)
    assert time.monotonic() - started < 3.5  # four 1 s commands at once, not one after another
    assert {name: r.stdout for name, r in results.items() if name != "dead"} == {f"n{i}": b"in" for i in range(4)}
    assert isinstance(results["dead"], RemoteError) and "connection refused" in str(results["dead"])
    failed = remote.run_many({"n0": endpoints["n0"]}, "exit 3")
    assert failed["n0"].returncode == 3  # check=False by default: a Result
    failed = remote.run_many({"n0": endpoints["n0"]}, "exit 3", check=True)
    assert isinstance(failed["n0"], RemoteError) and "exit status 3" in str(failed["n0"])
    assert remote.run_many({}, "true") == {}


# --- readiness -------------------------------------------------------------------------------


@pytest.fixture
def dead_ports():
    """Ports where no SSH server answers: refused, silent (accepts, never speaks), SYN dropped."""
    refused = [free_port() for _ in range(7)]
    silent = socket.socket()
    silent.bind(("127.0.0.1", 0))
    silent.listen(64)
    dropping = socket.socket()
    dropping.bind(("127.0.0.1", 0))
    dropping.listen(0)
    fillers = []
    for _ in range(3):  # fill its accept queue: later SYNs are dropped, the connect times out
        filler = socket.socket()
        filler.setblocking(False)
        filler.connect_ex(dropping.getsockname())
        fillers.append(filler)
    yield {"refused": refused, "silent": silent.getsockname()[1], "dropping": dropping.getsockname()[1]}
    for sock in (silent, dropping, *fillers):
        sock.close()


def test_wait_ready_probes_all_endpoints_at_once(keys, tmp_path, dead_ports):
    known_hosts = tmp_path / "known_hosts"
    ports = dead_ports["refused"] + [dead_ports["silent"]] * 7 + [dead_ports["dropping"]] * 6
    endpoints = {
        f"n{i:02d}": Endpoint(f"n{i:02d}", "127.0.0.1", "root", keys["client"], known_hosts, "accept-new", port=port)
        for i, port in enumerate(ports)
    }
    probe_timeout = 1.5
    started = time.monotonic()
    with pytest.raises(RemoteError) as info:
        remote.wait_ready(endpoints, timeout=probe_timeout, probe_timeout=probe_timeout)
    took = time.monotonic() - started
    print(f"wait_ready over 20 dead endpoints: {took:.2f}s (probe timeout {probe_timeout}s)")
    # One after another this would be 13 probe timeouts (the refused ones fail at once).
    assert took < 5 * probe_timeout
    message = str(info.value)
    assert message.startswith("20 of 20 nodes did not answer SSH within 2s:")
    for name, endpoint_ in endpoints.items():
        assert f"\n  {name}: cannot reach {name} (root@127.0.0.1:{endpoint_.port}): " in message
    assert "connection refused" in message and "no SSH handshake in time" in message
    assert "timed out" in message


def test_wait_ready_waits_for_a_late_node(sshd, keys, pinned):
    late_port = free_port()
    late_server = Sshd(keys["root"], keys["client"], keys["host"], port=late_port)
    known_hosts = pinned.known_hosts
    known_hosts.write_text(known_hosts.read_text() + late_server.known_hosts_line())
    endpoints = {"node1": pinned, "late": endpoint(sshd, keys, known_hosts, name="late", port=late_port)}
    timer = threading.Timer(2.0, late_server.start)
    timer.start()
    try:
        started = time.monotonic()
        remote.wait_ready(endpoints, timeout=60, probe_timeout=2, interval=0.3)
        assert 1.5 < time.monotonic() - started < 30
        assert remote.run(endpoints["late"], "echo up").stdout == b"up\n"
    finally:
        timer.join()
        late_server.stop()


def test_wait_ready_stops_at_a_changed_host_key(sshd, keys, tmp_path):
    known_hosts = tmp_path / "known_hosts"
    known_hosts.write_text(f"[127.0.0.1]:{sshd.port} {public_key(keys['other_host'])}\n")
    started = time.monotonic()
    with pytest.raises(HostKeyError, match="changed"):
        remote.wait_ready({"node1": endpoint(sshd, keys, known_hosts)}, timeout=60)
    assert time.monotonic() - started < 10
