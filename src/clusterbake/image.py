"""Local image builds: cached debootstrap base -> builder node -> packer -> versioned image.

An image is a directory images/<name>/ with rootfs/ and manifest.json. The
inputs (image config, playbooks, roles, packer templates) are checksummed, as
az-hop does, so an unchanged rebuild is a lookup.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import socket
import subprocess
import sys
import time
import uuid
from contextlib import contextmanager
from datetime import UTC, datetime
from pathlib import Path

import yaml

from clusterbake import packer
from clusterbake.config import ClusterConfig, extra_ca_files
from clusterbake.errors import ClusterbakeError, MissingImageError
from clusterbake.paths import git_revision, repo_root
from clusterbake.progress import phase, run_logged, say
from clusterbake.providers.local import machines
from clusterbake.state import StateDir
from clusterbake.wheelhouse import ensure_wheelhouse, wheelhouse_key

SUITE = {"debian-12": "bookworm"}
# What a node needs before Ansible can reach it (python3-apt: Ansible's apt module;
# nodes have no network to fetch it later).
BASE_PACKAGES = [
    "systemd",
    "systemd-sysv",
    "dbus",
    "openssh-server",
    "python3",
    "python3-apt",
    "iproute2",
    "sudo",
    "ca-certificates",
    "procps",
]
INPUT_DIRS = ("ansible", "roles", "packer", "scripts/jobs")


def _digest(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def base_key(config: ClusterConfig) -> str:
    spec = {"suite": SUITE[config.image.base], "mirror": config.image.mirror, "packages": BASE_PACKAGES}
    return _digest(json.dumps(spec, sort_keys=True).encode())[:16]


def inputs_digest(config: ClusterConfig) -> str:
    """Everything that changes what lands in the image."""
    h = hashlib.sha256()
    h.update(json.dumps(config.image.model_dump(), sort_keys=True).encode())
    h.update(base_key(config).encode())
    h.update(" ".join(builder_groups(config)).encode())
    if "train" in builder_groups(config):
        h.update(wheelhouse_key().encode())
    for ca in extra_ca_files(config):
        h.update(Path(ca).read_bytes())
    hash_repository_inputs(h, repo_root())
    return h.hexdigest()[:16]


def hash_repository_inputs(h, root: Path) -> None:
    """Add the files of the repository that go into an image (playbooks, roles, templates, job scripts)."""
    for directory in INPUT_DIRS:
        for path in sorted((root / directory).rglob("*")):
            # Documentation does not change the image; a README edit must not force a rebuild.
            if path.suffix == ".md" or "__pycache__" in path.parts or path.name.startswith(".packer"):
                continue
            if path.is_file():
                h.update(str(path.relative_to(root)).encode() + b"\0" + path.read_bytes() + b"\0")


def builder_groups_for(features) -> list[str]:
    """The builder joins every group a node will be in: features switch components on."""
    return ["slurm_head", "slurm_compute", *sorted({str(f).replace("-", "_") for f in features})]


def builder_groups(config: ClusterConfig) -> list[str]:
    return builder_groups_for(f for group in config.node_groups for f in group.features)


# Builder groups that put a cloud's boot steps (role cloud_boot) into an image.
CLOUD_BOOT_GROUPS = frozenset({"aws", "azure"})


class ImageStore:
    """images/index.json maps an inputs digest to the image built from it."""

    def __init__(self, state: StateDir):
        self.dir = state.images
        self.index_file = self.dir / "index.json"

    def index(self) -> dict:
        return json.loads(self.index_file.read_text()) if self.index_file.exists() else {}

    def lookup(self, digest: str) -> Path | None:
        name = self.index().get(digest)
        if name and (self.dir / name / "manifest.json").exists():
            return self.dir / name
        return None

    def latest(self, base: str | None = None, builder_groups: list[str] | None = None) -> Path | None:
        """The newest local image; with `base` and `builder_groups`, the newest that can stand in
        for an image of those: the same base, every one of the groups (its components), and no
        cloud boot group the config lacks (a twin's image waits for a metadata service at boot)."""
        manifests = sorted(self.dir.glob("*/manifest.json"), key=lambda p: p.stat().st_mtime)
        for path in reversed(manifests):
            try:
                manifest = json.loads(path.read_text())
            except (OSError, ValueError):
                continue
            if base is not None and manifest.get("base") != base:
                continue
            if builder_groups is not None:
                has = set(manifest.get("builder_groups") or ())
                if not has >= set(builder_groups) or (has - set(builder_groups)) & CLOUD_BOOT_GROUPS:
                    continue
            return path.parent
        return None

    def record(self, digest: str, name: str) -> None:
        index = self.index()
        index[digest] = name
        tmp = self.index_file.with_suffix(".tmp")
        tmp.write_text(json.dumps(index, indent=2, sort_keys=True) + "\n")
        tmp.replace(self.index_file)


def find_image(config: ClusterConfig, state: StateDir) -> Path:
    """The image for the current inputs, else the newest one (with a warning)."""
    store = ImageStore(state)
    exact = store.lookup(inputs_digest(config))
    if exact:
        return exact
    groups = builder_groups(config)
    latest = store.latest(base=config.image.base, builder_groups=groups)
    if latest is None:
        raise MissingImageError(
            f"no {config.image.base} image with groups {', '.join(groups)} in {store.dir}; "
            "run `make image` (clusterbake image build) first"
        )
    say(
        f"    warning: roles, playbooks or image settings changed since {latest.name} was built; "
        "`make image` bakes them in (the configure half runs anyway)"
    )
    return latest


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
    subprocess.run(["ssh-keygen", "-q", "-A", "-f", str(root)], check=True)
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


def build_image(config: ClusterConfig, state: StateDir, force: bool = False) -> Path:
    store = ImageStore(state)
    digest = inputs_digest(config)
    existing = store.lookup(digest)
    if existing and not force:
        say(f"==> image {existing.name} is up to date (inputs {digest}); FORCE=1 rebuilds")
        return existing
    name = image_name(config)
    log_dir = state.root / "logs"
    log_file = log_dir / f"image-{name}.log"
    say(f"    log: {log_file}")
    with phase("base rootfs (debootstrap, cached)"):
        base = ensure_base(config, state, log_file)
    groups = builder_groups(config)
    wheelhouse = None
    if "train" in groups:
        with phase("training wheelhouse (torch, DeepSpeed; cached)"):
            wheelhouse = ensure_wheelhouse(state.cache, log_file)
    build_dir = store.dir / f"{name}.build"
    try:
        with phase("builder node"):
            build_dir.mkdir(parents=True)
            subprocess.run(["cp", "-a", "--reflink=auto", str(base), str(build_dir / "rootfs")], check=True)
            key = build_dir / "builder_key"
            subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(key)], check=True)
            port = _free_port()
            _prepare_builder(build_dir / "rootfs", config, port, key)
            vars_file = build_dir / "image-vars.yml"
            image_vars = {
                "common_package_pins": dict(config.image.package_pins),
                "clusterbake_extra_ca_certificates": extra_ca_files(config),
                "clusterbake_image_name": name,
            }
            if wheelhouse:
                image_vars["training_env_wheelhouse"] = str(wheelhouse)
            vars_file.write_text(yaml.safe_dump(image_vars))
        with builder_node(build_dir / "rootfs", log_dir, port), phase("packer build (ansible/image.yml)"):
            packer.build(
                repo_root() / "packer",
                {
                    "builder_ssh_port": str(port),
                    "builder_ssh_private_key_file": str(key),
                    "image_vars_file": str(vars_file),
                    "ansible_playbook_command": str(Path(sys.executable).with_name("ansible-playbook")),
                    "ansible_groups": json.dumps(groups),
                },
                log_file,
                only="null.local",
            )
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
