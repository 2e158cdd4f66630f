"""An image layered on a baked one (clusterbake.images.local.Layer): the twins' node images are the
suite's local image plus the cloud's boot role, not a second full build. What makes that the image
a full build would make: every role behind a feature group is tagged with it in ansible/image.yml,
the roles every image has are not, and what the image records runs on every build."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import yaml

from clusterbake.config import ClusterConfig, load_config
from clusterbake.images.inputs import local_inputs_digest
from clusterbake.images.local import Layer
from clusterbake.images.store import CLOUD_BOOT_GROUPS, ImageStore
from clusterbake.state import StateDir
from clusterbake.twins import host
from clusterbake.twins.aws import control as aws_control
from clusterbake.twins.azure import control as azure_control

REPO = Path(__file__).resolve().parents[2]
PLAY = yaml.safe_load((REPO / "ansible" / "image.yml").read_text())[0]
GROUP_CONDITION = re.compile(r"'(\w+)' in group_names")


@pytest.mark.parametrize("task", PLAY["tasks"], ids=lambda t: t["name"])
def test_a_role_behind_feature_groups_is_tagged_with_them_and_no_other_is(task):
    groups = set(GROUP_CONDITION.findall(str(task.get("when", ""))))
    assert set(task.get("tags", [])) == groups


def test_what_the_image_records_runs_in_a_layer_too():
    assert [task.get("tags") for task in PLAY["post_tasks"]] == [["always"]]


def store_with(tmp_path: Path, config: ClusterConfig) -> tuple[ImageStore, Path]:
    """A store holding a (stand-in) image for the inputs of `config`."""
    store = ImageStore(StateDir(tmp_path))
    image = store.dir / "clusterbake-debian-12-20261205-000000-abcdef0123"
    (image / "rootfs").mkdir(parents=True)
    (image / "manifest.json").write_text(json.dumps({"name": image.name}))
    store.record(local_inputs_digest(config), image.name)
    return store, image


@pytest.mark.parametrize("control", [aws_control, azure_control], ids=["aws", "azure"])
def test_a_twins_image_is_a_layer_of_its_cloud_on_the_suites_image(control, tmp_path):
    suite = load_config(REPO / "tests" / "integration" / "cluster.yaml")
    store, suite_image = store_with(tmp_path, suite)
    # The suite's twins are given the suite's config (tests/suite.py, twintest.twin_environment).
    twin = host.image_config(suite, control.IMAGE_FEATURES)
    layer = Layer.on_stored_base(twin, store, CLOUD_BOOT_GROUPS)
    cloud = "aws" if control is aws_control else "azure"
    assert layer == Layer(base=suite_image, groups=(cloud,))


def test_without_a_base_of_the_same_inputs_the_build_is_a_full_one(tmp_path):
    suite = load_config(REPO / "tests" / "integration" / "cluster.yaml")
    other = suite.model_copy(update={"image": suite.image.model_copy(update={"mirror": "http://mirror.example/"})})
    store, _ = store_with(tmp_path, other)
    twin = host.image_config(suite, aws_control.IMAGE_FEATURES)
    assert Layer.on_stored_base(twin, store, CLOUD_BOOT_GROUPS) is None
    # Nor is there a layer of groups the config does not have.
    assert Layer.on_stored_base(twin, store, {"azure"}) is None
