"""Slurm's REST API on the head (slurmrestd, JWT only): a user's token, and where to send it."""

from __future__ import annotations

import re
from dataclasses import dataclass

from clusterbake import remote
from clusterbake.config import ClusterConfig
from clusterbake.errors import ClusterbakeError, ConfigError
from clusterbake.providers.base import Provider

# A login name as the config's users and the directory's (no option or shell syntax reaches the head).
USER_NAME = re.compile(r"^[a-z_][a-z0-9_.-]{0,31}$")
# scontrol token's own bounds are wide; a day at most keeps a leaked token short-lived.
MAX_LIFESPAN = 86400
# The data parser of the images' Slurm (22.05: v0.0.38).
API_VERSION = "v0.0.38"


@dataclass(frozen=True)
class Token:
    user: str
    jwt: str
    lifespan: int
    url: str  # slurmrestd's base URL on the cluster network


def issue(config: ClusterConfig, provider: Provider, user: str, lifespan: int) -> Token:
    """A JWT for `user` (a user the head knows: the config's or the directory's), made by slurmctld
    (`scontrol token`, as root on the head); the key never leaves the head."""
    if not config.rest_api.enabled:
        raise ConfigError("token: rest_api.enabled is false in the config; set it to true and run `cluster up`")
    if not USER_NAME.match(user):
        raise ConfigError(f"token: {user!r} is not a user name")
    if not 60 <= lifespan <= MAX_LIFESPAN:
        raise ConfigError(f"token --lifespan: {lifespan} s; give 60 to {MAX_LIFESPAN}")
    head = provider.controller_endpoint()
    known = remote.run(head, ["id", "-u", "--", user], check=False, timeout=60)
    if known.returncode != 0:
        raise ConfigError(f"token: the head knows no user {user!r} (users: in the config, or the directory's)")
    result = remote.run(head, ["scontrol", "token", f"username={user}", f"lifespan={lifespan}"], timeout=60)
    found = re.search(r"^SLURM_JWT=(\S+)$", result.text(), re.M)
    if not found:
        raise ClusterbakeError(f"token: scontrol token printed no token for {user}: {result.text()[:200]}")
    return Token(user, found.group(1), lifespan, f"http://{head.host}:{config.rest_api.port}")
