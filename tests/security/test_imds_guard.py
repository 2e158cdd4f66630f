"""Security review finding 1 (critical): the cloud nodes' metadata guard (roles/cloud_boot,
imds-guard.nft.j2) loaded by the real nft into a network namespace of its own, with a stand-in
metadata service on 169.254.169.254:80 there. Who connects is decided by the socket's owner,
so each client runs as a given uid. (On a twin node, the same rules against the twins'
metadata services: tests/twin/test_aws_twin.py, test_azure_twin_cluster.py.)"""

from __future__ import annotations

import os
import pwd
import shutil
import subprocess
import sys
import time
from pathlib import Path

import jinja2
import pytest
import yaml

REPO = Path(__file__).resolve().parents[2]
ROLE = REPO / "roles" / "cloud_boot"
NETNS = "cbtest-imds-guard"
STRANGER = 2103  # a cluster user's uid: in no allow list
CLIENT = """
import socket, sys
try:
    socket.create_connection(("169.254.169.254", 80), timeout=3).close()
    print("connected")
except OSError as exc:
    print("refused:", exc)
"""


def render(users: list[str]) -> str:
    defaults = yaml.safe_load((ROLE / "defaults" / "main.yml").read_text())
    template = jinja2.Environment(loader=jinja2.FileSystemLoader(ROLE / "templates"), keep_trailing_newline=True)
    return template.get_template("imds-guard.nft.j2").render(
        __cloud_boot_imds_users=users, cloud_boot_metadata_addresses=defaults["cloud_boot_metadata_addresses"]
    )


@pytest.fixture
def namespace(tmp_path):
    assert os.geteuid() == 0, "the guard is loaded into a network namespace: run as root (CI does)"
    assert shutil.which("nft"), "nft is missing: `make deps` installs nftables"
    subprocess.run(["ip", "netns", "del", NETNS], capture_output=True)
    subprocess.run(["ip", "netns", "add", NETNS], check=True)
    inside = ["ip", "netns", "exec", NETNS]
    subprocess.run([*inside, "ip", "link", "set", "lo", "up"], check=True)
    subprocess.run([*inside, "ip", "addr", "add", "169.254.169.254/32", "dev", "lo"], check=True)
    server = subprocess.Popen(
        [*inside, sys.executable, "-m", "http.server", "--bind", "169.254.169.254", "80"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    try:
        # Before any rule: a refusal must be the guard's, not a service that does not listen yet.
        assert connect_as(inside, 0) == "connected", "the stand-in metadata service did not listen"
        yield inside
    finally:
        server.terminate()
        server.wait(10)
        subprocess.run(["ip", "netns", "del", NETNS], capture_output=True)


def connect_as(inside: list[str], uid: int) -> str:
    """Connect to the stand-in service from inside the namespace as `uid` (setpriv after `ip netns
    exec`, which needs root)."""
    become = ["setpriv", f"--reuid={uid}", f"--regid={uid}", "--clear-groups"] if uid else []
    for _ in range(100):  # until the stand-in service listens (root only: others may be refused)
        out = subprocess.run([*inside, *become, "/usr/bin/python3", "-c", CLIENT], capture_output=True, text=True)
        answer = out.stdout.strip() or f"failed: {out.stderr.strip()}"
        if uid or answer == "connected":
            return answer
        time.sleep(0.1)
    return answer


def load(inside: list[str], tmp_path: Path, users: list[str]) -> None:
    rules = tmp_path / "imds-guard.nft"
    rules.write_text(render(users))
    loaded = subprocess.run([*inside, "nft", "-f", str(rules)], capture_output=True, text=True)
    assert loaded.returncode == 0, loaded.stderr


def test_the_image_time_guard_lets_only_root_reach_the_metadata_service(namespace, tmp_path):
    nobody = pwd.getpwnam("nobody").pw_uid
    assert connect_as(namespace, 0) == "connected"
    assert connect_as(namespace, STRANGER) == "connected"  # no guard yet: what 33121ef's nodes did
    load(namespace, tmp_path, ["root"])
    assert connect_as(namespace, 0) == "connected"
    for uid in (STRANGER, nobody):
        assert connect_as(namespace, uid).startswith("refused:"), uid


def test_the_heads_guard_adds_the_power_programs_user_and_reloads_in_place(namespace, tmp_path):
    """The head's join loads the rules with its SlurmUser (here `nobody` stands in: every host has
    it); a second load replaces the table (the join restarts the guard when the rules change)."""
    nobody = pwd.getpwnam("nobody").pw_uid
    load(namespace, tmp_path, ["root"])
    load(namespace, tmp_path, ["root", "nobody"])
    assert connect_as(namespace, nobody) == "connected"
    assert connect_as(namespace, STRANGER).startswith("refused:")
    tables = subprocess.run([*namespace, "nft", "list", "tables"], capture_output=True, text=True).stdout
    assert tables.split().count("clusterbake_imds") == 1
