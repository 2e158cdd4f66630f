"""What the local provider does on the host to start a node, checked with real tools: the host keys
it writes (read back by OpenSSH's ssh-keygen) and the shell that puts nspawn in its cgroups."""

from __future__ import annotations

import stat
import subprocess
from pathlib import Path

from clusterbake.nspawn import machines
from clusterbake.providers.local.provider import write_host_keys


def test_host_keys_are_openssh_keys_with_their_public_halves(tmp_path):
    write_host_keys(tmp_path, "root@cpu-1")
    for kind, key_type in (("ed25519", "ssh-ed25519"), ("ecdsa", "ecdsa-sha2-nistp256")):
        private = tmp_path / f"ssh_host_{kind}_key"
        public = private.with_suffix(".pub").read_text().split()
        assert stat.S_IMODE(private.stat().st_mode) == 0o600
        assert public[0] == key_type and public[2] == "root@cpu-1"
        # ssh-keygen derives the public key from the private one: the two files belong together.
        derived = subprocess.run(["ssh-keygen", "-y", "-f", str(private)], capture_output=True, text=True, check=True)
        assert derived.stdout.split()[:2] == public[:2]


def test_each_node_gets_keys_of_its_own(tmp_path):
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    write_host_keys(tmp_path / "a", "root@a")
    write_host_keys(tmp_path / "b", "root@b")
    keys = [(tmp_path / node / "ssh_host_ed25519_key").read_bytes() for node in ("a", "b")]
    assert keys[0] != keys[1]


def test_the_start_shell_writes_its_pid_to_each_cgroup_then_becomes_the_command(tmp_path):
    procs = [tmp_path / "systemd.procs", tmp_path / "cpu.procs"]
    for path in procs:
        path.touch()
    # The command prints its own PID: exec keeps the shell's, which went into the cgroups.
    argv = [machines.SH, "-c", machines.ENTER_CGROUPS, "sh", *map(str, procs), "--", "sh", "-c", "echo $$"]
    result = subprocess.run(argv, capture_output=True, text=True, check=True)
    pid = result.stdout.strip()
    assert pid.isdigit()
    assert [path.read_text().strip() for path in procs] == [pid, pid]


def test_the_start_shell_runs_nothing_when_a_cgroup_cannot_be_entered(tmp_path):
    marker = tmp_path / "ran"
    missing = tmp_path / "no-such-cgroup" / "cgroup.procs"
    argv = [machines.SH, "-c", machines.ENTER_CGROUPS, "sh", str(missing), "--", "touch", str(marker)]
    assert subprocess.run(argv, capture_output=True).returncode != 0
    assert not marker.exists()


def test_masking_in_a_node_root_links_to_dev_null_and_repeats_harmlessly(tmp_path):
    units = tmp_path / "etc/systemd/system"
    units.mkdir(parents=True)
    (units / "fstrim.timer").write_text("[Timer]\n")  # a unit file the node's root had: replaced
    (units / "kept.service").write_text("[Service]\n")
    for _ in range(2):
        machines.mask_in_root(tmp_path, generators=("systemd-sysv-generator",), units=("fstrim.timer", "a.mount"))
    for path in (tmp_path / "etc/systemd/system-generators/systemd-sysv-generator", units / "fstrim.timer"):
        assert path.is_symlink() and str(path.readlink()) == "/dev/null"
    assert (units / "a.mount").readlink() == Path("/dev/null")
    assert (units / "kept.service").read_text() == "[Service]\n"


def test_compute_nodes_may_not_administer_their_network_nor_open_raw_sockets():
    """Security review finding 17 (the argv the local provider starts nodes with)."""
    head = machines.nspawn_argv("m", "head", Path("/r"), "ns", {}, network_admin=True, raw_sockets=False)
    compute = machines.nspawn_argv("m", "cpu-1", Path("/r"), "ns", {}, network_admin=False, raw_sockets=False)
    assert "--capability=CAP_NET_ADMIN" in head and "--capability=CAP_NET_ADMIN" not in compute
    assert "--drop-capability=CAP_NET_RAW" in head and "--drop-capability=CAP_NET_RAW" in compute
    assert compute[-1] == "--boot"  # options before the init's arguments
