"""Each node group's join bundle in the cluster's Key Vault, packed to fit (join_envelope.py).

Key Vault holds "a maximum size of 25 KB each" a secret (Microsoft, "About Azure Key Vault
secrets"), and refuses more with 400 BadParameter, "Secret is beyond the maximum permitted
length of 25600 characters." (inner code SecretTooLarge). A group's bundle is the secret
`join-<group>`: the gzipped bundle itself where it fits, else an index of parts
`join-<group>--1`, `--2`, ... (a group name has no `--`, so no group's secret is another's
part), each read at the version the index names.

Publishing writes the parts first and the index last: a node reads the old bundle or the new
one, never a mix. The versions a publish replaced are disabled after (an old bundle holds an
old munge key), and so is every version of a part the bundle no longer needs: a node that read
the old index just before meets a disabled part and reads the index again. Parts are disabled,
not deleted: Key Vault keeps a deleted secret's name for the vault's retention days, and a
bundle that grows again needs it. `cluster down` purges the vault, and every part with it.

Values are never logged or put in an error: the bundle holds the munge key.
"""

from __future__ import annotations

import re

from clusterbake.progress import say
from clusterbake.providers import join_envelope
from clusterbake.providers.azure import resources
from clusterbake.providers.azure.api import get_or_none

VALUE_LIMIT = 25 * 1024  # bytes of a secret's value (ASCII here: Key Vault's 25600 characters)
# Every boot reads the index and each part: Key Vault serves 4,000 reads per 10 s a vault, so
# 400 nodes booting together at 1 + 8 reads each stay under it. 8 parts: about 200 KB of gzip.
MAX_PARTS = 8


def part_name(nodegroup: str, number: int) -> str:
    return f"{resources.secret_name(nodegroup)}--{number}"


def pack(nodegroup: str, bundle: str) -> join_envelope.Packed:
    """The bundle packed for Key Vault; a ClusterbakeError naming what to change where even
    MAX_PARTS parts do not hold it (before anything is written)."""
    packed = join_envelope.pack(bundle, VALUE_LIMIT)
    if len(packed.chunks) > MAX_PARTS:
        raise join_envelope.too_large(
            nodegroup,
            f"{len(bundle.encode())} bytes ({sum(map(len, packed.chunks))} gzipped, in base64)",
            f"Key Vault's {MAX_PARTS} secrets of {VALUE_LIMIT} bytes",
        )
    return packed


def disable_replaced_versions(client, name: str, keep: str | None) -> int:
    """Disable every enabled version of secret `name` but `keep` (None: all of them): Key Vault keeps
    each version readable until then, and an old join bundle holds an old munge key. Returns how many."""
    disabled = 0
    for version in client.list_properties_of_secret_versions(name):
        if version.version != keep and version.enabled:
            client.update_secret_properties(name, version.version, enabled=False)
            disabled += 1
    return disabled


def _unchanged(current, packed: join_envelope.Packed) -> bool:
    if current is None or join_envelope.published_digest(current.value) != packed.sha256:
        return False
    return len(join_envelope.parts_of(current.value)) == len(packed.chunks)


def publish(client, nodegroup: str, bundle: str, tags: dict, vault_url: str) -> list[str]:
    """Make `bundle` the group's published one (nothing written when it already is) and disable what
    it replaced; returns the changes to report."""
    packed = pack(nodegroup, bundle)
    name = resources.secret_name(nodegroup)
    changes = []
    current = get_or_none(client.get_secret, name)
    if not _unchanged(current, packed):
        parts = []
        for number, chunk in enumerate(packed.chunks, start=1):
            part = client.set_secret(part_name(nodegroup, number), chunk, content_type="text/plain", tags=tags)
            parts.append({"name": part.name, "version": part.properties.version})
        value = packed.inline if packed.inline is not None else packed.index(parts)
        current = client.set_secret(name, value, content_type="application/json", tags=tags)
        split = f" in {len(parts)} parts" if parts else ""
        say(f"    join bundle of {nodegroup} published{split} ({vault_url}secrets/{name})")
        changes.append(f"{nodegroup}: join bundle published (running VMs take it at their next boot)")
    # Also when nothing changed: a run stopped halfway left versions enabled.
    disabled = disable_replaced_versions(client, name, current.properties.version)
    kept = {part["name"]: part["version"] for part in join_envelope.parts_of(current.value)}
    parts_pattern = re.compile(re.escape(f"{name}--") + "[0-9]+")
    for secret in client.list_properties_of_secrets():
        if parts_pattern.fullmatch(secret.name):
            disabled += disable_replaced_versions(client, secret.name, kept.get(secret.name))
    if disabled:
        changes.append(f"{nodegroup}: {disabled} replaced join bundle version(s) disabled")
    return changes
