"""Writes from the host into a node's root directory that never follow the node's own links.

A node's root is the node's: its root (any user with sudo there, or anyone who became root
in it) may replace /etc/clusterbake or a file in it with a link to a host path. The host
then must not write through it (`ln -s /etc/shadow /etc/clusterbake/node-join.json` on a node
would have the host overwrite its own /etc/shadow). Every step here is taken from a
directory descriptor, each component opened with O_NOFOLLOW: a link anywhere in the path is
an error, never followed.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from pathlib import Path, PurePosixPath

from clusterbake.errors import ClusterbakeError

_DIRECTORY = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW


@contextlib.contextmanager
def directory_in(root: Path, inside: str, create: bool = True) -> Iterator[int]:
    """A descriptor of the directory at `inside` (absolute, as the node sees it) under `root`,
    made 0755 where missing when `create`."""
    if create:
        root.mkdir(parents=True, exist_ok=True)  # the host's own path (the node's root mount point)
    fd = os.open(root, _DIRECTORY)
    try:
        for part in PurePosixPath(inside).parts[1:]:
            if part in ("..", "."):
                raise ClusterbakeError(f"{inside}: not a plain path")
            try:
                child = os.open(part, _DIRECTORY, dir_fd=fd)
            except FileNotFoundError:
                if not create:
                    raise
                os.mkdir(part, 0o755, dir_fd=fd)
                child = os.open(part, _DIRECTORY, dir_fd=fd)
            except OSError as exc:  # ELOOP, ENOTDIR: a link or a file where a directory belongs
                raise ClusterbakeError(
                    f"{root}{inside}: {part} is not a directory of the node's own ({exc.strerror}); "
                    "the node changed it: remove the node (clusterbake cluster down) or that path"
                ) from None
            os.close(fd)
            fd = child
        yield fd
    finally:
        os.close(fd)


def write_in_root(root: Path, path: str, data: bytes, mode: int = 0o600) -> bool:
    """Write the node's file at `path` (absolute, as the node sees it) unless it holds `data` with
    `mode`: a temporary file renamed over it. True when written."""
    parent, name = str(PurePosixPath(path).parent), PurePosixPath(path).name
    with directory_in(root, parent) as dir_fd:
        try:
            fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW, dir_fd=dir_fd)
            with os.fdopen(fd, "rb") as handle:
                if handle.read() == data and os.fstat(handle.fileno()).st_mode & 0o7777 == mode:
                    return False
        except OSError:
            pass  # missing, or a link: replaced
        tmp = f".{name}.clusterbake-tmp"
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp, dir_fd=dir_fd)
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, mode, dir_fd=dir_fd)
        with os.fdopen(fd, "wb") as handle:
            os.fchmod(handle.fileno(), mode)
            handle.write(data)
        os.replace(tmp, name, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)
    return True


def remove_in_root(root: Path, path: str) -> None:
    """Remove the node's file at `path` (a link is removed, not followed); nothing if missing."""
    parent, name = str(PurePosixPath(path).parent), PurePosixPath(path).name
    with contextlib.suppress(FileNotFoundError), directory_in(root, parent, create=False) as dir_fd:
        os.unlink(name, dir_fd=dir_fd)


def link_in_root(root: Path, path: str, target: str) -> None:
    """Make the node's `path` a link to `target` (as the node resolves it: masking a unit)."""
    parent, name = str(PurePosixPath(path).parent), PurePosixPath(path).name
    with directory_in(root, parent) as dir_fd:
        try:
            if os.readlink(name, dir_fd=dir_fd) == target:
                return
        except OSError:
            pass
        with contextlib.suppress(FileNotFoundError, IsADirectoryError):
            os.unlink(name, dir_fd=dir_fd)
        os.symlink(target, name, dir_fd=dir_fd)
