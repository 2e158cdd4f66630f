"""A stale local image stands in only for one of its kind: same base, every builder group, no cloud boot."""

import json

import pytest

from clusterbake.config import ClusterConfig
from clusterbake.errors import MissingImageError
from clusterbake.image import ImageStore, builder_groups, find_image
from clusterbake.state import StateDir


def _image(store: ImageStore, name: str, **manifest) -> None:
    (store.dir / name / "rootfs").mkdir(parents=True)
    (store.dir / name / "manifest.json").write_text(json.dumps({"name": name, **manifest}))


def test_a_twin_image_never_stands_in_for_a_local_one(tmp_path):
    config = ClusterConfig.model_validate({"cluster_name": "kind", "node_groups": [{"name": "cpu", "count": 1}]})
    state = StateDir(tmp_path)
    store = ImageStore(state)
    groups = builder_groups(config)
    _image(store, "twin", base="debian-12", builder_groups=[*groups, "aws"])
    _image(store, "unknown", base="debian-12")
    with pytest.raises(MissingImageError, match=f"no debian-12 image with groups {', '.join(groups)}"):
        find_image(config, state)
    _image(store, "other-base", base="ubuntu-24.04", builder_groups=groups)
    _image(store, "fewer", base="debian-12", builder_groups=groups[:1])
    with pytest.raises(MissingImageError):
        find_image(config, state)
    # More components than needed do no harm (they are switched on by group at cluster time).
    _image(store, "superset", base="debian-12", builder_groups=[*groups, "train"])
    assert find_image(config, state).name == "superset"
