"""The local image: cached debootstrap base -> builder node -> packer null.local -> versioned image.

An image is a directory images/<name>/ with rootfs/ and manifest.json. The
inputs (image config, playbooks, roles, packer templates) are checksummed, as
az-hop does, so an unchanged rebuild is a lookup in the store (images/store.py).
The builder node is a systemd-nspawn machine on the host network (clusterbake.nspawn).
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import time
import uuid
from collections.abc import Iterable
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

import yaml

from clusterbake.config import ClusterConfig, extra_ca_files
from clusterbake.errors import ClusterbakeError
from clusterbake.images import packer
from clusterbake.images.base import PackerRun, ansible_playbook_command
from clusterbake.images.inputs import (
    BASE_PACKAGES,
    SUITE,
    base_key,
    builder_groups,
    local_inputs_digest,
    node_group_features,
)
from clusterbake.images.store import ImageRecord, ImageStore
from clusterbake.nspawn import machines
from clusterbake.paths import git_revision, repo_root
from clusterbake.progress import phase, run_logged, say
from clusterbake.state import StateDir
from clusterbake.wheelhouse import ensure_wheelhouse

SOURCE = "null.local"


class LocalBuilder:
    """The local provider's image (Debian 12 rootfs for nspawn nodes)."""

    name = "local"
    source = SOURCE

    def inputs_digest(self, config: ClusterConfig) -> str:
        return local_inputs_digest(config)

    def packer_vars(self, config: ClusterConfig, run: PackerRun) -> dict[str, str]:
        if run.ssh_port is None or run.ssh_private_key_file is None:
            raise ClusterbakeError("the local build needs the builder node's SSH port and key")
        return {
            "builder_ssh_port": str(run.ssh_port),
            "builder_ssh_private_key_file": str(run.ssh_private_key_file),
            "image_vars_file": str(run.image_vars_file),
            "ansible_playbook_command": ansible_playbook_command(),
            "ansible_groups": json.dumps(builder_groups(config)),
            "ansible_tags": json.dumps(list(run.ansible_tags)),
        }

    def build(self, config: ClusterConfig, state: StateDir, *, force: bool = False) -> ImageRecord:
        store = ImageStore(state)
        digest = local_inputs_digest(config)
        reused = not force and store.lookup(digest) is not None
        return store.local_record(build_image(config, state, force=force), reused=reused)


def ensure_base(config: ClusterConfig, state: StateDir, log_file: Path) -> Path:
    """A debootstrap rootfs, cached by its inputs; built in a temp dir, then renamed."""
    target = state.cache / f"debootstrap-{SUITE[config.image.base]}-{base_key(config)}"
    if (target / "rootfs" / "etc" / "os-release").exists():
        say(f"    base rootfs cached: {target}")
        return target / "rootfs"
    tmp = target.with_name(target.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    try:
        run_logged(
            [
                "debootstrap",
                "--variant=minbase",
                f"--include={','.join(BASE_PACKAGES)}",
                SUITE[config.image.base],
                str(tmp / "rootfs"),
                config.image.mirror,
            ],
            log_file,
            what="debootstrap",
        )
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    shutil.rmtree(target, ignore_errors=True)
    tmp.rename(target)
    return target / "rootfs"


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _prepare_builder(root: Path, config: ClusterConfig, port: int, key: Path) -> None:
    suite = SUITE[config.image.base]
    (root / "etc/apt/sources.list").write_text(
        f"deb {config.image.mirror} {suite} main\n"
        f"deb {config.image.mirror} {suite}-updates main\n"
        f"deb {config.image.security_mirror} {suite}-security main\n"
    )
    (root / "etc/hostname").write_text("builder\n")
    (root / "etc/machine-id").write_text(uuid.uuid4().hex + "\n")
    (root / "etc/ssh/sshd_config.d/clusterbake-builder.conf").write_text(
        f"# builder only, removed from the image\nPort {port}\nListenAddress 127.0.0.1\n"
    )
    # -A says which keys it makes on stdout even with -q: kept off stdout (`twin up` prints only exports there).
    subprocess.run(["ssh-keygen", "-q", "-A", "-f", str(root)], check=True, stdout=subprocess.DEVNULL)
    ssh_dir = root / "root/.ssh"
    ssh_dir.mkdir(mode=0o700, exist_ok=True)
    (ssh_dir / "authorized_keys").write_text(key.with_suffix(".pub").read_text())


def _clean_image(root: Path) -> None:
    """Remove what must differ per node or must not ship: identity, keys, caches."""
    for pattern in (
        "etc/ssh/ssh_host_*",
        "etc/ssh/sshd_config.d/clusterbake-builder.conf",
        "root/.ssh/authorized_keys",
        "var/lib/apt/lists/*_*",
        "var/cache/apt/*.bin",
        "var/cache/apt/archives/*.deb",
        "var/log/journal/*",
        "etc/munge/munge.key",
    ):
        for path in root.glob(pattern):
            if path.is_dir():
                shutil.rmtree(path)
            else:
                path.unlink()
    (root / "etc/machine-id").write_text("")
    (root / "etc/hostname").write_text("localhost\n")
    # apt judges its cache by the lists directory's age: without the lists it must look stale, so that
    # a build on this image (a layer) updates the cache before it installs.
    lists = root / "var/lib/apt/lists"
    if lists.is_dir():
        os.utime(lists, (0, 0))


@contextmanager
def builder_node(root: Path, log_dir: Path, port: int):
    """Boot the build root as a node on the host network; always stopped at the end."""
    machine = f"cb-builder-{os.getpid()}"
    argv = machines.nspawn_argv(machine, "builder", root, netns=None, binds={})
    pid = machines.spawn(argv, machine, log_dir / "builder-console.log")
    try:
        deadline = time.monotonic() + 60
        while not machines.sshd_answers("127.0.0.1", port):
            if time.monotonic() > deadline or not machines.alive(pid):
                raise ClusterbakeError(f"builder node did not start sshd; console: {log_dir / 'builder-console.log'}")
            time.sleep(0.1)
        yield
    finally:
        machines.stop(pid)
        machines.remove_cgroups(machine)


def image_name(config: ClusterConfig) -> str:
    stamp = datetime.now(UTC).strftime("%Y%m%d-%H%M%S")
    return f"clusterbake-{config.image.base}-{stamp}-{git_revision()}"


def build_image(config: ClusterConfig, state: StateDir, force: bool = False, layer_groups: Iterable[str] = ()) -> Path:
    """Bake the local image (or reuse the one of the same inputs unless force); its directory.

    With `layer_groups` (feature groups of the config), an image of the same inputs without them,
    when the store has one, is the base: a copy of it gets only the roles of those groups
    (ansible/image.yml's tags), instead of every role on a fresh debootstrap. The result is the
    image a full build makes, under the same inputs digest; without such a base, a full build."""
    store = ImageStore(state)
    digest = local_inputs_digest(config)
    # An image is recorded once complete: a lookup needs no lock (nor waits for another build).
    existing = None if force else store.lookup(digest)
    if existing is None:
        with store.build_lock():
            existing = None if force else store.lookup(digest)  # another build may have made it meanwhile
            if existing is None:
                return _bake(config, state, store, digest, Layer.on_stored_base(config, store, layer_groups))
    say(f"==> image {existing.name} is up to date (inputs {digest}); FORCE=1 rebuilds")
    return existing


@dataclass(frozen=True)
class Layer:
    """A build on a baked image: its rootfs as the start, only the added groups' roles run."""

    base: Path  # the baked image's directory
    groups: tuple[str, ...]  # the feature groups it adds (ansible/image.yml's tags)

    @classmethod
    def on_stored_base(cls, config: ClusterConfig, store: ImageStore, groups: Iterable[str]) -> Layer | None:
        added = tuple(sorted({str(g) for g in groups} & set(node_group_features(config))))
        if not added:
            return None
        base_config = config.model_copy(
            update={
                "node_groups": [
                    g.model_copy(update={"features": [f for f in g.features if f not in added]})
                    for g in config.node_groups
                ]
            }
        )
        base = store.lookup(local_inputs_digest(base_config))
        return cls(base, added) if base else None


def _bake(config: ClusterConfig, state: StateDir, store: ImageStore, digest: str, layer: Layer | None = None) -> Path:
    """Build a new image for these inputs (the caller holds the store's build lock)."""
    name = image_name(config)
    log_dir = state.root / "logs"
    log_file = log_dir / f"image-{name}.log"
    say(f"    log: {log_file}")
    if layer:
        say(f"    a layer of {', '.join(layer.groups)} on {layer.base.name}")
        start = layer.base / "rootfs"
    else:
        with phase("base rootfs (debootstrap, cached)"):
            start = ensure_base(config, state, log_file)
    groups = builder_groups(config)
    wheelhouse = None
    if "train" in (layer.groups if layer else groups):
        with phase("training wheelhouse (torch, DeepSpeed; cached)"):
            wheelhouse = ensure_wheelhouse(state.cache, log_file, config.training.extra_requirements)
    build_dir = store.dir / f"{name}.build"
    try:
        with phase("builder node" + (" (a copy of the base image)" if layer else "")):
            build_dir.mkdir(parents=True)
            subprocess.run(["cp", "-a", "--reflink=auto", str(start), str(build_dir / "rootfs")], check=True)
            key = build_dir / "builder_key"
            subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(key)], check=True)
            port = _free_port()
            _prepare_builder(build_dir / "rootfs", config, port, key)
            vars_file = build_dir / "image-vars.yml"
            image_vars = {
                "common_package_pins": dict(config.image.package_pins),
                "clusterbake_extra_ca_certificates": extra_ca_files(config),
                "clusterbake_image_name": name,
                # nspawn nodes run the host's kernel: no kernel of the image's to hold or check.
                "clusterbake_image_own_kernel": False,
            }
            if wheelhouse:
                image_vars["training_env_wheelhouse"] = str(wheelhouse)
            vars_file.write_text(yaml.safe_dump(image_vars))
        with builder_node(build_dir / "rootfs", log_dir, port), phase("packer build (ansible/image.yml)"):
            run = PackerRun(
                name=name,
                image_vars_file=vars_file,
                ssh_port=port,
                ssh_private_key_file=key,
                ansible_tags=layer.groups if layer else (),
            )
            packer.build(repo_root() / "packer", LocalBuilder().packer_vars(config, run), log_file, only=SOURCE)
        with phase("finish image"):
            root = build_dir / "rootfs"
            versions_file = root / "opt/clusterbake/versions.json"
            if not versions_file.exists():
                raise ClusterbakeError(f"the build wrote no {versions_file}; see {log_file}")
            _clean_image(root)
            manifest = {
                "name": name,
                "created": datetime.now(UTC).isoformat(timespec="seconds"),
                "git_revision": git_revision(),
                "inputs_digest": digest,
                "base": config.image.base,
                # What the image holds: a stale image is only a stand-in for one of the same groups.
                "builder_groups": builder_groups(config),
                "packer_version": packer.packer_version(),
                "package_pins": dict(config.image.package_pins),
                "versions": json.loads(versions_file.read_text()),
            }
            if layer:
                manifest["layered_on"] = {"image": layer.base.name, "groups": list(layer.groups)}
            for leftover in ("builder_key", "builder_key.pub", "image-vars.yml"):
                (build_dir / leftover).unlink(missing_ok=True)
            (build_dir / "manifest.json").write_text(json.dumps(manifest, indent=2, sort_keys=True) + "\n")
            final = store.dir / name
            build_dir.rename(final)
            store.record(digest, name)
    except BaseException:
        shutil.rmtree(build_dir, ignore_errors=True)
        raise
    say(f"    image {final}")
    return final
