"""FSx for Lustre in the EC2 twin as FSx behaves where clusterbake relies on it (realcloud review A7, D7).

moto 5.2.5 keeps FSx file systems as records: no Lifecycle (a product that waits for AVAILABLE
waits for ever), no Lustre MountName, no data repository associations (DRAs), deleted at once.
Here:

- Lifecycle: CREATING for $MOTO_FSX_CREATE_SECONDS (default 2) after CreateFileSystem, then
  AVAILABLE; the Lustre configuration gets a MountName.
- Legacy S3 linking (SCRATCH_2's ImportPath/ExportPath/AutoImportPolicy): described as EC2 does
  (LustreConfiguration.DataRepositoryConfiguration) and import-only, as FSx documents it for
  file systems without DRAs ("Working with older deployment types": export only through export
  tasks): nothing written to the file system reaches S3.
- DRAs: Create/Describe/DeleteDataRepositoryAssociation (CREATING, then AVAILABLE after the same
  delay; DataRepositoryAssociationNotFound; filter file-system-id). A DRA with an AutoExportPolicy
  exports: `export_changes` (run by the twin's daemon each round) puts each file new or changed
  under the file system's directory into its S3 path, as FSx's automatic export does within
  minutes. Deleting a file system deletes its DRAs, and what was not exported is lost.

Still kinder than FSx: no import from S3 (BatchImportMetaDataOnCreate, AutoImportPolicy are
stored, not acted on), deletions are not exported, no data repository tasks.
"""

from __future__ import annotations

import json
import os
import time
import uuid
from pathlib import Path

from moto.fsx.models import FileSystem, FSxBackend
from moto.fsx.responses import FSxResponse

CREATE_SECONDS = 2.0
_ASSOCIATIONS: dict[tuple[str, str], dict[str, dict]] = {}  # (account, region) -> id -> association
_EXPORTED: dict[str, tuple[float, int]] = {}  # file path -> (mtime, size) when last exported


def _ready(created: float) -> bool:
    return time.time() - created >= float(os.environ.get("MOTO_FSX_CREATE_SECONDS", CREATE_SECONDS))


def _associations(backend: FSxBackend) -> dict[str, dict]:
    return _ASSOCIATIONS.setdefault((backend.account_id, backend.region_name), {})


def _error(code: str, message: str):
    """FSx's JSON error answer."""
    return 400, {"x-amzn-errortype": code}, json.dumps({"__type": code, "Message": message})


_fs_init = FileSystem.__init__
_fs_to_dict = FileSystem.to_dict
_delete_file_system = FSxBackend.delete_file_system


def fs_init(self: FileSystem, *args, **kwargs) -> None:
    _fs_init(self, *args, **kwargs)
    self.created_at = time.time()
    self.mount_name = uuid.uuid4().hex[:8]


def fs_to_dict(self: FileSystem) -> dict:
    described = _fs_to_dict(self)
    described["Lifecycle"] = "AVAILABLE" if _ready(getattr(self, "created_at", 0.0)) else "CREATING"
    if self.file_system_type == "LUSTRE":
        lustre = dict(self.lustre_configuration or {})
        legacy = {k: lustre.pop(k) for k in ("ImportPath", "ExportPath", "AutoImportPolicy") if k in lustre}
        if legacy:
            lustre["DataRepositoryConfiguration"] = {**legacy, "Lifecycle": "AVAILABLE"}
        lustre["MountName"] = getattr(self, "mount_name", "fsx")
        described["LustreConfiguration"] = lustre
    return described


def delete_file_system(self: FSxBackend, file_system_id: str, *args, **kwargs):
    answer = _delete_file_system(self, file_system_id, *args, **kwargs)
    store = _associations(self)
    for association_id in [a for a, v in store.items() if v["FileSystemId"] == file_system_id]:
        del store[association_id]
    return answer


def _association_view(association: dict) -> dict:
    return {
        **{k: v for k, v in association.items() if not k.startswith("_")},
        "Lifecycle": "AVAILABLE" if _ready(association["_created"]) else "CREATING",
    }


def create_data_repository_association(self: FSxResponse) -> str:
    params = json.loads(self.body)
    backend = self.fsx_backend
    file_system_id = params["FileSystemId"]
    if file_system_id not in backend.file_systems:
        return _error("FileSystemNotFound", f"File system '{file_system_id}' does not exist.")
    association_id = f"dra-{uuid.uuid4().hex[:17]}"
    association = {
        "AssociationId": association_id,
        "ResourceARN": f"arn:aws:fsx:{backend.region_name}:{backend.account_id}:association/{file_system_id}/"
        f"{association_id}",
        "FileSystemId": file_system_id,
        "FileSystemPath": params.get("FileSystemPath", "/"),
        "DataRepositoryPath": params["DataRepositoryPath"],
        "BatchImportMetaDataOnCreate": bool(params.get("BatchImportMetaDataOnCreate")),
        "S3": params.get("S3", {}),
        "Tags": params.get("Tags", []),
        "_created": time.time(),
    }
    _associations(backend)[association_id] = association
    return json.dumps({"Association": _association_view(association)})


def describe_data_repository_associations(self: FSxResponse) -> str:
    params = json.loads(self.body)
    store = _associations(self.fsx_backend)
    ids = params.get("AssociationIds") or []
    missing = [i for i in ids if i not in store]
    if missing:
        return _error("DataRepositoryAssociationNotFound", f"Association '{missing[0]}' does not exist.")
    found = [store[i] for i in ids] if ids else list(store.values())
    for each in params.get("Filters", []) or []:
        if each.get("Name") == "file-system-id":
            found = [a for a in found if a["FileSystemId"] in each.get("Values", [])]
    return json.dumps({"Associations": [_association_view(a) for a in found]})


def delete_data_repository_association(self: FSxResponse) -> str:
    params = json.loads(self.body)
    association = _associations(self.fsx_backend).pop(params["AssociationId"], None)
    if association is None:
        missing = params["AssociationId"]
        return _error("DataRepositoryAssociationNotFound", f"Association '{missing}' does not exist.")
    return json.dumps({"AssociationId": association["AssociationId"], "Lifecycle": "DELETING"})


def exports(account: str, region: str) -> list[tuple[str, str, str]]:
    """(file system id, its path, S3 path) of each DRA that exports automatically."""
    return [
        (a["FileSystemId"], a["FileSystemPath"], a["DataRepositoryPath"])
        for a in _ASSOCIATIONS.get((account, region), {}).values()
        if a.get("S3", {}).get("AutoExportPolicy", {}).get("Events") and _ready(a["_created"])
    ]


def export_changes(directory: Path, file_system_path: str, s3_path: str, put) -> list[str]:
    """Each file under `directory`/`file_system_path` new or changed since its last export: put(bucket, key,
    bytes) at the same relative path under `s3_path`. The keys put."""
    bucket, _, prefix = s3_path.removeprefix("s3://").partition("/")
    root = directory / file_system_path.strip("/")
    put_keys = []
    if not root.is_dir():
        return put_keys
    for path in sorted(p for p in root.rglob("*") if p.is_file() and not p.is_symlink()):
        stat = path.stat()
        seen = (stat.st_mtime, stat.st_size)
        if _EXPORTED.get(str(path)) == seen:
            continue
        key = "/".join(part for part in (prefix.strip("/"), str(path.relative_to(root))) if part)
        put(bucket, key, path.read_bytes())
        _EXPORTED[str(path)] = seen
        put_keys.append(key)
    return put_keys


PATCHES = {
    FileSystem: {"__init__": fs_init, "to_dict": fs_to_dict},
    FSxBackend: {"delete_file_system": delete_file_system},
    FSxResponse: {
        "create_data_repository_association": create_data_repository_association,
        "describe_data_repository_associations": describe_data_repository_associations,
        "delete_data_repository_association": delete_data_repository_association,
    },
}
