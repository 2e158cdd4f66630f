"""Reading `gpg --show-keys --with-colons` (GnuPG's DETAILS file: record type in field 1,
a fingerprint in field 10 of the `fpr` record that follows its key)."""

from __future__ import annotations


def gpg_primary_fingerprints(colons: str) -> list[str]:
    """The fingerprints of the primary keys (`pub`) in the listing, upper case; subkeys' left out."""
    fingerprints: list[str] = []
    previous = ""
    for line in colons.splitlines():
        fields = line.split(":")
        if fields[0] == "fpr" and previous == "pub" and len(fields) > 9:
            fingerprints.append(fields[9].upper())
        previous = fields[0]
    return fingerprints


class FilterModule:
    def filters(self):
        return {"gpg_primary_fingerprints": gpg_primary_fingerprints}
