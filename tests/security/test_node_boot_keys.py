"""Security review finding 14: the boot program only ever added the controller's keys to the login
user's keys file (passwordless sudo): a key the controller dropped (rotated, leaked) stayed valid on
every node. Now the file holds exactly the user data's keys."""

from __future__ import annotations

from pathlib import Path

import programs

PROGRAM = Path(__file__).resolve().parents[2] / "roles" / "cloud_boot" / "files" / "clusterbake-node-boot"


def test_the_login_users_keys_are_exactly_the_user_datas(tmp_path):
    boot = programs.load_program("clusterbake_node_boot_keys", PROGRAM)
    authorized = tmp_path / "clusterbake_authorized_keys" / "ubuntu"
    boot.controller_keys(authorized, ["ssh-ed25519 AAAA old-controller", "ssh-ed25519 AAAA old-controller"])
    assert authorized.read_text() == "ssh-ed25519 AAAA old-controller\n"
    boot.controller_keys(authorized, ["ssh-ed25519 AAAA new-controller"])  # the key was rotated
    assert authorized.read_text() == "ssh-ed25519 AAAA new-controller\n"
    assert authorized.stat().st_mode & 0o777 == 0o644
