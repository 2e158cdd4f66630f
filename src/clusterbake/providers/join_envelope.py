"""A node group's join bundle made to fit a secret store that caps each secret's size.

The bundle (roles/node_join/README.md, "The bundle") grows with the cluster: /etc/hosts lists
every planned node (elastic ones too), and the users, their SSH keys and the extra CA
certificates ride along. Key Vault holds 25 KB a secret, Secrets Manager 64 KiB.

`pack` writes the bundle as an envelope (JSON) that the node's boot program reads back
(roles/cloud_boot/files/clusterbake-node-boot, `decode_bundle`; the two sides ship together in
the node image and the controller of one release):

    {"clusterbake_bundle": 2, "encoding": "gzip+base64", "sha256": "<hex of the bundle>",
     "data": "<base64 of the gzipped bundle>"}

and where that is still over the limit, `data` is cut into parts, each a secret of its own,
named in order by the envelope (the index) with the version each part has to be read at:

    {..., "parts": [{"name": "join-gpu--1", "version": "<id>"}, ...]}

The digest is of the bundle itself: the node checks what it put together. The gzip has no
time stamp, so the same bundle packs to the same bytes (a re-run writes nothing).

Nothing here logs or puts a bundle's content in an error: it holds the munge key.
"""

from __future__ import annotations

import base64
import gzip
import hashlib
import json
from dataclasses import dataclass

from clusterbake.errors import ClusterbakeError

FORMAT = 2  # format 1 is the bundle itself (roles/node_join)
ENCODING = "gzip+base64"
# What makes a bundle big, as the config names it.
SHRINK_HINT = (
    "fewer planned nodes (node_groups[].count / max_count: /etc/hosts lists every one), fewer users or "
    "SSH keys (users), fewer extra CA certificates (image.extra_ca_certificates)"
)


def too_large(nodegroup: str, size: str, store: str) -> ClusterbakeError:
    """The error of a bundle that does not fit: its size and what the store takes (both as text)."""
    return ClusterbakeError(
        f"join bundle of node group {nodegroup}: {size}, more than {store} holds; nothing was published. "
        f"Make it smaller: {SHRINK_HINT}"
    )


def digest(bundle: str) -> str:
    return hashlib.sha256(bundle.encode()).hexdigest()


@dataclass(frozen=True)
class Packed:
    """A bundle packed for a store of `limit` bytes a secret: `inline` (the whole envelope, one
    secret) or `chunks` (the parts' values in order; the index is `index(parts)`)."""

    sha256: str
    inline: str | None
    chunks: tuple[str, ...]

    def index(self, parts: list[dict]) -> str:
        """The envelope naming the parts ({"name", "version"} each, in order)."""
        return _envelope(self.sha256, {"parts": parts})


def _envelope(sha256: str, body: dict) -> str:
    return json.dumps(
        {"clusterbake_bundle": FORMAT, "encoding": ENCODING, "sha256": sha256, **body},
        separators=(",", ":"),
        sort_keys=True,
    )


def pack(bundle: str, limit: int) -> Packed:
    data = base64.b64encode(gzip.compress(bundle.encode(), compresslevel=9, mtime=0)).decode()
    sha256 = digest(bundle)
    inline = _envelope(sha256, {"data": data})
    if len(inline) <= limit:
        return Packed(sha256, inline, ())
    return Packed(sha256, None, tuple(data[start : start + limit] for start in range(0, len(data), limit)))


def published_digest(value: str | None) -> str | None:
    """The digest an envelope says it holds; None for anything else (nothing, or an older plain bundle)."""
    try:
        envelope = json.loads(value or "")
    except ValueError:
        return None
    if not isinstance(envelope, dict) or envelope.get("clusterbake_bundle") != FORMAT:
        return None
    if envelope.get("encoding") != ENCODING:
        return None
    return envelope.get("sha256")


def parts_of(value: str) -> list[dict]:
    """The parts an index names (none for an envelope that holds its data)."""
    return list(json.loads(value).get("parts") or [])
