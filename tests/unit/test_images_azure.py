"""The Azure image builder (clusterbake.images.azure) and packer/azure.pkr.hcl: -var values
from the config, the client secret kept off the command line, the manifest, azure-latest.json,
the build flow with Packer replaced, and `packer validate` of the azure-arm source with
Packer 1.6.6's bundled builder. No Azure."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest
from imagetest import STAGED_FILES, SUBSCRIPTION, azure_section, packer_run

from clusterbake.config import AZURE_SOURCE_IMAGES, ClusterConfig
from clusterbake.errors import ClusterbakeError, ConfigError
from clusterbake.images import azure, packer
from clusterbake.images.base import PackerRun
from clusterbake.images.store import find_azure_image
from clusterbake.state import StateDir

REPO = Path(__file__).resolve().parents[2]
SAMPLE = REPO / "tests" / "unit" / "data" / "packer-manifest-azure.json"
CLIENT = "99999999-8888-7777-6666-555555555555"
SUBNET = (
    f"/subscriptions/{SUBSCRIPTION}/resourceGroups/net-rg/providers/Microsoft.Network/"
    "virtualNetworks/hub/subnets/builders"
)


def azure_config(image: dict | None = None, features=("ib-fabric",)) -> ClusterConfig:
    return ClusterConfig.model_validate(
        {
            "cluster_name": "demo",
            "provider": "azure",
            "image": image or {},
            "azure": azure_section(),
            "head": {"instance_type": "Standard_D4s_v5"},
            "node_groups": [
                {"name": "gpu", "count": 2, "instance_type": "Standard_ND96isr_H100_v5", "features": list(features)}
            ],
        }
    )


def run(tmp_path, name="clusterbake-ubuntu-24.04-20261201-093015-abcdef0123") -> PackerRun:
    return packer_run(tmp_path, name, "abcdef0123")


def declared_variables() -> set[str]:
    declared = set()
    for name in ("azure.pkr.hcl", "ansible.pkr.hcl"):
        declared |= set(re.findall(r'^variable "(\w+)"', (REPO / "packer" / name).read_text(), flags=re.MULTILINE))
    return declared


# --- -var values from the config -------------------------------------------------------------


def test_defaults_come_from_the_schema_and_the_azure_section(tmp_path):
    variables = azure.AzureBuilder().packer_vars(azure_config(), run(tmp_path))
    assert variables["azure_subscription_id"] == SUBSCRIPTION
    assert (variables["azure_location"], variables["azure_resource_group"]) == ("eastus", "demo-rg")
    assert variables["azure_vm_size"] == "Standard_NC4as_T4_v3"
    source = (variables[f"azure_image_{k}"] for k in ("publisher", "offer", "sku", "version"))
    assert ":".join(source) == AZURE_SOURCE_IMAGES["ubuntu-24.04"] == "Canonical:ubuntu-24_04-lts:server:latest"
    assert variables["azure_base"] == "ubuntu-24.04"
    assert variables["azure_os_disk_size_gb"] == "100"
    assert variables["azure_use_cli_auth"] == "true"
    assert variables["azure_client_id"] == variables["azure_tenant_id"] == ""
    assert variables["azure_build_resource_group"] == variables["azure_virtual_network_name"] == ""
    assert variables["azure_gallery_name"] == ""
    groups = json.loads(variables["azure_ansible_groups"])
    assert groups[:2] == ["slurm_head", "slurm_compute"]
    expected = {"azure", "cuda", "nvswitch", "dcgm", "doca_ofed", "amlfs", "blobfuse2", "pyxis", "ib_fabric"}
    assert expected == set(groups[2:])
    assert (variables["validate_gpu"], variables["validate_ib"]) == ("true", "false")
    assert variables["image_name"] == "clusterbake-ubuntu-24.04-20261201-093015-abcdef0123"
    assert variables["azure_gallery_image_version"] == "2026.1201.93015"
    assert (variables["versions_digest"], variables["repo_root"]) == ("d" * 64, str(REPO))
    assert variables["ansible_playbook_command"].endswith("/ansible-playbook")
    assert set(variables) <= declared_variables()
    assert "azure_client_secret" not in variables  # never on the command line


def test_every_build_setting_reaches_its_variable(tmp_path):
    settings = {
        "subscription_id": "22222222-2222-3333-4444-555555555555",
        "location": "westus3",
        "resource_group": "images-rg",
        "build_resource_group": "build-rg",
        "vm_size": "Standard_ND96isr_H100_v5",
        "source_image": "Canonical:ubuntu-24_04-lts:server:24.04.202511010",
        "os_disk_size_gb": 256,
        "subnet_id": SUBNET,
        "gallery_name": "clusterbake",
        "gallery_resource_group": "gallery-rg",
        "gallery_image_name": "hpc-noble",
        "gallery_replication_regions": ["eastus", "southcentralus"],
        "auth": "service_principal",
        "client_id": CLIENT,
        "tenant_id": "33333333-2222-3333-4444-555555555555",
        "features": ["azure", "cuda"],
        "validate_gpu": False,
        "validate_ib": True,
    }
    variables = azure.AzureBuilder().packer_vars(azure_config({"azure": settings}, features=()), run(tmp_path))
    assert variables["azure_subscription_id"] == settings["subscription_id"]
    assert (variables["azure_location"], variables["azure_resource_group"]) == ("westus3", "images-rg")
    assert variables["azure_build_resource_group"] == "build-rg"
    assert variables["azure_vm_size"] == "Standard_ND96isr_H100_v5"
    assert variables["azure_image_version"] == "24.04.202511010"
    assert variables["azure_os_disk_size_gb"] == "256"
    network = (variables[f"azure_virtual_network_{k}"] for k in ("name", "subnet_name", "resource_group_name"))
    assert tuple(network) == ("hub", "builders", "net-rg")
    assert (variables["azure_gallery_name"], variables["azure_gallery_resource_group"]) == ("clusterbake", "gallery-rg")
    assert variables["azure_gallery_image_name"] == "hpc-noble"
    assert json.loads(variables["azure_gallery_replication_regions"]) == ["eastus", "southcentralus"]
    assert (variables["azure_client_id"], variables["azure_use_cli_auth"]) == (CLIENT, "false")
    assert variables["azure_tenant_id"] == settings["tenant_id"]
    assert json.loads(variables["azure_ansible_groups"]) == ["slurm_head", "slurm_compute", "azure", "cuda"]
    assert (variables["validate_gpu"], variables["validate_ib"]) == ("false", "true")


def test_ubuntu_22_04_starts_from_jammy_gen2(tmp_path):
    variables = azure.AzureBuilder().packer_vars(azure_config({"base": "ubuntu-22.04"}), run(tmp_path))
    assert (variables["azure_image_offer"], variables["azure_image_sku"]) == (
        "0001-com-ubuntu-server-jammy",
        "22_04-lts-gen2",
    )
    assert variables["azure_gallery_image_name"] == "clusterbake-ubuntu-22.04"


def test_managed_identity_and_cli_auth_pass_no_client(tmp_path):
    variables = azure.AzureBuilder().packer_vars(azure_config({"azure": {"auth": "managed_identity"}}), run(tmp_path))
    assert (variables["azure_use_cli_auth"], variables["azure_client_id"]) == ("false", "")


@pytest.mark.parametrize(
    ("settings", "error"),
    [
        ({"auth": "service_principal"}, "client_id: required with auth service_principal"),
        ({"client_id": CLIENT}, "client_id: only with auth service_principal"),
        ({"source_image": "Canonical:ubuntu-24_04-lts:server"}, "source_image"),
        ({"vm_size": "g5.xlarge"}, "vm_size"),
    ],
)
def test_bad_build_settings_are_config_errors(tmp_path, settings, error):
    path = tmp_path / "c.yaml"
    config = azure_config().model_dump(mode="json", exclude_unset=True)
    config["image"] = {"azure": settings}
    path.write_text(json.dumps(config))
    from clusterbake.config import load_config

    with pytest.raises(ConfigError, match=re.escape(error)):
        load_config(path)


def test_the_client_secret_goes_to_packers_environment_only():
    settings = azure.azure_settings(azure_config({"azure": {"auth": "service_principal", "client_id": CLIENT}}))
    assert azure.azure_packer_env(settings, {"AZURE_CLIENT_SECRET": "s3cret"}) == {
        "PKR_VAR_azure_client_secret": "s3cret"
    }
    with pytest.raises(ConfigError, match=r"\$AZURE_CLIENT_SECRET"):
        azure.azure_packer_env(settings, {})
    assert azure.azure_packer_env(azure.azure_settings(azure_config()), {}) == {}


@pytest.mark.parametrize(
    ("name", "version"),
    [
        ("clusterbake-ubuntu-24.04-20260105-000001-abc", "2026.105.1"),
        ("clusterbake-ubuntu-24.04-20261231-235959-nogit", "2026.1231.235959"),
    ],
)
def test_gallery_version_from_the_build_time(name, version):
    assert azure.gallery_version(name) == version
    assert all(0 <= int(part) < 2**31 for part in version.split("."))


# --- the manifest post-processor's JSON and azure-latest.json --------------------------------


def test_manifest_of_a_gallery_build():
    image = azure.parse_packer_manifest(SAMPLE)
    assert image["managed_image_id"].endswith("/images/clusterbake-ubuntu-24.04-20251130-081000-a1b2c3d4e5")
    assert image["gallery_image_version_id"] == (
        f"/subscriptions/{SUBSCRIPTION}/resourceGroups/clusterbake-gallery/providers/Microsoft.Compute/"
        "galleries/clusterbake/images/clusterbake-ubuntu-24.04/versions/2025.1130.81000"
    )
    assert image["replication_regions"] == ["eastus", "westus3"]
    assert (image["location"], image["resource_group"], image["base"]) == (
        "eastus",
        "clusterbake-images",
        "ubuntu-24.04",
    )
    assert image["manifest_digest"].startswith("8d7c6b5a")


def test_manifest_of_a_managed_image_only_build():
    image = azure.parse_packer_manifest(SAMPLE, run_uuid="6a1f7d3c-2b4e-4c8d-9e0f-1a2b3c4d5e6f")
    assert image["gallery_image_version_id"] is None and image["replication_regions"] == []
    record = azure.image_record(image, {"gpu": {"manifest_sha256": image["manifest_digest"]}}, "0123456789abcdef")
    assert record["image"] == record["managed_image_id"] == image["managed_image_id"]
    assert record["built"] == "2025-11-30T06:10:00+00:00"


def test_an_empty_artifact_id_is_rebuilt_from_custom_data(tmp_path):
    data = json.loads(SAMPLE.read_text())
    managed = data["builds"][-1]["artifact_id"]
    data["builds"][-1]["artifact_id"] = ""
    path = tmp_path / "m.json"
    path.write_text(json.dumps(data))
    assert azure.parse_packer_manifest(path)["managed_image_id"] == managed
    data["builds"][-1]["custom_data"]["subscription_id"] = ""
    path.write_text(json.dumps(data))
    with pytest.raises(ClusterbakeError, match="cannot read a managed image id"):
        azure.parse_packer_manifest(path)


def test_record_refuses_an_image_built_from_another_manifest():
    image = azure.parse_packer_manifest(SAMPLE)
    with pytest.raises(ClusterbakeError, match="built from version manifest"):
        azure.image_record(image, {"gpu": {"manifest_sha256": "f" * 64}})


# --- the build, with Packer replaced -------------------------------------------------------


def test_build_records_the_gallery_version_and_the_provider_finds_it(tmp_path, monkeypatch):
    calls = []
    monkeypatch.setattr(packer, "packer_version", lambda: "1.11.2")
    monkeypatch.setattr(packer, "packer_binary", lambda: "/usr/bin/packer")
    monkeypatch.setattr(packer, "run_logged", lambda argv, log, **kw: calls.append(("init", argv)))
    monkeypatch.setenv("AZURE_CLIENT_SECRET", "s3cret")

    def fake_build(template, variables, log_file, only=None, env=None):
        calls.append(("build", only, sorted(p.name for p in Path(template).iterdir()), env))
        data = json.loads(SAMPLE.read_text())
        custom = data["builds"][-1]["custom_data"]
        custom.update(image_name=variables["image_name"], versions_digest=variables["versions_digest"])
        artifacts = Path(variables["artifacts_dir"])
        (artifacts / "packer-manifest.json").write_text(json.dumps(data))
        (artifacts / "versions.json").write_text(json.dumps({"gpu": {"manifest_sha256": variables["versions_digest"]}}))

    monkeypatch.setattr(packer, "build", fake_build)
    settings = {"auth": "service_principal", "client_id": CLIENT, "gallery_name": "clusterbake"}
    config = azure_config({"azure": settings})
    state = StateDir(tmp_path)
    image = azure.AzureBuilder().build(config, state)
    assert calls[1] == (
        "build",
        "azure-arm.ubuntu",
        STAGED_FILES,
        {"PKR_VAR_azure_client_secret": "s3cret"},
    )
    assert image.provider == "azure" and "/galleries/clusterbake/" in image.image_id and not image.reused
    record = json.loads((tmp_path / "images" / "azure-latest.json").read_text())
    assert record["image"] == image.image_id and record["location"] == "eastus"
    assert (tmp_path / "images" / "azure" / f"{record['name']}.json").exists()
    # The provider's lookup: the gallery version, replicated to eastus and westus3.
    assert find_azure_image(config, state) == image.image_id
    # Same inputs: reused, no second build.
    assert azure.AzureBuilder().build(config, state).reused
    assert len(calls) == 2


def test_build_without_the_secret_fails_before_packer_runs(tmp_path, monkeypatch):
    monkeypatch.setattr(packer, "packer_version", lambda: "1.11.2")
    monkeypatch.delenv("AZURE_CLIENT_SECRET", raising=False)
    monkeypatch.setattr(packer, "run_logged", lambda *a, **kw: pytest.fail("packer ran"))
    config = azure_config({"azure": {"auth": "service_principal", "client_id": CLIENT}})
    with pytest.raises(ConfigError, match="AZURE_CLIENT_SECRET"):
        azure.AzureBuilder().build(config, StateDir(tmp_path))


def test_build_refuses_packer_1_6_6(tmp_path, monkeypatch):
    monkeypatch.setattr(packer, "packer_version", lambda: "1.6.6")
    with pytest.raises(ClusterbakeError, match=r"Azure image builds need Packer >= 1\.10"):
        azure.AzureBuilder().build(azure_config(), StateDir(tmp_path))


# --- the template, with the Packer on PATH (1.6.6 here: its bundled azure-arm builder) ---------


def test_staged_template_has_the_plugin_requirements(tmp_path):
    staged = packer.stage_template(azure.TEMPLATE, tmp_path / "t", REPO)
    assert sorted(p.name for p in staged.iterdir()) == STAGED_FILES
    assert 'source  = "github.com/hashicorp/azure"' in (staged / "required_plugins.pkr.hcl").read_text()


needs_packer = pytest.mark.skipif(not shutil.which("packer"), reason="packer is not installed")


def packer_validate(variables: dict[str, str], env: dict | None = None, directory: Path = REPO / "packer"):
    argv = ["packer", "validate", f"-only={azure.SOURCE}"]
    argv += [f"-var={key}={value}" for key, value in sorted(variables.items())]
    path = f"{REPO / '.venv' / 'bin'}:{os.environ['PATH']}"  # the ansible provisioner's ansible-playbook
    return subprocess.run(
        [*argv, str(directory)], capture_output=True, text=True, env={"PATH": path, "HOME": "/tmp", **(env or {})}
    )


# null.local's required variables: Packer reads every file of the directory.
LOCAL = {"builder_ssh_port": "22", "builder_ssh_private_key_file": "/dev/null"}


@needs_packer
@pytest.mark.parametrize(
    "settings",
    [
        {},
        {"auth": "managed_identity"},
        {
            "auth": "service_principal",
            "client_id": CLIENT,
            "tenant_id": CLIENT,
            "gallery_name": "clusterbake",
            "gallery_replication_regions": ["westus3"],
            "build_resource_group": "build-rg",
            "subnet_id": SUBNET,
            "validate_gpu": False,
        },
    ],
    ids=["cli", "managed-identity", "service-principal-gallery-vnet"],
)
def test_packer_validate_passes_with_the_builders_variables(tmp_path, settings):
    config = azure_config({"azure": settings})
    (tmp_path / "v.yml").write_text("{}\n")
    variables = azure.AzureBuilder().packer_vars(config, run(tmp_path)) | LOCAL
    env = {"PKR_VAR_azure_client_secret": "placeholder"} if settings.get("auth") == "service_principal" else {}
    result = packer_validate(variables, env)
    assert result.returncode == 0, result.stdout + result.stderr


@needs_packer
def test_packer_validate_catches_what_azure_arm_refuses(tmp_path):
    (tmp_path / "v.yml").write_text("{}\n")
    variables = azure.AzureBuilder().packer_vars(azure_config(), run(tmp_path)) | LOCAL
    # A service principal without its secret: azure-arm's own check, so the builder is really validated.
    result = packer_validate(variables | {"azure_client_id": CLIENT, "azure_use_cli_auth": "false"})
    assert result.returncode != 0 and "authentication" in result.stdout + result.stderr


@needs_packer
def test_template_is_formatted():
    result = subprocess.run(["packer", "fmt", "-check", str(REPO / "packer")], capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr
