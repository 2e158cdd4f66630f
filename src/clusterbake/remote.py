"""Commands on cluster nodes over SSH (Fabric 3 / paramiko), for every provider.

A provider describes how to reach a node as an `Endpoint` (address, user, key,
known_hosts file and how unknown host keys are treated); this module does the
rest: one Fabric `Connection` per endpoint per process (reused by every command,
closed at exit), commands with bytes in and out (`run`, `run_many` in parallel), `clusterbake ssh`
(`interactive`), parallel readiness probes (`wait_ready`) and known_hosts upkeep
(`forget_hosts`).

Commands: a `str` is a shell command line (the login shell of the remote user
runs it, as with `ssh host 'a | b'`); a `list` is one program and its arguments,
quoted with shlex. An endpoint with `sudo` runs the command as root through
`sudo -n sh -c <quoted command line>`.

Ansible does not use this module: it talks OpenSSH, with the providers'
`_ssh_options()` (the same known_hosts file).
"""

from __future__ import annotations

import atexit
import fcntl
import functools
import importlib
import logging
import os
import shlex
import socket
import sys
import tempfile
import threading
import time
from collections.abc import Iterable
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager, suppress
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from clusterbake.errors import ClusterbakeError


class _LazyModule:
    """The SSH stack is imported on first use: importing a provider (the Ansible inventory
    scripts do, possibly with an interpreter outside the venv) must not need it."""

    def __init__(self, name: str):
        self._name = name

    def __getattr__(self, attr: str):
        return getattr(importlib.import_module(self._name), attr)


paramiko = _LazyModule("paramiko")

if TYPE_CHECKING:
    import paramiko  # the real module, for type checkers
    from fabric import Connection

HOST_KEY_POLICIES = ("pinned", "accept-new")
CONNECT_TIMEOUT = 30.0  # TCP connect, SSH banner, key exchange, authentication (each)
PROBE_TIMEOUT = 10.0  # one readiness probe: connect + `true`
PROBE_INTERVAL = 2.0  # pause between two rounds of probes
MAX_PROBE_THREADS = 256
KEEPALIVE = 30  # seconds; a cached connection notices a dead peer
CHUNK = 65536

# paramiko logs every failed connection attempt (with a traceback) from its
# transport thread; the exceptions reach the caller anyway, with the node's name.
logging.getLogger("paramiko").addHandler(logging.NullHandler())


class RemoteError(ClusterbakeError):
    """A node could not be reached, or a command on it failed."""


class HostKeyError(RemoteError):
    """A node's host key is unknown (pinned policy) or not the recorded one."""


class RemoteTimeout(RemoteError):
    """A command did not finish in time."""


@dataclass(frozen=True)
class Endpoint:
    """How to reach one node; hashable (the connection cache's key)."""

    name: str  # the node's name (messages, known_hosts alias)
    host: str  # the address to connect to
    user: str
    key_file: Path
    known_hosts: Path
    # pinned: an unknown or changed host key is an error (the provider wrote known_hosts);
    # accept-new: an unknown key is trusted and appended to known_hosts, a changed one is an error.
    host_key_policy: str = "pinned"
    sudo: bool = False  # run commands as root through `sudo -n sh -c`
    gateway: str | None = None  # a bastion, user@host[:port]
    port: int = 22

    def __post_init__(self) -> None:
        if self.host_key_policy not in HOST_KEY_POLICIES:
            raise ValueError(f"host_key_policy {self.host_key_policy!r}: not one of {HOST_KEY_POLICIES}")

    @property
    def target(self) -> str:
        where = f"{self.user}@{self.host}" + (f":{self.port}" if self.port != 22 else "")
        return where + (f" via {self.gateway}" if self.gateway else "")


@dataclass
class Result:
    node: str
    command: str  # the command line as sent (sudo wrapping included)
    returncode: int
    stdout: bytes
    stderr: bytes

    @property
    def ok(self) -> bool:
        return self.returncode == 0

    def text(self) -> str:
        return self.stdout.decode(errors="replace")


# --- command lines ---------------------------------------------------------------------


def command_line(endpoint: Endpoint, command: str | list[str]) -> str:
    """What the remote login shell is given: a str as it is, a list quoted; sudo wraps it."""
    line = command if isinstance(command, str) else shlex.join(str(word) for word in command)
    if not line.strip():
        raise ValueError("empty command")
    if endpoint.sudo:
        line = f"sudo -n sh -c {shlex.quote(line)}"
    return line


def _first_line(command: str | list[str]) -> str:
    line = command if isinstance(command, str) else shlex.join(str(word) for word in command)
    return line.strip().split("\n")[0][:120]


# --- known_hosts -----------------------------------------------------------------------

_known_hosts_lock = threading.Lock()


@contextmanager
def _locked(known_hosts: Path):
    """One writer of a known_hosts file at a time: threads here, other clusterbake processes."""
    known_hosts.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    with _known_hosts_lock:
        fd = os.open(known_hosts.parent, os.O_RDONLY)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            yield
        finally:
            os.close(fd)  # releases the flock


def _host_key_name(host: str, port: int) -> str:
    """How OpenSSH (and paramiko) name a host in known_hosts."""
    return host if port == 22 else f"[{host}]:{port}"


def _fingerprint(key: paramiko.PKey) -> str:
    return f"{key.get_name()} {key.fingerprint}"


def _load_host_keys(known_hosts: Path) -> paramiko.HostKeys:
    keys = paramiko.HostKeys()
    if known_hosts.exists():
        keys.load(str(known_hosts))
    return keys


class _HostKeyPolicy:
    """paramiko's MissingHostKeyPolicy: called when known_hosts has no key for the host
    (a changed key never gets here: paramiko raises BadHostKeyException)."""

    def __init__(self, name: str, known_hosts: Path, policy: str, port: int):
        self.name = name
        self.known_hosts = known_hosts
        self.policy = policy
        self.port = port

    def missing_host_key(self, client, hostname, key):
        if self.policy == "pinned":
            raise HostKeyError(
                f"host key of {self.name} ({hostname}) is not in {self.known_hosts} "
                f"(pinned keys; the server offered {_fingerprint(key)})"
            )
        with _locked(self.known_hosts):
            # Another process (or thread) may have recorded a key since this connection loaded the file.
            recorded = _load_host_keys(self.known_hosts).lookup(hostname)
            if recorded is not None:
                # A known host offering a key not recorded (another type included) is a changed host:
                # first use is trusted once, never a second time with another key.
                if key.get_name() not in recorded or recorded[key.get_name()] != key:
                    raise HostKeyError(_changed_message(self.name, hostname, key, self.known_hosts))
            else:
                names = [hostname]
                alias = _host_key_name(self.name, self.port)
                if self.name and alias not in names and "," not in self.name and " " not in self.name:
                    names.append(alias)
                with open(self.known_hosts, "a", encoding="ascii") as handle:
                    handle.write(f"{','.join(names)} {key.get_name()} {key.get_base64()}\n")
        client.get_host_keys().add(hostname, key.get_name(), key)


def _changed_message(name: str, hostname: str, key: paramiko.PKey, known_hosts: Path) -> str:
    return (
        f"host key of {name} ({hostname}) changed: the server offered {_fingerprint(key)}, which is not "
        f"the key recorded in {known_hosts}; if the node was replaced, remove its lines from that file"
    )


def _hosts_of_line(line: str) -> list[str]:
    fields = line.split()
    if not fields or fields[0].startswith("#"):
        return []
    if fields[0].startswith("@"):  # @cert-authority / @revoked
        fields = fields[1:]
    return fields[0].split(",") if fields else []


def _matches(pattern: str, targets: set[str]) -> bool:
    if pattern.startswith("|1|"):  # hashed (OpenSSH HashKnownHosts)
        return any(paramiko.HostKeys.hash_host(target, pattern) == pattern for target in targets)
    if pattern in targets:
        return True
    if pattern.startswith("[") and "]:" in pattern:
        return pattern[1 : pattern.index("]:")] in targets
    return False


def knows_host(known_hosts: Path, host: str) -> bool:
    """Has known_hosts a key of `host` (a name or an address)?"""
    return _load_host_keys(known_hosts).lookup(host) is not None


def pin_host_keys(known_hosts: Path, names: list[str], keys: list[str]) -> int:
    """Record a host's public keys (OpenSSH `type base64` lines, from a trusted channel) under
    `names`; returns how many lines were added. A name already known keeps its keys."""
    with _locked(known_hosts):
        known = _load_host_keys(known_hosts)
        fresh = [n for n in names if known.lookup(n) is None]
        lines = [f"{','.join(fresh)} {' '.join(key.split()[:2])}\n" for key in keys] if fresh else []
        with open(known_hosts, "a", encoding="ascii") as handle:
            handle.writelines(lines)
    return len(lines)


def forget_hosts(known_hosts: Path, names_or_addresses: Iterable[str]) -> int:
    """Remove the known_hosts lines of these hosts (any port; hashed lines too); returns how many.

    For nodes that were replaced: a new machine under an old name or address has new host keys.
    """
    targets = {str(t) for t in names_or_addresses if t}
    if not targets or not known_hosts.exists():
        return 0
    with _locked(known_hosts):
        lines = known_hosts.read_text().splitlines(keepends=True)
        kept = [line for line in lines if not any(_matches(h, targets) for h in _hosts_of_line(line))]
        removed = len(lines) - len(kept)
        if removed:
            fd, tmp = tempfile.mkstemp(dir=known_hosts.parent, prefix=".known_hosts.")
            try:
                with os.fdopen(fd, "w") as handle:
                    handle.writelines(kept)
                os.chmod(tmp, known_hosts.stat().st_mode & 0o777)
                os.replace(tmp, known_hosts)
            except BaseException:
                Path(tmp).unlink(missing_ok=True)
                raise
    return removed


# --- connections -----------------------------------------------------------------------


@functools.cache
def _connection_class() -> type:
    from fabric import Connection

    class _Connection(Connection):
        """A Fabric Connection whose gateway channel honours the connect timeout."""

        open_timeout: float | None = None  # a class attribute: Fabric keeps unknown attributes in its config

        def open_gateway(self):
            if isinstance(self.gateway, Connection):
                self.gateway.open()
                return self.gateway.transport.open_channel(
                    kind="direct-tcpip",
                    dest_addr=(self.host, int(self.port)),
                    src_addr=("", 0),
                    timeout=self.open_timeout,
                )
            return super().open_gateway()

    return _Connection


def _fabric_config():
    from fabric import Config
    from paramiko.config import SSHConfig

    # No ~/.ssh/config, /etc/ssh/ssh_config or fabric.yaml: everything comes from the Endpoint.
    return Config(overrides={"load_ssh_configs": False}, ssh_config=SSHConfig(), lazy=True)


def _new_connection(host: str, user: str, port: int, endpoint: Endpoint, name: str, gateway=None) -> Connection:
    conn = _connection_class()(
        host,
        user=user,
        port=port,
        config=_fabric_config(),
        gateway=gateway if gateway is not None else False,
        connect_kwargs={"key_filename": [str(endpoint.key_file)], "look_for_keys": False, "allow_agent": False},
    )
    conn.client.set_missing_host_key_policy(_HostKeyPolicy(name, endpoint.known_hosts, endpoint.host_key_policy, port))
    return conn


class _Slot:
    def __init__(self, conn: Connection):
        self.conn = conn
        self.lock = threading.Lock()


_cache_lock = threading.Lock()
_connections: dict[Endpoint, _Slot] = {}
_gateways: dict[tuple, _Slot] = {}


def _gateway_slot(endpoint: Endpoint) -> _Slot:
    key = (endpoint.gateway, endpoint.key_file, endpoint.known_hosts, endpoint.host_key_policy)
    with _cache_lock:
        slot = _gateways.get(key)
        if slot is None:
            user, _, rest = endpoint.gateway.rpartition("@")
            host, _, port = rest.partition(":")
            gw = Endpoint(
                name="",
                host=host,
                user=user or endpoint.user,
                key_file=endpoint.key_file,
                known_hosts=endpoint.known_hosts,
                host_key_policy=endpoint.host_key_policy,
                port=int(port or 22),
            )
            slot = _gateways[key] = _Slot(_new_connection(gw.host, gw.user, gw.port, gw, f"bastion {endpoint.gateway}"))
        return slot


def _slot(endpoint: Endpoint) -> _Slot:
    with _cache_lock:
        slot = _connections.get(endpoint)
    if slot is not None:
        return slot
    gateway = _gateway_slot(endpoint).conn if endpoint.gateway else None
    with _cache_lock:
        slot = _connections.get(endpoint)
        if slot is None:
            conn = _new_connection(endpoint.host, endpoint.user, endpoint.port, endpoint, endpoint.name, gateway)
            slot = _connections[endpoint] = _Slot(conn)
        return slot


def _open(slot: _Slot, known_hosts: Path, timeout: float) -> None:
    """Open the slot's connection unless it is open (the caller holds slot.lock)."""
    conn = slot.conn
    if conn.is_connected:
        return
    keys = conn.client.get_host_keys()
    keys.clear()
    if known_hosts.exists():
        keys.load(str(known_hosts))  # read again: forget_hosts or another process may have changed it
    conn.connect_timeout = timeout
    conn.open_timeout = timeout
    conn.connect_kwargs.update(banner_timeout=timeout, auth_timeout=timeout)
    try:
        conn.open()
    except BaseException:
        conn.client.close()  # paramiko keeps a half-open transport when a host key is refused
        conn.transport = None
        raise
    conn.transport.set_keepalive(KEEPALIVE)


def _describe(exc: BaseException) -> str:
    if isinstance(exc, socket.timeout | TimeoutError):
        return "timed out"
    if isinstance(exc, paramiko.ssh_exception.NoValidConnectionsError):
        return "connection refused"
    # paramiko's words when the key exchange timed out, or when no banner came in time (which of the
    # two a silent server gets depends on which timer fires first).
    if isinstance(exc, paramiko.SSHException) and str(exc).startswith(
        ("No existing session", "Error reading SSH protocol banner")
    ):
        return "no SSH handshake in time"
    if isinstance(exc, OSError) and exc.errno:
        return os.strerror(exc.errno).lower()
    return str(exc) or type(exc).__name__


def connect(endpoint: Endpoint, timeout: float = CONNECT_TIMEOUT) -> Connection:
    """The endpoint's cached Fabric Connection, opened (authenticated) if it was not."""
    if endpoint.gateway:
        gw = _gateway_slot(endpoint)
        with gw.lock:
            try:
                _open(gw, endpoint.known_hosts, timeout)
            except paramiko.BadHostKeyException as exc:
                raise HostKeyError(
                    _changed_message(f"bastion {endpoint.gateway}", exc.hostname, exc.key, endpoint.known_hosts)
                ) from exc
            except HostKeyError:
                raise
            except Exception as exc:
                raise RemoteError(f"cannot reach the bastion {endpoint.gateway}: {_describe(exc)}") from exc
    slot = _slot(endpoint)
    with slot.lock:
        try:
            _open(slot, endpoint.known_hosts, timeout)
        except paramiko.BadHostKeyException as exc:
            raise HostKeyError(_changed_message(endpoint.name, exc.hostname, exc.key, endpoint.known_hosts)) from exc
        except HostKeyError:
            raise
        except paramiko.AuthenticationException as exc:
            raise RemoteError(
                f"cannot log in to {endpoint.name} ({endpoint.target}) with {endpoint.key_file}: {_describe(exc)}"
            ) from exc
        except Exception as exc:
            raise RemoteError(f"cannot reach {endpoint.name} ({endpoint.target}): {_describe(exc)}") from exc
        return slot.conn


def disconnect(endpoint: Endpoint) -> None:
    """Close and forget the endpoint's connection (the next command connects again)."""
    with _cache_lock:
        slot = _connections.pop(endpoint, None)
    if slot is not None:
        with slot.lock:
            slot.conn.close()


@atexit.register
def close_all() -> None:
    with _cache_lock:
        slots = list(_connections.values()) + list(_gateways.values())
        _connections.clear()
        _gateways.clear()
    for slot in slots:
        with suppress(Exception):  # closing at exit: nothing left to tell
            slot.conn.close()


def _session(endpoint: Endpoint, timeout: float) -> paramiko.Channel:
    """A new session channel; a cached connection that died meanwhile is opened again once."""
    for attempt in (1, 2):
        conn = connect(endpoint, min(timeout, CONNECT_TIMEOUT))
        try:
            return conn.transport.open_session(timeout=min(timeout, CONNECT_TIMEOUT))
        except (paramiko.SSHException, EOFError, OSError) as exc:
            slot = _slot(endpoint)
            with slot.lock:
                slot.conn.close()
            if attempt == 2:
                raise RemoteError(f"cannot open a session on {endpoint.name} ({endpoint.target}): {exc}") from exc
    raise AssertionError("unreachable")


def tunnel(endpoint: Endpoint, host: str, port: int, timeout: float = CONNECT_TIMEOUT) -> paramiko.Channel:
    """A TCP connection from the node to host:port (SSH direct-tcpip, as `ssh -L` opens), over the
    endpoint's connection: a socket-like channel (sendall, recv, makefile, close)."""
    conn = connect(endpoint, timeout)
    try:
        return conn.transport.open_channel("direct-tcpip", (host, port), ("127.0.0.1", 0), timeout=timeout)
    except (paramiko.SSHException, EOFError, OSError) as exc:
        raise RemoteError(f"on {endpoint.name}: cannot connect to {host}:{port}: {_describe(exc)}") from exc


# --- commands --------------------------------------------------------------------------


def _pump(recv, sink: list[bytes]) -> None:
    try:
        while data := recv(CHUNK):
            sink.append(data)
    except (OSError, EOFError, paramiko.SSHException):
        pass  # the channel was closed (timeout) or the connection lost: the exit status says so


def _feed(channel: paramiko.Channel, data: bytes | None) -> None:
    try:
        if data:
            channel.sendall(data)
        channel.shutdown_write()
    except (OSError, EOFError, paramiko.SSHException):
        pass  # the command ended without reading all of its input, as over OpenSSH


def run(
    endpoint: Endpoint,
    command: str | list[str],
    *,
    stdin: bytes | None = None,
    timeout: float = 120,
    check: bool = True,
) -> Result:
    """Run a command; stdout/stderr as bytes. stdin: bytes for the command (else it reads EOF).

    check=True: a non-zero exit status raises RemoteError naming the node, the command and stderr.
    A command still running after `timeout` seconds is abandoned (its channel closed): RemoteTimeout.
    """
    line = command_line(endpoint, command)
    deadline = time.monotonic() + timeout
    channel = _session(endpoint, timeout)
    out: list[bytes] = []
    err: list[bytes] = []
    try:
        channel.exec_command(line)
        threads = [
            threading.Thread(target=_feed, args=(channel, stdin), daemon=True),
            threading.Thread(target=_pump, args=(channel.recv, out), daemon=True),
            threading.Thread(target=_pump, args=(channel.recv_stderr, err), daemon=True),
        ]
        for thread in threads:
            thread.start()
        finished = channel.status_event.wait(max(0.0, deadline - time.monotonic()))
        for thread in threads[1:]:
            thread.join(max(0.0, deadline - time.monotonic()) if finished else 0)
        if not finished or any(t.is_alive() for t in threads[1:]):
            raise RemoteTimeout(f"on {endpoint.name}: {_first_line(command)} did not finish within {timeout:.0f}s")
        status = channel.recv_exit_status()
    except (paramiko.SSHException, EOFError, OSError) as exc:
        raise RemoteError(f"on {endpoint.name}: {_first_line(command)}: {_describe(exc)}") from exc
    finally:
        channel.close()
    # No exit status: killed by a signal, or the connection was lost (OpenSSH says 255 too).
    result = Result(endpoint.name, line, status if status >= 0 else 255, b"".join(out), b"".join(err))
    if check and result.returncode != 0:
        stderr = result.stderr.decode(errors="replace").strip()
        raise RemoteError(
            f"on {endpoint.name}: {_first_line(command)} failed (exit status {result.returncode})"
            + (f": {stderr}" if stderr else "")
        )
    return result


def run_many(
    endpoints: dict[str, Endpoint],
    command: str | list[str],
    *,
    stdin: bytes | None = None,
    timeout: float = 120,
    check: bool = False,
) -> dict[str, Result | Exception]:
    """`run` on every endpoint in parallel: name -> its Result, or the RemoteError it raised
    (unreachable; with check=True also a non-zero exit status). Never raises for one node."""
    if not endpoints:
        return {}
    results: dict[str, Result | Exception] = {}
    with ThreadPoolExecutor(max_workers=min(len(endpoints), MAX_PROBE_THREADS), thread_name_prefix="run") as pool:
        futures = {
            name: pool.submit(run, endpoint, command, stdin=stdin, timeout=timeout, check=check)
            for name, endpoint in endpoints.items()
        }
        for name, future in futures.items():
            try:
                results[name] = future.result()
            except RemoteError as exc:
                results[name] = exc
    return results


def _forward_stdin(channel: paramiko.Channel, fd: int) -> None:
    try:
        while data := os.read(fd, CHUNK):
            channel.sendall(data)
    except (OSError, EOFError, paramiko.SSHException):
        pass  # no stdin (EBADF), or the command ended without reading it
    with suppress(OSError, EOFError, paramiko.SSHException):
        channel.shutdown_write()


def _forward_output(recv, stream) -> None:
    try:
        while data := recv(CHUNK):
            stream.write(data)
            stream.flush()
    except (OSError, EOFError, paramiko.SSHException, ValueError):
        pass


def interactive(endpoint: Endpoint, command: str | list[str] | None = None) -> int:
    """`clusterbake ssh`: a pty shell when there is no command and stdin is a terminal;
    otherwise the command (or a shell reading stdin) with stdout/stderr streamed. Returns the exit status."""
    if isinstance(command, list) and not command:
        command = None
    if command is None and sys.stdin.isatty():
        from invoke import exceptions as invoke_exceptions

        conn = connect(endpoint)
        try:
            if endpoint.sudo:
                result = conn.run("sudo -i", pty=True, warn=True, hide=False, in_stream=sys.stdin)
            else:
                result = conn.shell()
        except invoke_exceptions.UnexpectedExit as exc:  # Fabric 3.2's shell() raises for a non-zero exit status
            result = exc.result
        return result.exited if result.exited is not None and result.exited >= 0 else 255
    channel = _session(endpoint, CONNECT_TIMEOUT)
    try:
        if command is not None:
            channel.exec_command(command_line(endpoint, command))
        elif endpoint.sudo:
            channel.exec_command("sudo -n -i")
        else:
            channel.invoke_shell()  # no pty: the login shell reads its commands from stdin
        outputs = [
            threading.Thread(target=_forward_output, args=(channel.recv, sys.stdout.buffer), daemon=True),
            threading.Thread(target=_forward_output, args=(channel.recv_stderr, sys.stderr.buffer), daemon=True),
        ]
        for thread in outputs:
            thread.start()
        threading.Thread(target=_forward_stdin, args=(channel, sys.stdin.fileno()), daemon=True).start()
        try:
            channel.status_event.wait()
        except KeyboardInterrupt:
            return 130
        for thread in outputs:
            thread.join(10)
        status = channel.recv_exit_status()
        return status if status >= 0 else 255
    finally:
        channel.close()


# --- readiness -------------------------------------------------------------------------


def probe(endpoint: Endpoint, timeout: float = PROBE_TIMEOUT) -> None:
    """One authenticated connection and `true` (as root where sudo): raises RemoteError."""
    try:
        connect(endpoint, timeout)
        run(endpoint, "true", timeout=timeout, check=True)
    except HostKeyError:
        disconnect(endpoint)
        raise
    except RemoteError:
        disconnect(endpoint)  # the next probe starts from a fresh connection
        raise


def wait_ready(
    endpoints: dict[str, Endpoint],
    timeout: float,
    *,
    probe_timeout: float = PROBE_TIMEOUT,
    interval: float = PROBE_INTERVAL,
) -> None:
    """Probe every endpoint in parallel, again and again for the pending ones, until all answer.

    Raises RemoteError naming the nodes still pending at the deadline and the last error of each;
    HostKeyError at once (waiting does not change a host key).
    """
    pending = dict(endpoints)
    errors: dict[str, str] = {}
    deadline = time.monotonic() + timeout
    if not pending:
        return
    with ThreadPoolExecutor(max_workers=min(len(pending), MAX_PROBE_THREADS), thread_name_prefix="probe") as pool:
        while True:
            remaining = deadline - time.monotonic()
            each = max(1.0, min(probe_timeout, remaining))
            futures = {name: pool.submit(probe, endpoint, each) for name, endpoint in pending.items()}
            bad_keys = []
            for name, future in futures.items():
                try:
                    future.result()
                except HostKeyError as exc:
                    bad_keys.append(str(exc))
                    errors[name] = str(exc)
                except RemoteError as exc:
                    errors[name] = str(exc)
                else:
                    del pending[name]
                    errors.pop(name, None)
            if bad_keys:
                raise HostKeyError("; ".join(bad_keys))
            if not pending:
                return
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                break
            time.sleep(min(interval, remaining))
    lines = "\n".join(f"  {name}: {errors.get(name, '?')}" for name in sorted(pending))
    raise RemoteError(f"{len(pending)} of {len(endpoints)} nodes did not answer SSH within {timeout:.0f}s:\n{lines}")
