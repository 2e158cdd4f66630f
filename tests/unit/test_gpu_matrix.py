"""The GPU stack's version matrix (clusterbake.images.matrix): the rules held to the vendors'
publications, each pair's verdict, `clusterbake image versions` and `image build`'s refusal.

The hardware review of 33121ef found its manifest unworkable: driver R570 (not a branch NVIDIA
supports, CUDA 12) with PyPI's torch 2.13.0 (a CUDA 13 build), so every GPU job trained on the
CPU; and an AMLFS client built for no kernel the Azure image boots. Those manifests fail here.
"""

from __future__ import annotations

import datetime
import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from clusterbake.images import matrix

REPO = Path(__file__).resolve().parents[2]
CB = REPO / ".venv" / "bin" / "clusterbake"
VENDOR = Path(__file__).parent / "data" / "vendor"
TODAY = datetime.date(2026, 12, 6)


def manifest(**changes) -> dict:
    """The repository's manifest with `changes` merged into its sections."""
    data = yaml.safe_load((REPO / matrix.MANIFEST).read_text())["clusterbake_gpu_versions"]
    for section, values in changes.items():
        data[section] = {**data[section], **values} if isinstance(values, dict) else values
    return data


def inputs(torch: str = "2.13.0", index: str = "pypi", **changes) -> matrix.Inputs:
    rules = yaml.safe_load((REPO / matrix.RULES).read_text())["clusterbake_gpu_compatibility"]
    return matrix.Inputs(manifest(**changes), rules, torch, index, REPO / matrix.MANIFEST)


def verdicts(provider: str, today=TODAY, **kwargs) -> dict[str, matrix.Pair]:
    return {p.part: p for p in matrix.pairs(inputs(**kwargs), provider, today=today)}


R570 = {"branch": "570", "version": "570.172.08"}
R535 = {"branch": "535", "version": "535.247.01"}


# --- the rules against what the vendors publish ------------------------------------------------


def test_pypis_torch_2_13_carries_cuda_13_as_its_wheel_says():
    """PyPI's Linux x86_64 wheel of torch 2.13.0 requires cuda-toolkit==13.0.3 (its METADATA, kept verbatim)."""
    metadata = (VENDOR / "torch-2.13.0-manylinux-METADATA").read_text()
    assert "Version: 2.13.0" in metadata
    (toolkit,) = re.findall(r"^Requires-Dist: cuda-toolkit\[[^\]]*\]==([\d.]+)", metadata, re.M)
    rules = yaml.safe_load((REPO / matrix.RULES).read_text())["clusterbake_gpu_compatibility"]
    assert rules["torch_cuda"]["2.13.0"]["pypi"] == ".".join(toolkit.split(".")[:2]) == "13.0"


def test_the_branch_table_is_nvidias():
    """NVIDIA Data Center Drivers, "Supported Drivers and CUDA Toolkit Versions", Table 2 (pages of the
    615 and 620 documentation): designation, end of life, highest CUDA major without the forward
    compatibility package. 570 is not listed."""
    rules = yaml.safe_load((REPO / matrix.RULES).read_text())["clusterbake_gpu_compatibility"]
    published = {
        "535": ("long term support", "2026-06", 12),
        "580": ("long term support", "2028-06", 13),
        "595": ("production", "2027-03", 13),
        "620": ("long term support", "2029-09", 13),
    }
    table = rules["driver_branches"]
    assert {b: (t["designation"], t["end_of_life"], t["max_cuda_major"]) for b, t in table.items()} == published
    # CUDA release notes, Table 3: the GA drivers of 12.8 and 13.0 (the role checks with the same table).
    assert rules["cuda_minimum_driver"]["12.8"] == "570.26"
    assert rules["cuda_minimum_driver"]["13.0"] == "580.65.06"


# --- verdicts -----------------------------------------------------------------------------------


def test_the_repositorys_manifest_is_compatible_for_both_clouds():
    for provider in ("aws", "azure"):
        rows = verdicts(provider)
        assert not [r for r in rows.values() if r.failing], rows
        assert rows["torch"].detail.startswith("CUDA 13.0 build; driver 580.159.04 >= 580.65.06")


def test_r570_with_pypis_torch_is_the_cpu_training_the_review_found():
    rows = verdicts("aws", nvidia_driver=R570)
    assert rows["nvidia driver"].result == "incompatible"
    assert "R570 is not a branch NVIDIA supports" in rows["nvidia driver"].detail
    assert "pin branch R580" in rows["nvidia driver"].fix
    torch = rows["torch"]
    assert torch.result == "incompatible"
    assert "needs CUDA 13; driver R570" not in torch.detail  # 570 is not in the table: its minimum decides
    assert "needs driver >= 580.65.06 (CUDA 13.0); the manifest has 570.172.08" in torch.detail
    assert "train on the CPU" in torch.detail


def test_an_ended_branch_is_refused_from_its_end_of_life_on():
    before = verdicts("aws", today=datetime.date(2026, 5, 1), nvidia_driver=R535, cuda={"version": "12.2"},
                      nccl={"version": "2.21.5-1"}, index="cu126")  # fmt: skip
    assert before["nvidia driver"].result == "ok"
    after = verdicts("aws", nvidia_driver=R535, cuda={"version": "12.2"}, nccl={"version": "2.21.5-1"}, index="cu126")
    assert after["nvidia driver"].result == "incompatible"
    assert "R535 reached its end of life in 2026-06" in after["nvidia driver"].detail


def test_a_cuda_12_driver_takes_torchs_cuda_12_wheel_and_the_fix_says_so():
    ok = verdicts("aws", today=datetime.date(2026, 5, 1), nvidia_driver=R535, index="cu126")
    assert ok["torch"].result == "ok" and ok["torch"].version == "2.13.0 (download.pytorch.org/whl/cu126)"
    pypi = verdicts("aws", today=datetime.date(2026, 5, 1), nvidia_driver=R535)
    assert pypi["torch"].result == "incompatible"
    assert "needs CUDA 13; driver R535 runs CUDA 12 at most" in pypi["torch"].detail
    assert "or torch from download.pytorch.org/whl/cu126" in pypi["torch"].fix


def test_a_toolkit_newer_than_the_driver_and_nccl_without_its_cuda_build():
    rows = verdicts("aws", cuda={"version": "13.0"}, nccl={"version": "2.26.2-1"}, nvidia_driver=R570)
    assert rows["cuda toolkit"].result == "incompatible"
    assert "needs driver >= 580.65.06 (CUDA 13.0); the manifest has 570.172.08" in rows["cuda toolkit"].detail
    assert rows["nccl"].result == "incompatible" and rows["nccl"].fix == "nccl >= 2.27.7"


def test_gdrcopy_needs_a_release_nvidia_builds_for_the_cuda_major():
    assert verdicts("aws")["gdrcopy"].result == "ok"
    old = verdicts("aws", gdrcopy={"version": "2.4", "release": "1"})["gdrcopy"]
    assert (old.result, old.against, old.fix) == ("incompatible", "CUDA 13.0", "gdrcopy >= 2.5.1")
    assert "gdrcopy" not in verdicts("azure")  # Azure's images have no EFA, so no GDRCopy role


def test_the_end_of_life_amlfs_client_has_no_build_for_the_images_kernel():
    rows = verdicts("azure", amlfs_client={"version": "2.16.1-14-gbc76088"})
    amlfs = rows["amlfs client"]
    assert (amlfs.result, amlfs.against) == ("incompatible", "kernel 6.17-azure")
    assert amlfs.detail == "Microsoft builds client 2.16.1 for kernels 6.8 only" and amlfs.fix == "client 2.17.0"
    assert (
        verdicts("azure", amlfs_client={"version": "2.16.1-14-gbc76088"}, kernel_series={"azure": "6.8"})[
            "amlfs client"
        ].result
        == "ok"
    )


def test_a_version_the_rules_do_not_know_fails_rather_than_passes():
    rows = verdicts("aws", torch="2.99.0")
    assert rows["torch"].result == "unknown" and rows["torch"].failing
    assert "torch_cuda" in rows["torch"].fix


def test_the_local_provider_has_no_driver_to_check():
    rows = verdicts("local", nvidia_driver=R570)
    assert list(rows) == ["torch"] and rows["torch"].result == "ok"


def test_the_torch_pin_and_its_index_come_from_the_requirements(tmp_path):
    requirements = tmp_path / "requirements.in"
    requirements.write_text("--index-url https://download.pytorch.org/whl/cu126\ntorch==2.13.0  # pinned\n")
    assert matrix.torch_pin(requirements) == ("2.13.0", "cu126")
    assert matrix.torch_pin(REPO / matrix.REQUIREMENTS) == ("2.13.0", "pypi")


# --- the command line ---------------------------------------------------------------------------


def _cb(*args, env=None) -> subprocess.CompletedProcess:
    return subprocess.run([str(CB), *args], capture_output=True, text=True, env=env, timeout=120)


@pytest.mark.parametrize("example", ["aws-p5", "azure-ndv5"])
def test_image_versions_passes_the_examples(example):
    result = _cb("-c", str(REPO / "examples" / f"{example}.yaml"), "image", "versions")
    assert result.returncode == 0, result.stdout + result.stderr
    assert re.search(r"nvidia driver\s+580\.159\.04\s+NVIDIA's supported driver branches\s+ok", result.stdout)


def test_image_versions_exits_1_on_r570_naming_both_sides_and_the_fix(tmp_path):
    path = tmp_path / "versions.yml"
    path.write_text(yaml.safe_dump({"clusterbake_gpu_versions": manifest(nvidia_driver=R570)}))
    result = _cb("-c", str(REPO / "examples" / "aws-p5.yaml"), "image", "versions", "--manifest", str(path))
    assert result.returncode == 1, result.stdout + result.stderr
    assert "torch 2.13.0 (PyPI) vs nvidia driver: CUDA 13.0 build; torch 2.13.0 needs driver >= 580.65.06" in (
        result.stderr
    )
    assert "Fix: a driver of branch R580 or R595 or R620 at >= 580.65.06" in result.stderr


def test_image_build_refuses_it_before_anything_is_built_or_called(tmp_path):
    """`image build` checks the manifest the build would use (the checkout's) first: here a checkout whose
    manifest pins R570, no cloud credentials and no endpoint; it must stop before Packer or any API call."""
    home = tmp_path / "checkout"
    for relative in (matrix.RULES, matrix.REQUIREMENTS):
        (home / relative).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(REPO / relative, home / relative)
    (home / matrix.MANIFEST).write_text(yaml.safe_dump({"clusterbake_gpu_versions": manifest(nvidia_driver=R570)}))
    state = tmp_path / "state"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("AWS_", "AZURE_"))}
    env |= {"CLUSTERBAKE_HOME": str(home), "CLUSTERBAKE_STATE_DIR": str(state), "AWS_EC2_METADATA_DISABLED": "true"}
    env["PATH"] = f"{tmp_path / 'nothing'}:/usr/bin:/bin"  # no packer on the PATH either
    result = _cb("-c", str(REPO / "examples" / "aws-p5.yaml"), "image", "build", env=env)
    assert result.returncode == 1, result.stdout + result.stderr
    assert "cannot work (3 incompatible pair(s)); nothing was built" in result.stderr
    assert "nvidia driver 570.172.08 vs NVIDIA's supported driver branches" in result.stderr
    assert "Traceback" not in result.stderr and "credentials" not in result.stderr.lower()
    assert not state.exists() or not any(state.rglob("*")), sorted(state.rglob("*"))
