"""The image store (clusterbake.images.store): local images by inputs digest, the records of
cloud image ids, and how each provider finds its image there."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time

import pytest

from clusterbake.config import ClusterConfig
from clusterbake.errors import MissingImageError
from clusterbake.images.inputs import builder_groups, local_inputs_digest
from clusterbake.images.store import (
    ImageStore,
    azure_image_source,
    find_aws_image,
    find_azure_image,
    find_local_image,
    write_aws_record,
    write_azure_record,
)
from clusterbake.state import StateDir

SUBSCRIPTION = "11111111-2222-3333-4444-555555555555"
MANAGED = f"/subscriptions/{SUBSCRIPTION}/resourceGroups/images/providers/Microsoft.Compute/images/clusterbake-x"
GALLERY = (
    f"/subscriptions/{SUBSCRIPTION}/resourceGroups/images/providers/Microsoft.Compute/galleries/g/images/"
    "clusterbake-ubuntu-24.04/versions/2026.1201.93015"
)


def local_config(**image) -> ClusterConfig:
    return ClusterConfig.model_validate(
        {"cluster_name": "demo", "image": image, "node_groups": [{"name": "cpu", "count": 1}]}
    )


def azure_config(**azure) -> ClusterConfig:
    section = {
        "subscription_id": SUBSCRIPTION,
        "location": "eastus",
        "resource_group": "demo-rg",
        "vnet_name": "vnet",
        "subnet_name": "nodes",
    }
    return ClusterConfig.model_validate(
        {
            "cluster_name": "demo",
            "provider": "azure",
            "azure": section | azure,
            "head": {"instance_type": "Standard_D4s_v5"},
            "node_groups": [{"name": "gpu", "count": 1, "instance_type": "Standard_ND96isr_H100_v5"}],
        }
    )


def make_image(store: ImageStore, name: str, digest: str, age: float = 0, **manifest) -> None:
    image = store.dir / name
    (image / "rootfs").mkdir(parents=True)
    (image / "manifest.json").write_text(json.dumps({"name": name, "inputs_digest": digest, **manifest}))
    stamp = time.time() - age
    os.utime(image / "manifest.json", (stamp, stamp))
    store.record(digest, name)


# --- local images --------------------------------------------------------------------------


def test_lookup_by_inputs_digest_and_latest(tmp_path):
    store = ImageStore(StateDir(tmp_path))
    assert store.index() == {} and store.latest() is None and store.lookup("x") is None
    make_image(store, "clusterbake-debian-12-old", "aaaa", age=60)
    make_image(store, "clusterbake-debian-12-new", "bbbb")
    assert store.lookup("aaaa") == tmp_path / "images" / "clusterbake-debian-12-old"
    assert store.latest().name == "clusterbake-debian-12-new"
    assert json.loads(store.index_file.read_text()) == {
        "aaaa": "clusterbake-debian-12-old",
        "bbbb": "clusterbake-debian-12-new",
    }
    # An index entry whose image is gone is no image.
    (store.dir / "clusterbake-debian-12-old" / "manifest.json").unlink()
    assert store.lookup("aaaa") is None
    record = store.local_record(store.dir / "clusterbake-debian-12-new", reused=True)
    assert (record.provider, record.name, record.inputs_digest, record.reused) == (
        "local",
        "clusterbake-debian-12-new",
        "bbbb",
        True,
    )


def test_local_provider_finds_the_image_of_its_inputs_else_the_newest_of_its_kind(tmp_path, capsys):
    config = local_config()
    state = StateDir(tmp_path)
    with pytest.raises(MissingImageError, match="no debian-12 image with groups slurm_head, slurm_compute"):
        find_local_image(config, state)
    store = ImageStore(state)
    kind = {"base": "debian-12", "builder_groups": builder_groups(config)}
    make_image(store, "clusterbake-debian-12-other", "0000000000000000", age=60, **kind)
    # Newer, but of another kind: a twin's cloud image (group aws, its boot steps wait for
    # an instance metadata service), one of another base, one that does not say.
    groups = kind["builder_groups"]
    make_image(store, "clusterbake-debian-12-twin", "1" * 16, age=30, base="debian-12", builder_groups=[*groups, "aws"])
    make_image(store, "clusterbake-ubuntu-24.04-new", "2" * 16, age=20, base="ubuntu-24.04", builder_groups=groups)
    make_image(store, "clusterbake-debian-12-unknown", "3" * 16, age=10)
    assert find_local_image(config, state).name == "clusterbake-debian-12-other"
    # More components than needed do no harm (switched on by group at cluster time).
    train = [*groups, "train"]
    make_image(store, "clusterbake-debian-12-train", "4" * 16, age=5, base="debian-12", builder_groups=train)
    assert find_local_image(config, state).name == "clusterbake-debian-12-train"
    assert "warning: roles, playbooks or image settings changed" in capsys.readouterr().err
    make_image(store, "clusterbake-debian-12-exact", local_inputs_digest(config), age=3600)
    assert find_local_image(config, state).name == "clusterbake-debian-12-exact"


def test_cloud_build_settings_do_not_change_the_local_image():
    plain = local_inputs_digest(local_config())
    assert local_inputs_digest(local_config(aws={"volume_size_gb": 500}, azure={"vm_size": "Standard_D4s_v5"})) == plain
    assert local_inputs_digest(local_config(package_pins={"slurmd": "22.05.*"})) != plain


# --- cloud records -------------------------------------------------------------------------


def test_cloud_records_are_written_atomically_with_a_history_copy(tmp_path):
    store = ImageStore(StateDir(tmp_path))
    assert store.read_cloud_record("aws") is None
    path = store.write_cloud_record("aws", {"ami_id": "ami-0123456789abcdef0", "region": "us-east-1", "name": "n1"})
    assert path == tmp_path / "images" / "aws-latest.json"
    assert store.read_cloud_record("aws")["name"] == "n1"
    assert json.loads((tmp_path / "images" / "aws" / "n1.json").read_text())["ami_id"] == "ami-0123456789abcdef0"
    assert not list((tmp_path / "images").glob("*.tmp"))
    with pytest.raises(ValueError, match="no image records"):
        store.cloud_record_path("gcp")
    path.write_text("[1, 2]")
    with pytest.raises(MissingImageError, match="not an image record"):
        store.read_cloud_record("aws")


def test_write_aws_record_checks_the_ami_id(tmp_path):
    with pytest.raises(ValueError, match="not an AMI id"):
        write_aws_record(StateDir(tmp_path), "i-0123456789abcdef0", "us-east-1")
    write_aws_record(StateDir(tmp_path), "ami-0123456789abcdef0", "us-east-1", name="x")
    assert not (tmp_path / "images" / "aws").exists()  # no history copy: the record only


def test_aws_record_of_another_region_is_refused(tmp_path):
    config = ClusterConfig.model_validate(
        {
            "cluster_name": "demo",
            "provider": "aws",
            "aws": {"region": "us-east-1", "vpc_id": "vpc-0123456789abcdef0", "subnet_id": "subnet-0123456789abcdef0"},
            "head": {"instance_type": "m7i.2xlarge"},
            "node_groups": [{"name": "cpu", "count": 1, "instance_type": "m7i.2xlarge"}],
        }
    )
    state = StateDir(tmp_path)
    write_aws_record(state, "ami-0123456789abcdef0", "eu-west-1")
    with pytest.raises(MissingImageError, match="built in eu-west-1, the cluster runs in us-east-1"):
        find_aws_image(config, state)


def test_azure_provider_finds_the_recorded_managed_image(tmp_path):
    config, state = azure_config(), StateDir(tmp_path)
    with pytest.raises(MissingImageError, match=r"run `make image PROVIDER=azure` \(or set azure.image\)"):
        find_azure_image(config, state)
    write_azure_record(state, MANAGED, "eastus", name="clusterbake-x")
    assert find_azure_image(config, state) == MANAGED
    assert azure_image_source(config, state) == str(tmp_path / "images" / "azure-latest.json")
    write_azure_record(state, MANAGED, "westeurope")
    with pytest.raises(MissingImageError, match="is in westeurope, the cluster runs in eastus"):
        find_azure_image(config, state)


def test_azure_gallery_version_is_found_where_it_is_replicated(tmp_path):
    config, state = azure_config(location="westus3"), StateDir(tmp_path)
    write_azure_record(state, GALLERY, "eastus", replication_regions=["eastus", "westus3"])
    assert find_azure_image(config, state) == GALLERY
    write_azure_record(state, GALLERY, "eastus", replication_regions=["eastus"])
    with pytest.raises(MissingImageError, match="the cluster runs in westus3"):
        find_azure_image(config, state)


def test_azure_image_in_the_config_wins(tmp_path):
    config = azure_config(image="Canonical:ubuntu-24_04-lts:server:latest")
    assert find_azure_image(config, StateDir(tmp_path)) == "Canonical:ubuntu-24_04-lts:server:latest"
    assert azure_image_source(config, StateDir(tmp_path)) == "azure.image"


@pytest.mark.parametrize(
    ("record", "error"),
    [
        ({"location": "eastus"}, "not an image record {image, location}"),
        ({"image": "ami-0123456789abcdef0", "location": "eastus"}, "is not a managed image or gallery image version"),
    ],
)
def test_bad_azure_records(tmp_path, record, error):
    state = StateDir(tmp_path)
    ImageStore(state).write_cloud_record("azure", record, history=False)
    with pytest.raises(MissingImageError, match=error.replace("{", r"\{").replace("}", r"\}")):
        find_azure_image(azure_config(), state)
    with pytest.raises(ValueError, match="not a managed image"):
        write_azure_record(state, "ami-0123456789abcdef0", "eastus")


def test_a_second_image_build_waits_for_the_first_and_says_so(tmp_path, capsys):
    """Builds share the debootstrap and wheelhouse caches and the index: one at a time per store
    (another `make image`, or a twin building its node image while the suite builds its own)."""
    store = ImageStore(StateDir(tmp_path))
    store.dir.mkdir(parents=True)
    # Another process holds the lock (as a build in progress does) until told to let go.
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import fcntl, os, sys; fd = os.open(sys.argv[1], os.O_RDWR | os.O_CREAT); "
            "fcntl.flock(fd, fcntl.LOCK_EX); print('held', flush=True); sys.stdin.read()",
            str(store.dir / ".build.lock"),
        ],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert holder.stdout.readline().strip() == "held"
    order = []

    def build():
        with store.build_lock():
            order.append("second build")

    waiter = threading.Thread(target=build)
    waiter.start()
    waiter.join(timeout=1.0)
    assert waiter.is_alive() and order == []  # still waiting while the first holds the lock
    order.append("first done")
    holder.stdin.close()  # the first build ends: its lock goes with its process
    holder.wait(timeout=10)
    waiter.join(timeout=10)
    assert order == ["first done", "second build"]
    assert "another image build holds" in capsys.readouterr().err


def test_the_node_tests_boot_one_local_image():
    """Every cluster config of the node tests has the image inputs of the suite's (a config with
    other features is an image build of minutes in the node tests); the ops test's second
    image, built on purpose, comes from a config it writes itself."""
    from pathlib import Path

    from clusterbake.config import load_config

    configs = sorted((Path(__file__).resolve().parents[1] / "integration").glob("*.yaml"))
    suite = local_inputs_digest(load_config(configs[0].with_name("cluster.yaml")))
    others = {path.name: local_inputs_digest(load_config(path)) for path in configs}
    assert len(others) >= 6  # cluster, elastic, faults, gpu, monitoring, ops
    assert {name: digest for name, digest in others.items() if digest != suite} == {}
