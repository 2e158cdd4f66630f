"""Filters of role amlfs_client."""

from __future__ import annotations

import re


def _key(kernel: str) -> list[tuple[int, object]]:
    # "6.8.0-1021-azure" -> numbers compare as numbers, words as words.
    return [(0, int(part)) if part.isdigit() else (1, part) for part in re.split(r"[.-]", kernel)]


def amlfs_client_kernel_sort(kernels) -> list[str]:
    """Kernel release strings in version order (6.8.0-999-azure before 6.8.0-1021-azure), duplicates dropped."""
    return sorted(set(kernels), key=_key)


class FilterModule:
    def filters(self):
        return {"amlfs_client_kernel_sort": amlfs_client_kernel_sort}
