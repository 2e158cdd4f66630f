"""clusterbake-node-join applied to a root directory: files, CA certificates, sudo, mounts, idempotence."""

import base64
import grp
import json
import os
import pwd
import subprocess
import sys
from pathlib import Path

import programs
import pytest

REPO = Path(__file__).resolve().parents[2]
PROGRAM = REPO / "roles" / "node_join" / "files" / "clusterbake-node-join"


def b64(text: str) -> str:
    return base64.b64encode(text.encode()).decode()


@pytest.fixture
def root(tmp_path):
    """A node root whose users already exist (creating users needs useradd and root: integration tests)."""
    me, my_group = os.getuid(), os.getgid()
    (tmp_path / "etc").mkdir()
    (tmp_path / "etc/passwd").write_text(
        f"root:x:{me}:{my_group}::/root:/bin/sh\nalice:x:{me}:{my_group}::/home/alice:/bin/sh\n"
    )
    (tmp_path / "etc/group").write_text(f"root:x:{my_group}:\nalice:x:{my_group}:\n")
    return tmp_path


def bundle(**overrides) -> dict:
    data = {
        "format": 1,
        "cluster": "t",
        "manage_homes": False,
        "files": [
            {"path": "/etc/hosts", "content_b64": b64("10.0.0.1 head\n"), "mode": "0644"},
            {"path": "/etc/secret.key", "content_b64": b64("s3cret"), "mode": "0400", "restart": ["munge"]},
        ],
        "ca_certificates": [{"name": "corp.crt", "content_b64": b64("-----BEGIN CERTIFICATE-----\n")}],
        "users": [{"name": "alice", "uid": os.getuid(), "gid": os.getgid(), "sudo": True}],
        "services": ["munge"],
    }
    data.update(overrides)
    return data


def join(root: Path, data: dict, tmp_path: Path) -> subprocess.CompletedProcess:
    path = tmp_path / "bundle.json"
    path.write_text(json.dumps(data))
    return subprocess.run(
        [sys.executable, PROGRAM, "--root", str(root), "--bundle", str(path)], capture_output=True, text=True
    )


def changed(result) -> list[str]:
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout)["changed"]


def test_applies_files_with_their_modes(root, tmp_path):
    first = changed(join(root, bundle(), tmp_path))
    assert "/etc/hosts" in first and "/etc/secret.key" in first
    assert (root / "etc/hosts").read_text() == "10.0.0.1 head\n"
    assert (root / "etc/secret.key").stat().st_mode & 0o777 == 0o400
    assert (root / "etc/sudoers.d/alice").read_text() == "alice ALL=(ALL:ALL) NOPASSWD: ALL\n"
    assert (root / "usr/local/share/ca-certificates/clusterbake/corp.crt").exists()


def test_second_run_changes_nothing(root, tmp_path):
    changed(join(root, bundle(), tmp_path))
    assert changed(join(root, bundle(), tmp_path)) == []


def test_removed_entries_are_revoked(root, tmp_path):
    changed(join(root, bundle(), tmp_path))
    users = [{"name": "alice", "uid": os.getuid(), "gid": os.getgid(), "sudo": False}]
    result = changed(join(root, bundle(ca_certificates=[], users=users), tmp_path))
    assert "sudo alice revoked" in result
    assert not (root / "etc/sudoers.d/alice").exists()
    assert not list((root / "usr/local/share/ca-certificates/clusterbake").iterdir())


def test_changed_mode_is_repaired(root, tmp_path):
    changed(join(root, bundle(), tmp_path))
    (root / "etc/secret.key").chmod(0o644)
    assert changed(join(root, bundle(), tmp_path)) == ["/etc/secret.key"]
    assert (root / "etc/secret.key").stat().st_mode & 0o777 == 0o400


def test_directories_are_made_and_repaired_and_absent_files_removed(root, tmp_path):
    """The head's slurm part: StateSaveLocation as a directory, gres.conf removed once no node has GPUs."""
    state = {"path": "/var/spool/slurmctld", "owner": "alice", "group": "alice", "mode": "0700"}
    (root / "etc/slurm").mkdir()
    (root / "etc/slurm/gres.conf").write_text("NodeName=gpu-1 Name=gpu File=/dev/nvidia0\n")
    data = bundle(directories=[state], absent=[{"path": "/etc/slurm/gres.conf"}, {"path": "/etc/slurm/none.conf"}])
    first = changed(join(root, data, tmp_path))
    assert "directory /var/spool/slurmctld" in first and "removed /etc/slurm/gres.conf" in first
    assert not [entry for entry in first if "none.conf" in entry]  # never there: nothing to say
    assert (root / "var/spool/slurmctld").stat().st_mode & 0o7777 == 0o700
    assert not (root / "etc/slurm/gres.conf").exists()
    assert changed(join(root, data, tmp_path)) == []
    (root / "var/spool/slurmctld").chmod(0o755)
    assert changed(join(root, data, tmp_path)) == ["directory /var/spool/slurmctld (owner, mode)"]
    assert (root / "var/spool/slurmctld").stat().st_mode & 0o7777 == 0o700


def test_a_directory_another_node_makes_first_on_shared_storage_is_no_error(root, monkeypatch):
    """Two heads join at once and share /srv/clusterbake/controller: the other one's mkdir can land
    between this one's look and its own (a rehearsal's failover cluster: 'File exists')."""
    shared = root / "srv/clusterbake/controller/power"
    looked = []

    def made_by_the_other_head(path):
        if path == shared and not looked:
            looked.append(path)
            path.mkdir(parents=True)  # the other head, just after this one looked
            return False
        return original(path)

    original = program.Path.is_dir
    monkeypatch.setattr(program.Path, "is_dir", made_by_the_other_head)
    node = program.Node(root, boot=False)
    node.directory({"path": "/srv/clusterbake/controller/power", "mode": "0755"})
    assert looked and shared.is_dir() and shared.stat().st_mode & 0o7777 == 0o755


def test_a_digest_restarts_its_service_when_it_replaces_one_not_when_it_is_new(root):
    """restart_on_create: false (the head's slurmctld restart digest): a first digest says nothing about
    what the running daemon read; a different one later does."""
    digest = {"path": "/etc/clusterbake/d.digest", "mode": "0644", "restart": ["slurmctld"], "restart_on_create": False}
    node = program.Node(root, boot=False)
    node.write_file({**digest, "content_b64": b64("one")})
    assert node.restart == set()
    node.write_file({**digest, "content_b64": b64("two")})
    assert node.restart == {"slurmctld"}


def test_a_held_running_service_whose_file_changed_is_reported_for_the_caller_to_restart(root, systemd):
    (systemd.state / "enabled" / "slurmctld").touch()
    (systemd.state / "active" / "slurmctld").touch()
    node = program.Node(root, boot=False, hold=["slurmctld"])
    node.live = True
    node.restart.add("slurmctld")
    node.services(["slurmctld"])
    assert node.restart_held == ["slurmctld"]
    assert not [call for call in systemd() if "restart" in call]


def test_uid_conflict_is_an_error_not_a_silent_change(root, tmp_path):
    users = [{"name": "alice", "uid": os.getuid() + 1, "gid": os.getgid()}]
    result = join(root, bundle(users=users), tmp_path)
    assert result.returncode == 1
    assert "user alice exists with uid" in result.stderr


def test_unknown_bundle_format_is_refused(root, tmp_path):
    result = join(root, bundle(format=99), tmp_path)
    assert result.returncode == 1 and "bundle format 99" in result.stderr


def test_install_keeps_the_bundle_from_stdin_private(root, tmp_path):
    kept = tmp_path / "kept" / "node-join.json"
    text = json.dumps(bundle())
    run = subprocess.run(
        [sys.executable, PROGRAM, "--root", str(root), "--install", "--bundle", str(kept.relative_to(root))],
        input=text, capture_output=True, text=True,
    )  # fmt: skip
    assert "join bundle" in changed(run)
    assert kept.read_text() == text and kept.stat().st_mode & 0o777 == 0o600
    again = subprocess.run(
        [sys.executable, PROGRAM, "--root", str(root), "--install", "--bundle", str(kept.relative_to(root))],
        input=text, capture_output=True, text=True,
    )  # fmt: skip
    assert changed(again) == []


# --- mounts (shared_storage's .mount units): before the users ---------------------------

HOME_UNIT = "[Unit]\nDescription=t\n\n[Mount]\nWhat=10.0.7.21:/\nWhere=/home\nType=nfs4\nOptions=hard,_netdev\n"


def mount_spec(text: str = HOME_UNIT, unit: str = "home.mount") -> dict:
    return {"path": f"/etc/systemd/system/{unit}", "content_b64": b64(text), "mode": "0644"}


def test_mounts_are_written_before_the_users_and_files(root, tmp_path):
    first = changed(join(root, bundle(mounts=[mount_spec()]), tmp_path))
    unit = root / "etc/systemd/system/home.mount"
    assert unit.read_text() == HOME_UNIT and unit.stat().st_mode & 0o777 == 0o644
    # --root: the unit files only (no systemctl), in the order of the program's steps.
    assert "/etc/systemd/system/home.mount" in first
    assert first.index("/etc/systemd/system/home.mount") < first.index("sudo alice") < first.index("/etc/hosts")
    assert changed(join(root, bundle(mounts=[mount_spec()]), tmp_path)) == []


def _load_program():
    return programs.load_program("clusterbake_node_join", PROGRAM)


program = _load_program()


def test_apply_mounts_before_it_creates_users(root):
    calls = []

    class Recording(program.Node):
        def mounts(self, units):
            calls.append(("mounts", [Path(u["path"]).name for u in units]))

        def users(self, users, manage_homes):
            calls.append(("users", [u["name"] for u in users]))

        def write_file(self, spec, label=None):
            calls.append(("file", spec["path"]))
            return False

        def services(self, services):
            calls.append(("services", services))

    program.apply(bundle(mounts=[mount_spec()], ca_certificates=[]), Recording(root, boot=True))
    assert [c[0] for c in calls] == ["mounts", "users", "file", "file", "services"]
    assert calls[0] == ("mounts", ["home.mount"])


FAKE_SYSTEMCTL = """#!/bin/sh
# A systemd stand-in: units are active/enabled when a file of their name exists.
# A call that skips the SysV helpers (SYSTEMCTL_SKIP_SYSV, as systemctl reads it) is logged so.
echo "${SYSTEMCTL_SKIP_SYSV:+SYSTEMCTL_SKIP_SYSV=$SYSTEMCTL_SKIP_SYSV }systemctl $*" >> "$FAKE_SYSTEMD/log"
# is-active / is-enabled print one state per unit (none with --quiet) and exit 0 when at least
# one unit is active / enabled, as systemctl does.
verb=$1; shift
units=""; quiet=""; found=""
for arg in "$@"; do case "$arg" in --quiet) quiet=1 ;; --*) ;; *) units="$units $arg" ;; esac; done
say() { [ -n "$quiet" ] || echo "$1"; }
for unit in $units; do
  case "$verb" in
    is-active) if [ -e "$FAKE_SYSTEMD/active/$unit" ]; then say active; found=1; else say inactive; fi ;;
    is-enabled) if [ -e "$FAKE_SYSTEMD/enabled/$unit" ]; then say enabled; found=1; else say disabled; fi ;;
    enable) touch "$FAKE_SYSTEMD/enabled/$unit" ;;
    start|restart) touch "$FAKE_SYSTEMD/active/$unit" ;;
    *) exit 3 ;;
  esac
done
case "$verb" in
  is-active) [ -n "$found" ] || exit 3 ;;
  is-enabled) [ -n "$found" ] || exit 1 ;;
esac
[ "$verb" = daemon-reload ] || [ -n "$units" ] || exit 3
"""
FAKE_UMOUNT = """#!/bin/sh
# Fails like umount on a busy file system (EBUSY, status 32) when told to.
echo "umount $*" >> "$FAKE_SYSTEMD/log"
[ -e "$FAKE_SYSTEMD/busy" ] && exit 32
rm -f "$FAKE_SYSTEMD/active/$(echo "$1" | sed 's|^/||; s|/|-|g').mount"
"""


@pytest.fixture
def systemd(tmp_path, monkeypatch):
    """Fake systemctl and umount on PATH; returns a function giving (and clearing) their calls."""
    state = tmp_path / "systemd"
    for sub in ("bin", "active", "enabled"):
        (state / sub).mkdir(parents=True)
    for name, text in (("systemctl", FAKE_SYSTEMCTL), ("umount", FAKE_UMOUNT)):
        (state / "bin" / name).write_text(text)
        (state / "bin" / name).chmod(0o755)
    monkeypatch.setenv("FAKE_SYSTEMD", str(state))
    monkeypatch.setenv("PATH", f"{state / 'bin'}:{os.environ['PATH']}")

    def calls() -> list[str]:
        log = state / "log"
        lines = log.read_text().splitlines() if log.exists() else []
        log.unlink(missing_ok=True)
        return lines

    calls.state = state
    return calls


def live_mounts(root: Path, units: list[dict]) -> list[str]:
    """Node.mounts as on a live node (systemctl and umount are the fakes), files under `root`."""
    node = program.Node(root, boot=True)
    node.live = True
    me = pwd.getpwuid(os.getuid()).pw_name
    group = grp.getgrgid(os.getgid()).gr_name
    node.mounts([dict(u, owner=me, group=group) for u in units])
    return node.changed


def test_live_mount_is_written_enabled_and_started(root, systemd):
    assert live_mounts(root, [mount_spec()]) == [
        "/etc/systemd/system/home.mount",
        "enabled home.mount",
        "mounted home.mount",
    ]
    assert systemd() == [
        "systemctl daemon-reload",
        "systemctl is-enabled home.mount",
        "systemctl is-active home.mount",
        "systemctl enable --quiet home.mount",
        "systemctl start home.mount",  # a plain start even at boot: the users need the mount
    ]
    # Mounted and unchanged: left alone, nothing reported.
    assert live_mounts(root, [mount_spec()]) == []
    assert systemd() == ["systemctl is-enabled home.mount", "systemctl is-active home.mount"]


def test_changed_unit_is_remounted_when_nothing_uses_it(root, systemd):
    live_mounts(root, [mount_spec()])
    systemd()
    changed_unit = HOME_UNIT.replace("hard,_netdev", "hard,noresvport,_netdev")
    assert live_mounts(root, [mount_spec(changed_unit)]) == ["/etc/systemd/system/home.mount", "mounted home.mount"]
    calls = systemd()
    assert calls[0] == "systemctl daemon-reload"
    assert calls.index("umount /home") < calls.index("systemctl start home.mount")
    assert not any("restart" in call or "stop" in call for call in calls)


def test_changed_unit_of_a_busy_mount_waits_for_the_next_boot(root, systemd):
    live_mounts(root, [mount_spec()])
    systemd()
    (systemd.state / "busy").touch()
    changed_unit = HOME_UNIT.replace("hard,_netdev", "hard,noresvport,_netdev")
    assert live_mounts(root, [mount_spec(changed_unit)]) == [
        "/etc/systemd/system/home.mount",
        "changed home.mount, remount at next boot (/home is busy)",
    ]
    assert "systemctl start home.mount" not in systemd()
    assert (root / "etc/systemd/system/home.mount").read_text() == changed_unit
    assert (systemd.state / "active" / "home.mount").exists()


# --- users that leave the bundle ------------------------------------------------------------

FAKE_USERDEL = """#!/bin/sh
# userdel/groupdel stand-in for a root directory: `NAME --root ROOT ENTRY` drops ENTRY's line.
echo "$(basename "$0") $*" >> "$FAKE_ACCOUNTS_LOG"
table=passwd; [ "$(basename "$0")" = groupdel ] && table=group
sed -i "/^$3:/d" "$2/etc/$table"
"""


@pytest.fixture
def accounts(tmp_path, monkeypatch):
    """Fake userdel and groupdel on PATH; returns a function giving their calls."""
    bin_dir = tmp_path / "accounts-bin"
    bin_dir.mkdir()
    for name in ("userdel", "groupdel"):
        (bin_dir / name).write_text(FAKE_USERDEL)
        (bin_dir / name).chmod(0o755)
    log = tmp_path / "accounts.log"
    monkeypatch.setenv("FAKE_ACCOUNTS_LOG", str(log))
    monkeypatch.setenv("PATH", f"{bin_dir}:{os.environ['PATH']}")
    return lambda: log.read_text().splitlines() if log.exists() else []


def test_a_user_that_leaves_the_bundle_is_removed(root, tmp_path, accounts):
    first = changed(join(root, bundle(), tmp_path))
    assert "users record" in first
    assert json.loads((root / "var/lib/clusterbake/join-users.json").read_text()) == {"users": ["alice"]}
    result = changed(join(root, bundle(users=[]), tmp_path))
    assert "removed user alice" in result
    assert accounts() == [f"userdel --root {root} alice", f"groupdel --root {root} alice"]
    assert "alice:" not in (root / "etc/passwd").read_text() and "alice:" not in (root / "etc/group").read_text()
    assert not (root / "etc/sudoers.d/alice").exists()
    assert json.loads((root / "var/lib/clusterbake/join-users.json").read_text()) == {"users": []}
    assert changed(join(root, bundle(users=[]), tmp_path)) == []


def test_only_users_a_bundle_had_are_ever_removed(root, tmp_path, accounts):
    """An account of the image or a local one (alice here, never in a bundle this node applied) stays."""
    assert "removed user alice" not in changed(join(root, bundle(users=[]), tmp_path))
    assert accounts() == []
    assert "alice:" in (root / "etc/passwd").read_text()


def test_a_file_among_the_mounts_is_written_before_any_unit_starts(root, systemd):
    """The LNet settings (role amlfs_client) ride with the Lustre unit: mount.lustre reads them when it loads lnet."""
    lnet = {
        "path": "/etc/modprobe.d/lnet.conf",
        "content_b64": base64.b64encode(b'options lnet networks="tcp(eth0)"\n').decode(),
        "mode": "0644",
    }
    assert live_mounts(root, [lnet, mount_spec()]) == [
        "/etc/modprobe.d/lnet.conf",
        "/etc/systemd/system/home.mount",
        "enabled home.mount",
        "mounted home.mount",
    ]
    assert (root / "etc/modprobe.d/lnet.conf").read_text() == 'options lnet networks="tcp(eth0)"\n'
    calls = systemd()
    assert calls[0] == "systemctl daemon-reload"  # both files are written before anything is started
    assert not any("lnet" in call for call in calls)  # a plain file: no unit of its name is enabled or started


def test_services_are_enabled_in_one_call_without_a_daemon_reload(root, systemd):
    """Each `systemctl enable` reloads systemd (and once more per SysV script, through update-rc.d):
    a join enables its services in one call that reloads nothing, then starts those not running."""
    (systemd.state / "enabled" / "munge").touch()
    (systemd.state / "active" / "munge").touch()
    node = program.Node(root, boot=False)
    node.live = True
    node.services(["munge", "slurmd", "clusterbake-health.timer"])
    assert node.changed == [
        "enabled slurmd",
        "enabled clusterbake-health.timer",
        "started slurmd",
        "started clusterbake-health.timer",
    ]
    calls = systemd()
    assert "SYSTEMCTL_SKIP_SYSV=1 systemctl enable --quiet --no-reload slurmd clusterbake-health.timer" in calls
    assert not [c for c in calls if "daemon-reload" in c or (" enable " in c and "--no-reload" not in c)]
    # Both started in one call; munge, running, was not restarted.
    assert "systemctl start slurmd clusterbake-health.timer" in calls
    # Enabled and running: a second join changes nothing; it asks about all services in two calls.
    node = program.Node(root, boot=False)
    node.live = True
    node.services(["munge", "slurmd", "clusterbake-health.timer"])
    assert node.changed == []
    assert systemd() == [
        "systemctl is-enabled munge slurmd clusterbake-health.timer",
        "systemctl is-active munge slurmd clusterbake-health.timer",
    ]


def test_held_services_are_enabled_but_not_started(root, systemd):
    """A node joined before its controller runs (the local provider's, during the head's play): the
    services that talk to slurmctld as they start are enabled for the caller to start later, and a
    changed file of theirs does not restart them either."""
    (systemd.state / "active" / "clusterbake-health.timer").touch()
    node = program.Node(
        root, boot=False, restart=["clusterbake-health.timer"], hold=["slurmd", "clusterbake-health.timer"]
    )
    node.live = True
    node.services(["munge", "slurmd", "clusterbake-health.timer"])
    assert node.changed == ["enabled munge", "enabled slurmd", "enabled clusterbake-health.timer", "started munge"]
    calls = systemd()
    assert "systemctl start munge" in calls
    assert not [c for c in calls if "slurmd" in c and (" start" in c or "restart" in c)]
    assert not [c for c in calls if "restart" in c]


def test_a_unit_systemctl_prints_no_state_for_is_asked_about_alone(root, systemd):
    """systemctl stops at a unit it has no file of (is-enabled: no line for it or the units after):
    the states are then asked one unit at a time rather than matched to the wrong units."""
    (systemd.state / "enabled" / "munge").touch()
    stop_at_a_second_unit = '[ "$verb" = is-enabled ] && [ "$1" != --quiet ] && [ $# -gt 1 ] && exit 1'
    (systemd.state / "bin" / "systemctl").write_text(
        FAKE_SYSTEMCTL.replace("verb=$1; shift", f"verb=$1; shift\n{stop_at_a_second_unit}")
    )
    node = program.Node(root, boot=False)
    node.live = True
    assert node.unit_states("is-enabled", ["munge", "slurmd"]) == {"munge": True, "slurmd": False}
    assert systemd() == [
        "systemctl is-enabled munge slurmd",
        "systemctl is-enabled --quiet munge",
        "systemctl is-enabled --quiet slurmd",
    ]


def test_keep_writes_the_bundle_privately_and_applies_nothing(root, tmp_path):
    """--keep: the controller's copy of a self-joining group's bundle, written where providers read it."""
    kept = tmp_path / "bundles" / "cpu.json"
    text = json.dumps(bundle()) + "\n"

    def keep(stdin: str) -> subprocess.CompletedProcess:
        return subprocess.run(
            [sys.executable, PROGRAM, "--root", str(root), "--keep", str(kept)],
            input=stdin,
            capture_output=True,
            text=True,
        )

    assert changed(keep(text)) == ["kept bundle"]
    assert kept.read_text() == text and kept.stat().st_mode & 0o777 == 0o600
    assert not (root / "etc/hosts").exists()  # nothing applied
    assert changed(keep(text)) == []
    refused = keep("not json")
    assert refused.returncode == 1 and kept.read_text() == text
