"""The vendor repositories' keys (role apt_signed_repository, used by lustre_client, amlfs_client and
blobfuse2): apt trusts a downloaded key only when it is the pinned one, and the only one in the file.

A real ansible-playbook run of the role on this machine, against keys made here with gpg and
served over HTTP on 127.0.0.1; the keyring and sources file go to a temporary directory. What a
substituted key (or one slipped in beside the vendor's) does is checked by serving one.
"""

from __future__ import annotations

import functools
import http.server
import os
import subprocess
import sys
import threading
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parents[2]
ROLES = REPO / "roles"
ANSIBLE_PLAYBOOK = Path(sys.executable).with_name("ansible-playbook")


def make_key(home: Path, uid: str) -> tuple[str, str]:
    """A new ed25519 signing key in GNUPGHOME `home`: (fingerprint, ASCII-armoured public key)."""
    home.mkdir(mode=0o700, exist_ok=True)
    env = {**os.environ, "GNUPGHOME": str(home)}

    def gpg(*args: str) -> str:
        return subprocess.run(
            ["gpg", "--batch", "--quiet", *args], env=env, check=True, capture_output=True, text=True
        ).stdout

    try:
        gpg("--passphrase", "", "--quick-gen-key", uid, "ed25519", "sign", "never")
        listing = gpg("--with-colons", "--list-keys", uid)
        fingerprint = next(line.split(":")[9] for line in listing.splitlines() if line.startswith("fpr:"))
        return fingerprint, gpg("--armor", "--export", uid)
    finally:  # gpg starts an agent for the home: none is left behind
        subprocess.run(["gpgconf", "--homedir", str(home), "--kill", "gpg-agent"], env=env, check=False)


@pytest.fixture(scope="module")
def keys(tmp_path_factory) -> dict[str, tuple[str, str]]:
    home = tmp_path_factory.mktemp("gnupg")
    return {name: make_key(home / name, f"{name} <{name}@example.invalid>") for name in ("vendor", "intruder")}


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    """A directory served on 127.0.0.1: (directory, base URL)."""
    root = tmp_path_factory.mktemp("served")
    handler = functools.partial(http.server.SimpleHTTPRequestHandler, directory=str(root))
    handler.log_message = lambda *args: None
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield root, f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()


def add_repository(tmp: Path, key_url: str, fingerprint: str) -> subprocess.CompletedProcess:
    """The role, run for real: a keyring and a sources file under tmp."""
    playbook = tmp / "play.yml"
    role_vars = {
        "apt_signed_repository_name": "the vendor's test repository",
        "apt_signed_repository_owner": "lustre_client",
        "apt_signed_repository_key_url": key_url,
        "apt_signed_repository_key_fingerprint": fingerprint,
        "apt_signed_repository_keyring": str(tmp / "vendor.gpg"),
        "apt_signed_repository_sources_file": str(tmp / "vendor.list"),
        "apt_signed_repository_options": "arch=amd64",
        "apt_signed_repository_url": "https://packages.example.invalid/ubuntu",
        "apt_signed_repository_suite": "noble",
    }
    role = {"role": "apt_signed_repository", "vars": role_vars}
    play = [{"hosts": "localhost", "gather_facts": False, "roles": [role]}]
    playbook.write_text(yaml.safe_dump(play))
    env = {
        **os.environ,
        "ANSIBLE_CONFIG": str(REPO / "ansible" / "ansible.cfg"),
        "ANSIBLE_ROLES_PATH": str(ROLES),
        "ANSIBLE_LOCAL_TEMP": str(tmp / "ansible-local"),
        "ANSIBLE_NOCOLOR": "1",
        "PATH": f"{ANSIBLE_PLAYBOOK.parent}:{os.environ.get('PATH', '/usr/bin:/bin')}",
    }
    return subprocess.run(
        [str(ANSIBLE_PLAYBOOK), "-i", "localhost,", "-c", "local", str(playbook)],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )


@pytest.fixture(autouse=True)
def _root():
    assert os.geteuid() == 0, "the role writes root-owned keyrings: run as root (CI does)"


def test_the_pinned_key_becomes_the_repositorys_keyring(tmp_path, keys, served):
    root, url = served
    fingerprint, armoured = keys["vendor"]
    (root / "vendor.asc").write_text(armoured)
    run = add_repository(tmp_path, f"{url}/vendor.asc", fingerprint.lower())  # any case
    assert run.returncode == 0, run.stdout[-4000:]
    shown = subprocess.run(
        ["gpg", "--batch", "--with-colons", "--show-keys", str(tmp_path / "vendor.gpg")],
        capture_output=True, text=True, check=True,
    )  # fmt: skip
    assert fingerprint in shown.stdout
    assert (tmp_path / "vendor.list").read_text().splitlines()[1] == (
        f"deb [arch=amd64 signed-by={tmp_path / 'vendor.gpg'}] https://packages.example.invalid/ubuntu noble main"
    )
    again = add_repository(tmp_path, f"{url}/vendor.asc", fingerprint)
    assert again.returncode == 0 and "changed=0" in again.stdout, again.stdout[-3000:]


@pytest.mark.parametrize("served_keys", [["intruder"], ["vendor", "intruder"]], ids=["substituted", "one-slipped-in"])
def test_any_other_key_is_refused_and_nothing_trusted(tmp_path, keys, served, served_keys):
    root, url = served
    name = "-".join(served_keys) + ".asc"
    (root / name).write_text("".join(keys[k][1] for k in served_keys))
    run = add_repository(tmp_path, f"{url}/{name}", keys["vendor"][0])
    assert run.returncode != 0
    assert f"not only the pinned {keys['vendor'][0]}" in run.stdout, run.stdout[-3000:]
    assert keys["intruder"][0] in run.stdout  # names what it found
    assert not (tmp_path / "vendor.gpg").exists() and not (tmp_path / "vendor.list").exists()


def test_a_malformed_pin_fails_before_anything_is_fetched(tmp_path, served):
    _, url = served
    run = add_repository(tmp_path, f"{url}/never-fetched.asc", "")
    assert run.returncode != 0
    assert 'The key fingerprint pinned for the vendor\'s test repository is ""' in run.stdout, run.stdout[-3000:]
    assert not (tmp_path / "vendor.gpg.asc").exists()


def test_every_vendor_repository_goes_through_the_role_with_a_pinned_fingerprint():
    """The roles that add a vendor's apt repository pin a fingerprint in their defaults."""
    for role in ("lustre_client", "amlfs_client", "blobfuse2"):
        tasks = (ROLES / role / "tasks" / "repository.yml").read_text()
        assert "name: apt_signed_repository" in tasks and "get_url" not in tasks, role
        defaults = yaml.safe_load((ROLES / role / "defaults" / "main.yml").read_text())
        assert len(defaults[f"{role}_repo_key_fingerprint"]) == 40, role
