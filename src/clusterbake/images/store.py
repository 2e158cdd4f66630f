"""The image store: where images and their records are, and how a provider finds its image.

Under `<state_dir>/images/`:

    <name>/{rootfs/,manifest.json}   local images (name: clusterbake-<base>-<date>-<time>-<git rev>)
    index.json                       local: inputs digest -> image name
    <cloud>-latest.json              the last cloud image build's record (aws, azure)
    <cloud>/<name>.json              a copy of the record per cloud image built

A cloud record names the image the nodes boot (docs/architecture.md, "Image records"):
aws `{"ami_id", "region", ...}`, azure `{"image", "location", ...}`; other keys
(name, versions, inputs digest, ...) are kept and ignored by the lookup. The builders
write here; the providers only read (`find_local_image`, `find_aws_image`,
`find_azure_image`). This module imports no builder and no provider.
"""

from __future__ import annotations

import fcntl
import json
import os
import re
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

from clusterbake.config import ClusterConfig
from clusterbake.errors import MissingImageError
from clusterbake.images.inputs import builder_groups, local_inputs_digest
from clusterbake.progress import say
from clusterbake.state import StateDir

CLOUDS = ("aws", "azure")
AMI_PATTERN = re.compile(r"^ami-[0-9a-f]{8,17}$")
# A managed image or a gallery image version, by resource id.
AZURE_IMAGE_PATTERN = re.compile(
    r"^/subscriptions/[0-9a-fA-F-]{36}/resourceGroups/[-\w.()]+/providers/Microsoft\.Compute/"
    r"(images/[^/]+|galleries/[^/]+/images/[^/]+/versions/[^/]+)$",
    re.IGNORECASE,
)
AWS_BUILD_HINT = "run `make image PROVIDER=aws` (or set aws.ami_id)"
AZURE_BUILD_HINT = "run `make image PROVIDER=azure` (or set azure.image)"


@dataclass(frozen=True)
class ImageRecord:
    """What a build made (or found already made for the same inputs)."""

    provider: str  # local, aws, azure
    image_id: str  # local: the image directory; aws: the AMI id; azure: the image's resource id
    name: str
    inputs_digest: str
    location: str | None = None  # aws region, azure location; None for local images
    data: Mapping = field(default_factory=dict)  # local: manifest.json; clouds: the record as stored
    reused: bool = False  # found in the store, not built


# Builder groups that put a cloud's boot steps (role cloud_boot) into an image.
CLOUD_BOOT_GROUPS = frozenset({"aws", "azure"})


class ImageStore:
    """The images of one state directory: local images by inputs digest, cloud records by cloud."""

    def __init__(self, state: StateDir):
        self.dir = state.images
        self.index_file = self.dir / "index.json"

    # --- local images ----------------------------------------------------------------------

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

    @contextmanager
    def build_lock(self) -> Iterator[None]:
        """One local image build at a time per state directory: builds share the debootstrap and
        wheelhouse caches and this index. A second build waits here (and says so), then finds
        the image the first one made when their inputs match."""
        self.dir.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.dir / ".build.lock", os.O_RDWR | os.O_CREAT, 0o600)
        try:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                say(f"    another image build holds {self.dir / '.build.lock'}; waiting for it")
                fcntl.flock(fd, fcntl.LOCK_EX)
            yield
        finally:
            os.close(fd)  # releases the flock

    def record(self, digest: str, name: str) -> None:
        index = self.index()
        index[digest] = name
        self.dir.mkdir(parents=True, exist_ok=True)
        tmp = self.index_file.with_suffix(".tmp")
        tmp.write_text(json.dumps(index, indent=2, sort_keys=True) + "\n")
        tmp.replace(self.index_file)

    @staticmethod
    def manifest(image: Path) -> dict:
        return json.loads((Path(image) / "manifest.json").read_text())

    def local_record(self, image: Path, reused: bool = False) -> ImageRecord:
        manifest = self.manifest(image)
        return ImageRecord(
            provider="local",
            image_id=str(image),
            name=manifest.get("name", Path(image).name),
            inputs_digest=manifest.get("inputs_digest", ""),
            data=manifest,
            reused=reused,
        )

    # --- cloud image records -----------------------------------------------------------------

    def cloud_record_path(self, cloud: str) -> Path:
        if cloud not in CLOUDS:
            raise ValueError(f"no image records for {cloud!r} (clouds: {', '.join(CLOUDS)})")
        return self.dir / f"{cloud}-latest.json"

    def read_cloud_record(self, cloud: str) -> dict | None:
        """The last build's record, or None; a file that is not a JSON object raises MissingImageError."""
        path = self.cloud_record_path(cloud)
        if not path.is_file():
            return None
        try:
            record = json.loads(path.read_text())
        except ValueError:
            record = None
        if not isinstance(record, dict):
            raise MissingImageError(f"{path}: not an image record (a JSON object)")
        return record

    def write_cloud_record(self, cloud: str, record: Mapping, *, history: bool = True) -> Path:
        """<cloud>-latest.json (atomically), and with history a copy in <cloud>/<name>.json."""
        path = self.cloud_record_path(cloud)
        path.parent.mkdir(parents=True, exist_ok=True)
        text = json.dumps(dict(record), indent=2, sort_keys=True) + "\n"
        if history:
            name = record.get("name") or record.get("ami_id") or str(record.get("image", "")).rsplit("/", 1)[-1]
            copy = path.parent / cloud / f"{name}.json"
            copy.parent.mkdir(parents=True, exist_ok=True)
            copy.write_text(text)
        tmp = path.with_suffix(".tmp")
        tmp.write_text(text)
        tmp.replace(path)
        return path


# --- how each provider finds its image ----------------------------------------------------------


def find_local_image(config: ClusterConfig, state: StateDir) -> Path:
    """The local image for the current inputs, else the newest one (with a warning)."""
    store = ImageStore(state)
    exact = store.lookup(local_inputs_digest(config))
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


def _built_image_record(
    state: StateDir, cloud: str, keys: tuple[str, str], pattern: re.Pattern, words: tuple[str, str, str], hint: str
) -> tuple[Path, dict]:
    """The store's <cloud>-latest.json and its record, which has `keys` (image id, location) and an
    image id that matches `pattern`; else MissingImageError. `words`: what the image is called
    ("AMI"), the config key that would name it instead, and what its id must be ("an AMI id")."""
    id_key, location_key = keys
    noun, setting, kind = words
    store = ImageStore(state)
    path = store.cloud_record_path(cloud)
    if not path.is_file():
        raise MissingImageError(f"no {noun}: {setting} is not set and {path} does not exist; {hint}")
    try:
        record = store.read_cloud_record(cloud)
        image_id, _ = record[id_key], record[location_key]
    except (MissingImageError, KeyError, TypeError):
        raise MissingImageError(f"{path}: not an image record {{{id_key}, {location_key}}}; {hint}") from None
    if not isinstance(image_id, str) or not pattern.match(image_id):
        raise MissingImageError(f"{path}: {id_key} {image_id!r} is not {kind}; {hint}")
    return path, record


def write_aws_record(state: StateDir, ami_id: str, region: str, **extra) -> Path:
    """Record an AMI as the one AWS nodes boot (atomically; no history copy)."""
    if not AMI_PATTERN.match(ami_id):
        raise ValueError(f"not an AMI id: {ami_id!r}")
    return ImageStore(state).write_cloud_record("aws", {"ami_id": ami_id, "region": region, **extra}, history=False)


def aws_image_source(config: ClusterConfig, state: StateDir) -> str:
    """Where find_aws_image takes the AMI from (for messages)."""
    assert config.aws is not None
    return "aws.ami_id" if config.aws.ami_id else str(ImageStore(state).cloud_record_path("aws"))


def find_aws_image(config: ClusterConfig, state: StateDir) -> str:
    """aws.ami_id, else the AMI of the last AWS image build, if it was built in aws.region."""
    assert config.aws is not None
    if config.aws.ami_id:
        return config.aws.ami_id
    path, record = _built_image_record(
        state, "aws", ("ami_id", "region"), AMI_PATTERN, ("AMI", "aws.ami_id", "an AMI id"), AWS_BUILD_HINT
    )
    ami_id, region = record["ami_id"], record["region"]
    if region != config.aws.region:
        raise MissingImageError(
            f"{path}: {ami_id} was built in {region}, the cluster runs in {config.aws.region}; {AWS_BUILD_HINT}"
        )
    return ami_id


def write_azure_record(state: StateDir, image_id: str, location: str, **extra) -> Path:
    """Record an Azure image (managed image or gallery image version id) as the one nodes boot."""
    if not AZURE_IMAGE_PATTERN.match(image_id):
        raise ValueError(f"not a managed image or gallery image version id: {image_id!r}")
    record = {"image": image_id, "location": location, **extra}
    return ImageStore(state).write_cloud_record("azure", record, history="name" in extra)


def azure_image_source(config: ClusterConfig, state: StateDir) -> str:
    """Where find_azure_image takes the image from (for messages)."""
    assert config.azure is not None
    return "azure.image" if config.azure.image else str(ImageStore(state).cloud_record_path("azure"))


def find_azure_image(config: ClusterConfig, state: StateDir) -> str:
    """azure.image, else the image of the last Azure image build: its gallery image version when it
    was published to a gallery (replicated to azure.location), else its managed image (which must
    be in azure.location)."""
    assert config.azure is not None
    if config.azure.image:
        return config.azure.image
    path, record = _built_image_record(
        state,
        "azure",
        ("image", "location"),
        AZURE_IMAGE_PATTERN,
        ("image", "azure.image", "a managed image or gallery image version id"),
        AZURE_BUILD_HINT,
    )
    image_id, location = record["image"], record["location"]
    wanted = config.azure.location
    regions = [location, *record.get("replication_regions", [])] if "/galleries/" in image_id.lower() else [location]
    if wanted not in regions:
        raise MissingImageError(
            f"{path}: {image_id.rsplit('/', 1)[-1]} is in {', '.join(regions)}, the cluster runs in {wanted}; "
            f"{AZURE_BUILD_HINT}"
        )
    return image_id
