"""The GPU stack's version matrix: the manifest's versions checked against the vendors' rules.

The manifest is ansible/group_vars/all/versions.yml (driver, CUDA, NCCL, DCGM, DOCA-OFED, the
Lustre clients, the kernel series each cloud's image boots), the training environment's pins
are roles/training_env/files/requirements.in (torch, and the index its wheel comes from), and
the rules are data in ansible/group_vars/all/gpu_compatibility.yml, each table citing where the
vendor publishes it. `clusterbake image versions` prints the matrix for the config's provider;
`image build` refuses an incompatible pair before it builds anything (require_compatible).

A pair is `ok`, `incompatible` (what cannot work: the build would make GPU jobs train on the
CPU, a module fail to load, a client missing for the kernel), or `unknown` (a version the
rules do not list: treated as incompatible, so that a new pin comes with its rule). A part no
published rule covers is listed as `not checked`, with what checks it instead.
"""

from __future__ import annotations

import datetime
import re
from dataclasses import dataclass
from pathlib import Path

import yaml

from clusterbake.errors import ClusterbakeError
from clusterbake.images.inputs import MANIFEST_PATH
from clusterbake.paths import repo_root
from clusterbake.wheelhouse import REQUIREMENTS

MANIFEST = MANIFEST_PATH
RULES = MANIFEST_PATH.with_name("gpu_compatibility.yml")
# What each provider's images hold (the local provider's nodes have placeholder GPUs, no driver).
PARTS = {
    "local": ("torch",),
    "aws": ("driver", "cuda", "torch", "nccl", "dcgm", "gdrcopy", "efa_installer", "lustre_client", "mountpoint_s3"),
    "azure": ("driver", "cuda", "torch", "nccl", "dcgm", "doca_ofed", "amlfs_client", "blobfuse2"),
}
FAILING = ("incompatible", "unknown")


@dataclass(frozen=True)
class Pair:
    part: str
    version: str
    against: str
    result: str  # ok, incompatible, unknown, not checked
    detail: str
    fix: str = ""

    @property
    def failing(self) -> bool:
        return self.result in FAILING


@dataclass(frozen=True)
class Inputs:
    manifest: dict
    rules: dict
    torch: str  # the pinned version
    torch_index: str  # pypi, or cuXYZ (download.pytorch.org/whl/cuXYZ)
    manifest_path: Path


def _version(text: str) -> tuple[int, ...]:
    """1:4.4.1-1 -> (4, 4, 1); 580.159.04 -> (580, 159, 4); 2.17.0-19-gbb5310f -> (2, 17, 0)."""
    text = text.split(":", 1)[-1]
    return tuple(int(p) for p in re.match(r"[\d.]+", text).group(0).strip(".").split("."))


def torch_pin(requirements: Path) -> tuple[str, str]:
    """(torch version, index): `torch==X` and the index an `--index-url`/`--extra-index-url` line names."""
    version, index = "", "pypi"
    for line in requirements.read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        if line.startswith("torch=="):
            version = line.split("==", 1)[1].strip()
        found = re.match(r"--(?:extra-)?index-url\s+\S*/whl/(cu\d+)/?$", line)
        if found:
            index = found.group(1)
    if not version:
        raise ClusterbakeError(f"{requirements}: no torch==<version> pin")
    return version, index


def load(manifest: Path | None = None) -> Inputs:
    root = repo_root()
    manifest = manifest or root / MANIFEST
    try:
        versions = yaml.safe_load(manifest.read_text())["clusterbake_gpu_versions"]
    except (OSError, yaml.YAMLError, KeyError, TypeError) as exc:
        raise ClusterbakeError(f"{manifest}: not a GPU version manifest (clusterbake_gpu_versions): {exc}") from None
    rules = yaml.safe_load((root / RULES).read_text())["clusterbake_gpu_compatibility"]
    torch, index = torch_pin(root / REQUIREMENTS)
    return Inputs(versions, rules, torch, index, manifest)


# --- the rules ---------------------------------------------------------------------------------


def _failing(part: str, version: str, against: str, detail: str, fix: str, result: str = "incompatible") -> Pair:
    return Pair(part, version, against, result, detail, fix)


def _branch(inputs: Inputs, today: datetime.date) -> Pair:
    driver = inputs.manifest["nvidia_driver"]
    branch, version = str(driver["branch"]), str(driver["version"])
    table = inputs.rules["driver_branches"]
    against = "NVIDIA's supported driver branches"
    month = today.strftime("%Y-%m")
    live = {b: t for b, t in table.items() if t["end_of_life"] >= month}
    supported = ", ".join(f"R{b} ({t['designation']}, to {t['end_of_life']})" for b, t in live.items())
    lts = min((b for b, t in live.items() if t["designation"] == "long term support"), key=int, default=None)
    fix = f"pin branch R{lts} (long term support to {table[lts]['end_of_life']})" if lts else "pin a supported branch"
    if not version.startswith(branch + "."):
        fix = "make nvidia_driver.branch the version's first number"
        return _failing("nvidia driver", version, "its branch", f"{version} is not of branch {branch}", fix)
    if branch not in table:
        detail = f"R{branch} is not a branch NVIDIA supports (supported: {supported})"
        return _failing("nvidia driver", version, against, detail, fix)
    if branch not in live:
        detail = f"R{branch} reached its end of life in {table[branch]['end_of_life']} (supported: {supported})"
        return _failing("nvidia driver", version, against, detail, fix)
    row = table[branch]
    detail = f"R{branch}, {row['designation']} to {row['end_of_life']}, CUDA {row['max_cuda_major']} at most"
    return Pair("nvidia driver", version, against, "ok", detail)


def _driver_runs(inputs: Inputs, cuda: str, what: str, whole_release: bool) -> tuple[str, str]:
    """(result, detail) of CUDA `cuda` (major.minor) on the manifest's driver: the branch's highest CUDA
    major, and the minimum driver of the release (whole_release) or of its major's first release."""
    driver = inputs.manifest["nvidia_driver"]
    branch, version = str(driver["branch"]), str(driver["version"])
    minimums = inputs.rules["cuda_minimum_driver"]
    major = cuda.split(".")[0]
    key = cuda if whole_release else f"{major}.0"
    if key not in minimums:
        return "unknown", f"CUDA {key}'s minimum driver is not in the rules (CUDA release notes, Table 3)"
    highest = inputs.rules["driver_branches"].get(branch, {}).get("max_cuda_major")
    if highest is not None and int(major) > int(highest):
        return "incompatible", f"{what} needs CUDA {major}; driver R{branch} runs CUDA {highest} at most"
    if _version(version) < _version(minimums[key]):
        return "incompatible", f"{what} needs driver >= {minimums[key]} (CUDA {key}); the manifest has {version}"
    return "ok", f"driver {version} >= {minimums[key]} (CUDA {key})"


def _driver_fix(inputs: Inputs, cuda: str) -> str:
    minimums = inputs.rules["cuda_minimum_driver"]
    major = cuda.split(".")[0]
    branches = [b for b, t in inputs.rules["driver_branches"].items() if int(t["max_cuda_major"]) >= int(major)]
    need = minimums.get(cuda) or minimums.get(f"{major}.0", "?")
    return f"a driver of branch {' or '.join('R' + b for b in branches) or '(none listed)'} at >= {need}"


def _cuda(inputs: Inputs) -> Pair:
    cuda = str(inputs.manifest["cuda"]["version"])
    result, detail = _driver_runs(inputs, cuda, f"the CUDA {cuda} toolkit", whole_release=True)
    fix = _driver_fix(inputs, cuda) if result != "ok" else ""
    return Pair("cuda toolkit", cuda, "nvidia driver", result, detail, fix)


def _torch(inputs: Inputs) -> Pair:
    wheels = inputs.rules["torch_cuda"].get(inputs.torch)
    source = "PyPI" if inputs.torch_index == "pypi" else f"download.pytorch.org/whl/{inputs.torch_index}"
    version = f"{inputs.torch} ({source})"
    if wheels is None or inputs.torch_index not in wheels:
        detail = f"the rules do not say which CUDA torch {inputs.torch}'s wheel from {source} carries"
        fix = "add it to gpu_compatibility.yml's torch_cuda (its wheel's METADATA names the cuda-toolkit)"
        return _failing("torch", version, "nvidia driver", detail, fix, result="unknown")
    cuda = str(wheels[inputs.torch_index])
    result, detail = _driver_runs(inputs, cuda, f"torch {inputs.torch}", whole_release=False)
    if result == "ok":
        return Pair("torch", version, "nvidia driver", "ok", f"CUDA {cuda} build; {detail}")
    branch = str(inputs.manifest["nvidia_driver"]["branch"])
    highest = inputs.rules["driver_branches"].get(branch, {}).get("max_cuda_major")
    fitting = [i for i, c in wheels.items() if i != "pypi" and highest and int(str(c).split(".")[0]) <= int(highest)]
    fix = _driver_fix(inputs, cuda)
    if fitting:
        fix += f", or torch from download.pytorch.org/whl/{fitting[0]} (an --index-url line in requirements.in)"
    detail = f"CUDA {cuda} build; {detail}: GPU jobs would find no CUDA device and train on the CPU"
    return _failing("torch", version, "nvidia driver", detail, fix, result=result)


def _first_for_cuda(inputs: Inputs, part: str, version: str, table: str) -> Pair:
    cuda = str(inputs.manifest["cuda"]["version"])
    major = cuda.split(".")[0]
    first = inputs.rules[table].get(major)
    if first is None:
        detail = f"the rules name no {part} release for CUDA {major}"
        return _failing(part, version, f"CUDA {cuda}", detail, f"add it to gpu_compatibility.yml's {table}", "unknown")
    if _version(version) < _version(first):
        detail = f"{part} has packages for CUDA {major} from {first} on"
        return _failing(part, version, f"CUDA {cuda}", detail, f"{part} >= {first}")
    return Pair(part, version, f"CUDA {cuda}", "ok", f"CUDA {major} packages from {first} on")


def _nccl(inputs: Inputs) -> Pair:
    return _first_for_cuda(inputs, "nccl", str(inputs.manifest["nccl"]["version"]), "nccl_first_for_cuda_major")


def _dcgm(inputs: Inputs) -> Pair:
    return _first_for_cuda(inputs, "dcgm", str(inputs.manifest["dcgm"]["version"]), "dcgm_first_for_cuda_major")


def _gdrcopy(inputs: Inputs) -> Pair:
    gdrcopy = inputs.manifest["gdrcopy"]
    version = f"{gdrcopy['version']}-{gdrcopy['release']}"
    return _first_for_cuda(inputs, "gdrcopy", version, "gdrcopy_first_for_cuda_major")


def _kernel_series(inputs: Inputs, cloud: str) -> str:
    return str((inputs.manifest.get("kernel_series") or {}).get(cloud, ""))


def _amlfs(inputs: Inputs) -> Pair:
    version = str(inputs.manifest["amlfs_client"]["version"])
    release = ".".join(str(p) for p in _version(version))
    series = _kernel_series(inputs, "azure")
    table = inputs.rules["amlfs_client_kernel_series"]
    against = f"kernel {series or '?'}-azure"
    if release not in table or not series:
        detail = f"no rule for client {release}, or no kernel_series.azure in the manifest"
        fix = "add the client's kernels to gpu_compatibility.yml, the image's kernel series to versions.yml"
        return _failing("amlfs client", version, against, detail, fix, "unknown")
    if series not in table[release]:
        newer = [r for r, kernels in table.items() if series in kernels]
        detail = f"Microsoft builds client {release} for kernels {', '.join(table[release])} only"
        return _failing("amlfs client", version, against, detail, f"client {newer[-1]}" if newer else "another kernel")
    return Pair("amlfs client", version, against, "ok", f"built for {', '.join(table[release])}")


def _not_checked(part: str, version: str, how: str) -> Pair:
    return Pair(part, version, "-", "not checked", how)


def pairs(inputs: Inputs, provider: str, today: datetime.date | None = None) -> list[Pair]:
    """The matrix of one provider's images."""
    today = today or datetime.date.today()
    m = inputs.manifest
    rows = {
        "driver": lambda: _branch(inputs, today),
        "cuda": lambda: _cuda(inputs),
        "torch": lambda: _torch(inputs) if provider != "local" else _local_torch(inputs),
        "nccl": lambda: _nccl(inputs),
        "dcgm": lambda: _dcgm(inputs),
        "gdrcopy": lambda: _gdrcopy(inputs),
        "amlfs_client": lambda: _amlfs(inputs),
        "efa_installer": lambda: _not_checked(
            "efa installer", m["efa_installer"]["version"], "no published rule; its GPG signature and the EFA check"
        ),
        "lustre_client": lambda: _not_checked(
            "fsx lustre client",
            f"kernel {_kernel_series(inputs, 'aws') or '?'}-aws",
            "per kernel: the build fails when AWS publishes no modules for the image's kernel",
        ),
        "mountpoint_s3": lambda: _not_checked("mountpoint-s3", m["mountpoint_s3"]["version"], "no published rule"),
        "doca_ofed": lambda: _not_checked(
            "doca-ofed", m["doca_ofed"]["version"], "DKMS builds it for the image's kernel, checked in the build"
        ),
        "blobfuse2": lambda: _not_checked("blobfuse2", m["blobfuse2"]["version"], "no kernel part; no published rule"),
    }
    return [rows[part]() for part in PARTS[provider]]


def _local_torch(inputs: Inputs) -> Pair:
    detail = "local nodes have placeholder GPUs and no driver: jobs run on the CPU, as expected there"
    return Pair("torch", f"{inputs.torch} (PyPI)", "-", "ok", detail)


def render(rows: list[Pair]) -> list[str]:
    columns = (("PART", "part"), ("VERSION", "version"), ("CHECKED AGAINST", "against"), ("RESULT", "result"))
    widths = [max(len(title), *(len(getattr(r, field)) for r in rows)) for title, field in columns]

    def line(*cells: str) -> str:
        return "  ".join(c.ljust(w) for c, w in zip(cells, widths, strict=False)) + "  " + cells[-1]

    out = [line("PART", "VERSION", "CHECKED AGAINST", "RESULT", "WHY")]
    return out + [line(r.part, r.version, r.against, r.result, r.detail) for r in rows]


def failures(rows: list[Pair]) -> list[str]:
    return [
        f"{r.part} {r.version} vs {r.against}: {r.detail}" + (f". Fix: {r.fix}" if r.fix else "")
        for r in rows
        if r.failing
    ]


def require_compatible(provider: str, manifest: Path | None = None) -> None:
    """Raise, naming both sides and the fix, when the provider's images would hold an incompatible pair."""
    inputs = load(manifest)
    bad = failures(pairs(inputs, provider))
    if bad:
        raise ClusterbakeError(
            f"the GPU stack in {inputs.manifest_path} cannot work ({len(bad)} incompatible pair(s)); nothing was "
            "built:\n  " + "\n  ".join(bad) + "\n(`clusterbake image versions` shows the whole matrix)"
        )
