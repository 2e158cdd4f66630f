"""The one interface of the image builders (clusterbake.images.base): every builder has a
name, a Packer source of packer/, -var values that its template declares, and `build`
returning an ImageRecord; the CLI's `image build` goes through it."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from imagetest import azure_section

from clusterbake import cli
from clusterbake.config import ClusterConfig
from clusterbake.errors import ClusterbakeError
from clusterbake.images.base import BUILDERS, Builder, PackerRun, get_builder
from clusterbake.images.inputs import local_inputs_digest
from clusterbake.images.local import LocalBuilder
from clusterbake.images.store import ImageRecord, ImageStore
from clusterbake.state import StateDir

REPO = Path(__file__).resolve().parents[2]
TEMPLATES = {"local": "local.pkr.hcl", "aws": "aws.pkr.hcl", "azure": "azure.pkr.hcl"}

CONFIGS = {
    "local": {"cluster_name": "demo", "node_groups": [{"name": "cpu", "count": 1, "features": ["train"]}]},
    "aws": {
        "cluster_name": "demo",
        "provider": "aws",
        "aws": {"region": "us-east-1", "vpc_id": "vpc-0123456789abcdef0", "subnet_id": "subnet-0123456789abcdef0"},
        "head": {"instance_type": "m7i.2xlarge"},
        "node_groups": [{"name": "gpu", "count": 1, "instance_type": "p5.48xlarge"}],
    },
    "azure": {
        "cluster_name": "demo",
        "provider": "azure",
        "azure": azure_section(),
        "head": {"instance_type": "Standard_D4s_v5"},
        "node_groups": [{"name": "gpu", "count": 1, "instance_type": "Standard_ND96isr_H100_v5"}],
    },
}


def config_for(name: str) -> ClusterConfig:
    return ClusterConfig.model_validate(CONFIGS[name])


def declared(template: str) -> set[str]:
    names = set()
    for file in (template, "ansible.pkr.hcl"):
        text = (REPO / "packer" / file).read_text()
        names |= set(re.findall(r'^variable "(\w+)"', text, flags=re.MULTILINE))
    return names


def a_run(tmp_path) -> PackerRun:
    return PackerRun(
        name="clusterbake-x-20261201-093015-abcdef0123",
        image_vars_file=tmp_path / "v.yml",
        artifacts_dir=tmp_path / "a",
        ssh_port=2222,
        ssh_private_key_file=tmp_path / "key",
    )


@pytest.mark.parametrize("name", BUILDERS)
def test_every_builder_has_the_interface(name, tmp_path):
    builder = get_builder(name)
    assert isinstance(builder, Builder)
    assert builder.name == name
    kind, source = builder.source.split(".")
    assert f'source "{kind}" "{source}"' in (REPO / "packer" / TEMPLATES[name]).read_text()
    variables = builder.packer_vars(config_for(name), a_run(tmp_path))
    assert variables and all(isinstance(v, str) for v in variables.values())
    assert set(variables) <= declared(TEMPLATES[name]), set(variables) - declared(TEMPLATES[name])
    assert re.fullmatch(r"[0-9a-f]{16}", builder.inputs_digest(config_for(name)))


def test_no_builder_for_an_unknown_target():
    with pytest.raises(ValueError, match="no image builder for 'gcp'"):
        get_builder("gcp")


def test_local_packer_vars(tmp_path):
    variables = LocalBuilder().packer_vars(config_for("local"), a_run(tmp_path))
    assert variables["builder_ssh_port"] == "2222"
    assert variables["builder_ssh_private_key_file"] == str(tmp_path / "key")
    assert json.loads(variables["ansible_groups"]) == ["slurm_head", "slurm_compute", "train"]
    with pytest.raises(ClusterbakeError, match="SSH port and key"):
        LocalBuilder().packer_vars(config_for("local"), PackerRun(name="n", image_vars_file=tmp_path / "v"))


def test_local_build_of_unchanged_inputs_is_a_lookup(tmp_path):
    config, state = config_for("local"), StateDir(tmp_path)
    store = ImageStore(state)
    image = store.dir / "clusterbake-debian-12-20261201-093015-abcdef0123"
    (image / "rootfs").mkdir(parents=True)
    (image / "manifest.json").write_text(json.dumps({"name": image.name, "inputs_digest": local_inputs_digest(config)}))
    store.record(local_inputs_digest(config), image.name)
    record = LocalBuilder().build(config, state)
    assert record == ImageRecord(
        provider="local",
        image_id=str(image),
        name=image.name,
        inputs_digest=local_inputs_digest(config),
        data={"name": image.name, "inputs_digest": local_inputs_digest(config)},
        reused=True,
    )


@pytest.mark.parametrize("name", BUILDERS)
def test_cli_image_build_goes_through_the_builder(name, tmp_path, monkeypatch):
    path = tmp_path / "cluster.yaml"
    path.write_text(json.dumps(CONFIGS[name]))
    calls = []

    class Fake:
        def build(self, config, state, *, force=False):
            calls.append((config.provider, state, force))

    monkeypatch.setattr("clusterbake.images.base.get_builder", lambda provider: Fake())
    monkeypatch.setenv("CLUSTERBAKE_STATE_DIR", str(tmp_path / "state"))
    assert cli.main(["--config", str(path), "image", "build", "--force"]) == 0
    assert calls == [(name, StateDir(tmp_path / "state"), True)]
