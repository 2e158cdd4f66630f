"""Where clusterbake keeps images, caches and per-cluster state on the controller."""

from __future__ import annotations

import json
import os
import secrets
import subprocess
from dataclasses import dataclass
from pathlib import Path

from clusterbake.config import ClusterConfig
from clusterbake.paths import below


@dataclass(frozen=True)
class StateDir:
    root: Path

    @classmethod
    def for_config(cls, config: ClusterConfig) -> StateDir:
        return cls(Path(os.environ.get("CLUSTERBAKE_STATE_DIR", config.local.state_dir)))

    images = below("images")
    cache = below("cache")

    def cluster(self, name: str) -> ClusterDir:
        return ClusterDir(self.root / "clusters" / name)


@dataclass(frozen=True)
class ClusterDir:
    root: Path

    state_file = below("state.json")
    ssh_key = below("ssh", "id_ed25519")
    known_hosts = below("ssh", "known_hosts")
    munge_key = below("secrets", "munge.key")
    # The accounting database's password (MariaDB on the head): only the head's join bundle carries it.
    db_password = below("secrets", "slurmdbd.password")
    # slurmrestd's JWT signing key (HS256): only the head's join bundle carries it.
    jwt_key = below("secrets", "jwt_hs256.key")
    # Each node group's join bundle (holds the munge key: 0700 dir, 0600 files).
    join_bundles = below("secrets", "join")
    logs = below("logs")
    home = below("home")

    def storage(self, name: str) -> Path:
        return self.root / "storage" / name

    def node(self, name: str) -> Path:
        return self.root / "nodes" / name

    def exists(self) -> bool:
        return self.state_file.is_file()

    def read_state(self) -> dict:
        return json.loads(self.state_file.read_text()) if self.exists() else {}

    def write_state(self, state: dict) -> None:
        private_dir(self.root.parent.parent)  # the state directory: 0700 (its clusters, images, logs)
        private_dir(self.root)
        with open_private(self.state_file.with_suffix(".tmp")) as tmp:
            tmp.write(json.dumps(state, indent=2, sort_keys=True) + "\n")
        self.state_file.with_suffix(".tmp").replace(self.state_file)

    def ensure_secrets(self) -> None:
        """The cluster's SSH key, munge key, database password and JWT key, created once with tight permissions."""
        self.ssh_key.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        if not self.ssh_key.exists():
            subprocess.run(
                [
                    "ssh-keygen",
                    "-q",
                    "-t",
                    "ed25519",
                    "-N",
                    "",
                    "-C",
                    f"clusterbake@{self.root.name}",
                    "-f",
                    str(self.ssh_key),
                ],
                check=True,
            )
        write_secret(self.munge_key, lambda: secrets.token_bytes(1024))
        # URL-safe characters only: one plain token in slurmdbd.conf and SQL (config.DB_PASSWORD_PATTERN).
        write_secret(self.db_password, lambda: secrets.token_urlsafe(32).encode())
        # SchedMD's JWT guide: 32 random bytes (HS256).
        write_secret(self.jwt_key, lambda: secrets.token_bytes(32))
        self.join_bundles.mkdir(mode=0o700, exist_ok=True)


def private_dir(path: Path) -> Path:
    """A directory only its owner reads (0700), made with its parents if missing; an existing one
    of ours is narrowed. State and logs hold what no other host account should read (node
    output, digests of secrets, clusterbake exec's output)."""
    path.mkdir(parents=True, exist_ok=True, mode=0o700)
    info = path.stat()
    if info.st_uid == os.geteuid() and info.st_mode & 0o077:
        path.chmod(info.st_mode & 0o7700)
    return path


def open_private(path: Path, mode: str = "w"):
    """A file opened for writing ("w" or "a") as 0600, never through a link, in a private directory."""
    private_dir(path.parent)
    flags = os.O_WRONLY | os.O_CREAT | os.O_NOFOLLOW | (os.O_APPEND if mode == "a" else os.O_TRUNC)
    fd = os.open(path, flags, 0o600)
    os.fchmod(fd, 0o600)  # a file that was there keeps its mode through O_CREAT
    return os.fdopen(fd, mode)


def write_secret(path: Path, make) -> bool:
    """Create a 0600 file from a CSPRNG once; never overwrite, never print."""
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:
        return False
    with os.fdopen(fd, "wb") as handle:
        handle.write(make())
    return True
