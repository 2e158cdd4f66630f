"""Shared file systems of the config's `storage:` entries: Amazon EFS and FSx for Lustre.

`nfs` entries are served by the head node: nothing to create in AWS. For `efs` and
`fsx_lustre` entries clusterbake creates the file system unless the entry names one
(`file_system_id`: used as it is, never created nor deleted). What it creates is
tagged `clusterbake:cluster=<cluster>`, `clusterbake:storage=<entry name>`,
`clusterbake:retain=true|false` and `Name=clusterbake-<cluster>-<name>`, and found again
by those tags (EFS: by its CreationToken `clusterbake-<cluster>-<name>` first).

- EFS: encrypted, the entry's performance and throughput modes; one mount target in the
  cluster's subnet with the cluster's security group (whose all-traffic-from-itself
  rule lets the nodes reach NFS on 2049). Nodes mount the mount target's address.
- FSx for Lustre: in the subnet with the cluster's security group (Lustre needs 988
  and 1018-1023 both ways: the same rule). With `s3_path` (SCRATCH_2 and PERSISTENT_2):
  once the file system is available, a data repository association of `/` with the path
  (automatic import and export of new, changed and deleted objects, metadata imported on
  creation). Not the legacy ImportPath/ExportPath of SCRATCH_2: on Lustre 2.12 and later
  that exports nothing by itself (FSx user guide, "Working with older deployment types":
  export only through export tasks; realcloud review A7). Deleting the file system
  deletes the association; what was not exported yet is lost.

Every file system is first asked for, then waited on, so that several are created
(and deleted) at the same time: FSx takes 5 to 20 minutes. Errors name the entry as
`storage.<i> (<name>)`, `i` being its position in `entries`: pass the config's own
`storage` list so that the index is the one of the config file.

Entries are config.EfsStorage / config.FsxLustreStorage objects (any other type is
skipped). Everything here goes through api.call / api.paginate.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from botocore.exceptions import ClientError

from clusterbake.errors import ClusterbakeError, ConfigError
from clusterbake.progress import say
from clusterbake.providers.aws import tags
from clusterbake.providers.aws.api import call, error_code, or_if_gone, paginate
from clusterbake.providers.aws.iam import dns_suffix

STORAGE = "clusterbake:storage"
RETAIN = "clusterbake:retain"
TYPES = ("efs", "fsx_lustre")

EFS_TIMEOUT = 600.0
FSX_TIMEOUT = 3600.0
EFS_POLL = 5.0
FSX_POLL = 30.0
LUSTRE_VERSION = "2.15"  # the FSx Lustre client modules for Ubuntu 22.04/24.04 kernels are 2.15
S3_EVENTS = ["NEW", "CHANGED", "DELETED"]

Sleep = Callable[[float], None]


# --- names and tags ----------------------------------------------------------------


def file_system_name(cluster: str, name: str) -> str:
    return f"clusterbake-{cluster}-{name}"


def creation_token(cluster: str, name: str) -> str:
    """EFS CreationToken: one file system per cluster and entry name."""
    return file_system_name(cluster, name)


def storage_tags(cluster: str, entry) -> dict[str, str]:
    return {
        tags.CLUSTER: cluster,
        STORAGE: entry.name,
        RETAIN: "true" if entry.retain else "false",
        "Name": file_system_name(cluster, entry.name),
    }


def _label(index: int, entry) -> str:
    return f"storage.{index} ({entry.name})"


def _ours(entries: Iterable) -> list[tuple[int, Any]]:
    return [(i, e) for i, e in enumerate(entries) if getattr(e, "type", None) in TYPES]


def _region(client) -> str:
    return client.meta.region_name


def efs_dns_name(file_system_id: str, region: str) -> str:
    return f"{file_system_id}.efs.{region}.{dns_suffix(region)}"


@dataclass(frozen=True)
class Until:
    """What `_poll` waits for: the states that end the wait ("gone": the resource is not there), those
    that fail it, and the seconds between two looks."""

    done: frozenset[str]
    failed: frozenset[str]
    poll: float


EFS_AVAILABLE = Until(frozenset({"available"}), frozenset({"error", "deleting", "deleted"}), EFS_POLL)
EFS_GONE = Until(frozenset({"gone"}), frozenset(), EFS_POLL)
EFS_DELETED = Until(frozenset({"gone", "deleted"}), frozenset({"error"}), EFS_POLL)
FSX_AVAILABLE = Until(
    frozenset({"AVAILABLE"}), frozenset({"FAILED", "MISCONFIGURED", "DELETING", "MISCONFIGURED_UNAVAILABLE"}), FSX_POLL
)
FSX_DELETED = Until(frozenset({"gone", "deleted"}), frozenset({"FAILED"}), FSX_POLL)
DRA_AVAILABLE = Until(frozenset({"AVAILABLE"}), frozenset({"FAILED", "MISCONFIGURED", "DELETING"}), FSX_POLL)


def _poll(
    what: str, state: Callable[[], tuple[str | None, str]], until: Until, *, sleep: Sleep, timeout: float
) -> None:
    """Call `state()` -> (state, message) until a state of `until.done`; raise on `until.failed` or
    timeout. A state of None means gone: done when "gone" is in `done`, failed otherwise."""
    deadline = time.monotonic() + timeout
    while True:
        current, message = state()
        key = current or "gone"
        if key in until.done:
            return
        if key in until.failed or (current is None and "gone" not in until.done):
            raise ClusterbakeError(f"{what}: {key}" + (f": {message}" if message else ""))
        if time.monotonic() > deadline:
            raise ClusterbakeError(f"{what}: still {key} after {timeout:.0f}s")
        sleep(until.poll)


# --- EFS ---------------------------------------------------------------------------


def _efs_file_systems(efs, **params: Any) -> list[dict]:
    return paginate(efs, "describe_file_systems", "FileSystems", token_in="Marker", token_out="NextMarker", **params)


def _efs_get(efs, file_system_id: str) -> dict | None:
    found = or_if_gone("FileSystemNotFound", [], lambda: _efs_file_systems(efs, FileSystemId=file_system_id))
    return found[0] if found else None


def _efs_mount_targets(efs, file_system_id: str) -> list[dict]:
    def targets() -> list[dict]:
        markers = {"token_in": "Marker", "token_out": "NextMarker"}
        return paginate(efs, "describe_mount_targets", "MountTargets", **markers, FileSystemId=file_system_id)

    return or_if_gone("FileSystemNotFound", [], targets)


def _efs_mount_target_state(efs, mount_target_id: str) -> tuple[str | None, str]:
    def targets() -> list[dict]:
        return call(efs.describe_mount_targets, MountTargetId=mount_target_id)["MountTargets"]

    found = or_if_gone("MountTargetNotFound", [], targets)
    return (found[0]["LifeCycleState"], "") if found else (None, "")


def _efs_tagged(efs, cluster: str) -> list[dict]:
    return [fs for fs in _efs_file_systems(efs) if tags.as_dict(fs.get("Tags")).get(tags.CLUSTER) == cluster]


def planned(efs, fsx, cluster: str, entries: Iterable) -> list[tuple[str, str, bool]]:
    """(kind, name, made already) of each file system `cluster up` makes or keeps for the storage
    entries (read-only: the cluster's tagged file systems, or the one an entry names)."""
    made = {
        (kind, tags.as_dict(fs.get("Tags")).get(STORAGE))
        for kind, found in (("efs", _efs_tagged(efs, cluster)), ("fsx_lustre", _fsx_tagged(fsx, cluster)))
        for fs in found
    }
    result = []
    for _, entry in _ours(entries):
        kind = "EFS file system" if entry.type == "efs" else "FSx for Lustre file system"
        if entry.file_system_id:
            get = _efs_get if entry.type == "efs" else _fsx_get
            exists = get(efs if entry.type == "efs" else fsx, entry.file_system_id) is not None
            result.append((kind, f"{entry.file_system_id} (storage {entry.name})", exists))
        else:
            result.append((kind, file_system_name(cluster, entry.name), (entry.type, entry.name) in made))
    return result


def _efs_start(efs, cluster: str, index: int, entry, *, sleep: Sleep, timeout: float) -> str:
    """The entry's file system id: the named one, the cluster's one, or a new one (not waited on)."""
    label = _label(index, entry)
    if entry.file_system_id:
        if _efs_get(efs, entry.file_system_id) is None:
            raise ClusterbakeError(f"{label}: EFS file system {entry.file_system_id} does not exist (file_system_id)")
        return entry.file_system_id
    token = creation_token(cluster, entry.name)
    found = _efs_file_systems(efs, CreationToken=token)
    if found and found[0]["LifeCycleState"] in ("deleting", "deleted"):
        # The last `cluster down` is still deleting it: the token is free once it is gone.
        fs_id = found[0]["FileSystemId"]
        say(f"    {label}: waiting for EFS {fs_id} of the last cluster down to be deleted")
        _poll(
            f"{label}: EFS file system {fs_id}", lambda: _efs_state(efs, fs_id), EFS_GONE, sleep=sleep, timeout=timeout
        )
        found = []
    if found:
        fs = found[0]
        have = tags.as_dict(fs.get("Tags"))
        if have.get(tags.CLUSTER) != cluster:
            raise ClusterbakeError(
                f"{label}: EFS file system {fs['FileSystemId']} has CreationToken {token} but is not tagged "
                f"{tags.CLUSTER}={cluster}; delete it or rename the storage entry"
            )
        _sync_tags(lambda t: call(efs.tag_resource, ResourceId=fs["FileSystemId"], Tags=t), have, cluster, entry)
        if (fs.get("PerformanceMode"), fs.get("ThroughputMode")) != (entry.performance_mode, entry.throughput_mode):
            say(
                f"    {label}: EFS {fs['FileSystemId']} is {fs.get('PerformanceMode')}/{fs.get('ThroughputMode')}, "
                f"the config asks for {entry.performance_mode}/{entry.throughput_mode}: left as it is"
            )
        return fs["FileSystemId"]
    try:
        created = call(
            efs.create_file_system,
            CreationToken=token,
            PerformanceMode=entry.performance_mode,
            ThroughputMode=entry.throughput_mode,
            Encrypted=True,
            Tags=tags.as_list(storage_tags(cluster, entry)),
        )
    except ClientError as exc:
        if error_code(exc) != "FileSystemAlreadyExists":
            raise
        # A retried call whose first attempt got through.
        return _efs_file_systems(efs, CreationToken=token)[0]["FileSystemId"]
    say(f"    {label}: creating EFS {created['FileSystemId']}")
    return created["FileSystemId"]


def _efs_state(efs, file_system_id: str) -> tuple[str | None, str]:
    fs = _efs_get(efs, file_system_id)
    return (fs["LifeCycleState"], "") if fs else (None, "")


def _efs_mount_target(
    efs, index: int, entry, file_system_id: str, subnet_id: str, security_group_id: str, *, sleep: Sleep, timeout: float
) -> dict:
    """The file system's mount target in the subnet (created with the cluster's group), available."""
    label = _label(index, entry)
    mine = [mt for mt in _efs_mount_targets(efs, file_system_id) if mt["SubnetId"] == subnet_id]
    if mine and mine[0]["LifeCycleState"] not in ("deleting", "deleted"):
        target = mine[0]
        if entry.file_system_id:
            groups = call(efs.describe_mount_target_security_groups, MountTargetId=target["MountTargetId"])
            if security_group_id not in groups.get("SecurityGroups", []):
                say(
                    f"    {label}: mount target {target['MountTargetId']} of {file_system_id} is not in the cluster's "
                    f"security group {security_group_id}: its groups must allow NFS (TCP 2049) from the nodes"
                )
    else:
        try:
            target = call(
                efs.create_mount_target,
                FileSystemId=file_system_id,
                SubnetId=subnet_id,
                SecurityGroups=[security_group_id],
            )
        except ClientError as exc:
            if error_code(exc) != "MountTargetConflict":
                raise
            raise ClusterbakeError(
                f"{label}: EFS {file_system_id} cannot get a mount target in {subnet_id}: "
                f"{exc.response.get('Error', {}).get('Message', '')} (one mount target per Availability Zone, "
                "all in one VPC; a mount target being deleted: try again in a minute)"
            ) from exc
    mt_id = target["MountTargetId"]
    what = f"{label}: EFS mount target {mt_id} of {file_system_id}"
    _poll(what, lambda: _efs_mount_target_state(efs, mt_id), EFS_AVAILABLE, sleep=sleep, timeout=timeout)
    [target] = call(efs.describe_mount_targets, MountTargetId=mt_id)["MountTargets"]
    return target


def _efs_endpoint(file_system_id: str, target: dict, region: str) -> dict:
    return {
        "type": "efs",
        "file_system_id": file_system_id,
        "address": target["IpAddress"],
        "dns_name": efs_dns_name(file_system_id, region),
    }


# --- FSx for Lustre ----------------------------------------------------------------


def _fsx_file_systems(fsx, **params: Any) -> list[dict]:
    return paginate(fsx, "describe_file_systems", "FileSystems", **params)


def _fsx_get(fsx, file_system_id: str) -> dict | None:
    found = or_if_gone("FileSystemNotFound", [], lambda: _fsx_file_systems(fsx, FileSystemIds=[file_system_id]))
    return found[0] if found else None


def _fsx_tagged(fsx, cluster: str) -> list[dict]:
    return [fs for fs in _fsx_file_systems(fsx) if tags.as_dict(fs.get("Tags")).get(tags.CLUSTER) == cluster]


def _fsx_state(fsx, file_system_id: str) -> tuple[str | None, str]:
    fs = _fsx_get(fsx, file_system_id)
    if fs is None:
        return None, ""
    return fs.get("Lifecycle"), fs.get("FailureDetails", {}).get("Message", "")


def _client_token(cluster: str, name: str) -> str:
    # New for each attempt to create (a name used by a file system deleted an hour ago
    # must not bring that one back), the same for the retries of one call.
    return f"cb-{cluster}-{name}-{uuid.uuid4().hex[:8]}"


def fsx_create_params(cluster: str, entry, subnet_id: str, security_group_id: str) -> dict:
    lustre: dict[str, Any] = {"DeploymentType": entry.deployment_type}
    if entry.deployment_type == "PERSISTENT_2":
        lustre["PerUnitStorageThroughput"] = entry.throughput_per_tib
    return {
        "ClientRequestToken": _client_token(cluster, entry.name),
        "FileSystemType": "LUSTRE",
        "FileSystemTypeVersion": LUSTRE_VERSION,
        "StorageCapacity": entry.storage_capacity_gib,
        "SubnetIds": [subnet_id],
        "SecurityGroupIds": [security_group_id],
        "LustreConfiguration": lustre,
        "Tags": tags.as_list(storage_tags(cluster, entry)),
    }


def _fsx_start(
    fsx, cluster: str, index: int, entry, tagged: list[dict], subnet_id: str, security_group_id: str
) -> tuple[str, bool]:
    """(file system id, created by clusterbake): the named one, the cluster's one, or a new one."""
    label = _label(index, entry)
    if entry.file_system_id:
        if _fsx_get(fsx, entry.file_system_id) is None:
            raise ClusterbakeError(f"{label}: FSx file system {entry.file_system_id} does not exist (file_system_id)")
        return entry.file_system_id, False
    for fs in tagged:
        have = tags.as_dict(fs.get("Tags"))
        if have.get(STORAGE) == entry.name and fs.get("Lifecycle") != "DELETING":
            _sync_tags(
                lambda t, fs=fs: call(fsx.tag_resource, ResourceARN=fs["ResourceARN"], Tags=t), have, cluster, entry
            )
            lustre = fs.get("LustreConfiguration", {})
            have_spec = (
                lustre.get("DeploymentType"),
                fs.get("StorageCapacity"),
                lustre.get("PerUnitStorageThroughput"),
            )
            want = (entry.deployment_type, entry.storage_capacity_gib, entry.throughput_per_tib)
            if have_spec != want:
                say(
                    f"    {label}: FSx {fs['FileSystemId']} is {have_spec[0]}, {have_spec[1]} GiB, the config asks for "
                    f"{want[0]}, {want[1]} GiB: left as it is (delete it with `cluster down` to recreate it)"
                )
            return fs["FileSystemId"], True
    created = call(fsx.create_file_system, **fsx_create_params(cluster, entry, subnet_id, security_group_id))
    fs_id = created["FileSystem"]["FileSystemId"]
    say(f"    {label}: creating FSx for Lustre {fs_id} ({entry.deployment_type}, {entry.storage_capacity_gib} GiB)")
    return fs_id, True


def _fsx_wait(fsx, index: int, entry, file_system_id: str, *, sleep: Sleep, timeout: float) -> dict:
    what = f"{_label(index, entry)}: FSx for Lustre file system {file_system_id}"
    _poll(what, lambda: _fsx_state(fsx, file_system_id), FSX_AVAILABLE, sleep=sleep, timeout=timeout)
    fs = _fsx_get(fsx, file_system_id)
    if fs is None:
        raise ClusterbakeError(f"{_label(index, entry)}: FSx for Lustre file system {file_system_id} disappeared")
    return fs


def dra_params(cluster: str, entry, file_system_id: str) -> dict:
    events = {"Events": list(S3_EVENTS)}
    return {
        "ClientRequestToken": _client_token(cluster, entry.name),
        "FileSystemId": file_system_id,
        "FileSystemPath": "/",
        "DataRepositoryPath": entry.s3_path,
        "BatchImportMetaDataOnCreate": True,
        "S3": {"AutoImportPolicy": events, "AutoExportPolicy": events},
        "Tags": tags.as_list(storage_tags(cluster, entry)),
    }


def _dra_state(fsx, association_id: str) -> tuple[str | None, str]:
    found = or_if_gone(
        "DataRepositoryAssociationNotFound",
        [],
        lambda: call(fsx.describe_data_repository_associations, AssociationIds=[association_id])["Associations"],
    )
    if not found:
        return None, ""
    return found[0].get("Lifecycle"), found[0].get("FailureDetails", {}).get("Message", "")


def _fsx_link(fsx, cluster: str, index: int, entry, file_system_id: str, *, sleep: Sleep, timeout: float) -> None:
    """An entry with s3_path: the data repository association of `/`, available."""
    label = _label(index, entry)
    existing = paginate(
        fsx,
        "describe_data_repository_associations",
        "Associations",
        Filters=[{"Name": "file-system-id", "Values": [file_system_id]}],
    )
    root = [a for a in existing if a.get("FileSystemPath") == "/" and a.get("Lifecycle") != "DELETING"]
    if root and root[0].get("DataRepositoryPath", "").rstrip("/") != entry.s3_path.rstrip("/"):
        raise ClusterbakeError(
            f"{label}: FSx {file_system_id} is linked to {root[0].get('DataRepositoryPath')}, the config says "
            f"{entry.s3_path}; clusterbake does not relink a file system (delete the association by hand)"
        )
    if root:
        association_id = root[0]["AssociationId"]
    else:
        association = call(fsx.create_data_repository_association, **dra_params(cluster, entry, file_system_id))
        association_id = association["Association"]["AssociationId"]
        say(f"    {label}: linking FSx {file_system_id} to {entry.s3_path} ({association_id})")
    what = f"{label}: data repository association {association_id} of {file_system_id} ({entry.s3_path})"
    _poll(what, lambda: _dra_state(fsx, association_id), DRA_AVAILABLE, sleep=sleep, timeout=timeout)


def _fsx_endpoint(fs: dict) -> dict:
    return {
        "type": "fsx_lustre",
        "file_system_id": fs["FileSystemId"],
        "dns_name": fs.get("DNSName"),
        "mount_name": fs.get("LustreConfiguration", {}).get("MountName"),
    }


def _sync_tags(tag: Callable[[list[dict]], Any], have: dict[str, str], cluster: str, entry) -> None:
    want = storage_tags(cluster, entry)
    if any(have.get(k) != v for k, v in want.items()):
        tag(tags.as_list(want))


# --- the entry points --------------------------------------------------------------


def ensure_file_systems(
    efs,
    fsx,
    cluster: str,
    entries: Iterable,
    subnet_id: str,
    security_group_id: str,
    *,
    sleep: Sleep = time.sleep,
    efs_timeout: float = EFS_TIMEOUT,
    fsx_timeout: float = FSX_TIMEOUT,
) -> dict[str, dict]:
    """{entry name: endpoint} of every efs and fsx_lustre entry, created and waited on as needed.

    efs: {"type": "efs", "file_system_id", "address" (the mount target's IP in the subnet),
    "dns_name"}; fsx_lustre: {"type": "fsx_lustre", "file_system_id", "dns_name",
    "mount_name"}. A file system that fails (FSx Lifecycle FAILED, EFS error) raises
    ClusterbakeError naming the entry and AWS's message.
    """
    todo = _ours(entries)
    region = _region(efs)
    started: list[tuple[int, Any, str, bool]] = []
    tagged = _fsx_tagged(fsx, cluster) if any(e.type == "fsx_lustre" and not e.file_system_id for _, e in todo) else []
    for index, entry in todo:  # ask for everything first: they are created side by side
        if entry.type == "efs":
            fs_id = _efs_start(efs, cluster, index, entry, sleep=sleep, timeout=efs_timeout)
            started.append((index, entry, fs_id, not entry.file_system_id))
        else:
            fs_id, ours = _fsx_start(fsx, cluster, index, entry, tagged, subnet_id, security_group_id)
            started.append((index, entry, fs_id, ours))
    endpoints: dict[str, dict] = {}
    for index, entry, fs_id, ours in started:
        if entry.type == "efs":
            what = f"{_label(index, entry)}: EFS file system {fs_id}"
            _poll(what, lambda fs_id=fs_id: _efs_state(efs, fs_id), EFS_AVAILABLE, sleep=sleep, timeout=efs_timeout)
            target = _efs_mount_target(
                efs, index, entry, fs_id, subnet_id, security_group_id, sleep=sleep, timeout=efs_timeout
            )
            endpoints[entry.name] = _efs_endpoint(fs_id, target, region)
        else:
            fs = _fsx_wait(fsx, index, entry, fs_id, sleep=sleep, timeout=fsx_timeout)
            if ours and entry.s3_path:
                _fsx_link(fsx, cluster, index, entry, fs_id, sleep=sleep, timeout=fsx_timeout)
            endpoints[entry.name] = _fsx_endpoint(fs)
    return endpoints


def describe_endpoints(
    efs, fsx, cluster: str, entries: Iterable, region: str, subnet_id: str | None = None
) -> dict[str, dict]:
    """Read-only (the inventory): the endpoints of the entries whose file system is there and
    mountable (available; EFS with an available mount target, the one in `subnet_id` when
    given). Entries not created yet are left out."""
    todo = _ours(entries)
    endpoints: dict[str, dict] = {}
    tagged = _fsx_tagged(fsx, cluster) if any(e.type == "fsx_lustre" and not e.file_system_id for _, e in todo) else []
    for _, entry in todo:
        if entry.type == "efs":
            if entry.file_system_id:
                fs = _efs_get(efs, entry.file_system_id)
            else:
                found = _efs_file_systems(efs, CreationToken=creation_token(cluster, entry.name))
                fs = found[0] if found else None
                if fs and tags.as_dict(fs.get("Tags")).get(tags.CLUSTER) != cluster:
                    fs = None
            if not fs or fs.get("LifeCycleState") != "available":
                continue
            targets = [mt for mt in _efs_mount_targets(efs, fs["FileSystemId"]) if mt["LifeCycleState"] == "available"]
            if subnet_id:
                targets = [mt for mt in targets if mt["SubnetId"] == subnet_id]
            if targets:
                endpoints[entry.name] = _efs_endpoint(fs["FileSystemId"], targets[0], region)
        else:
            if entry.file_system_id:
                fs = _fsx_get(fsx, entry.file_system_id)
            else:
                fs = next(
                    (
                        f
                        for f in tagged
                        if tags.as_dict(f.get("Tags")).get(STORAGE) == entry.name and f.get("Lifecycle") == "AVAILABLE"
                    ),
                    None,
                )
            if fs and fs.get("Lifecycle") == "AVAILABLE":
                endpoints[entry.name] = _fsx_endpoint(fs)
    return endpoints


def delete_file_systems(
    efs,
    fsx,
    cluster: str,
    entries: Iterable,
    *,
    security_group_id: str | None = None,
    sleep: Sleep = time.sleep,
    efs_timeout: float = EFS_TIMEOUT,
    fsx_timeout: float = FSX_TIMEOUT,
) -> list[str]:
    """Delete the file systems clusterbake created for the cluster; returns what it did.

    Found by tag. Kept: those of an entry with `retain: true` (or, for a file system whose
    entry left the config, tagged clusterbake:retain=true) and any named by a
    `file_system_id`; each kept one is reported ("kept ..."). Deleted: every other
    tagged one, also those of entries no longer in the config. EFS: mount targets
    first (waited on until gone), then the file system; FSx: the file system (its data
    repository association goes with it). All deletions are asked for first, then
    waited on.

    With `security_group_id` (the cluster's group, about to be deleted), mount targets in
    that group are also removed from kept EFS file systems: they would hold the group.
    A kept FSx file system's network interfaces stay in its group (FSx cannot move them).
    """
    entries = [e for _, e in _ours(entries)]
    named = {e.file_system_id: e.name for e in entries if e.file_system_id}
    by_name = {(e.type, e.name): e for e in entries}
    report: list[str] = []
    efs_gone: list[tuple[str, str]] = []
    mount_targets_gone: list[tuple[str, str]] = []
    fsx_gone: list[tuple[str, str]] = []

    def kept(kind: str, fs: dict) -> str | None:
        have = tags.as_dict(fs.get("Tags"))
        name = have.get(STORAGE, "?")
        if fs["FileSystemId"] in named:
            return f"kept {kind} {fs['FileSystemId']} (storage {named[fs['FileSystemId']]}: named by file_system_id)"
        entry = by_name.get(("efs" if kind == "efs" else "fsx_lustre", name))
        retain = entry.retain if entry is not None else have.get(RETAIN) == "true"
        return f"kept {kind} {fs['FileSystemId']} (storage {name}: retain)" if retain else None

    # EFS: the tagged ones, and with security_group_id the named ones (their mount targets).
    efs_seen = {fs["FileSystemId"]: fs for fs in _efs_tagged(efs, cluster)}
    if security_group_id:
        for entry in entries:
            if entry.type == "efs" and entry.file_system_id and entry.file_system_id not in efs_seen:
                fs = _efs_get(efs, entry.file_system_id)
                if fs is not None:
                    efs_seen[fs["FileSystemId"]] = fs
    for fs_id, fs in sorted(efs_seen.items()):
        keep = kept("efs", fs)
        if keep:
            report.append(keep)
        for mt in _efs_mount_targets(efs, fs_id):
            mt_id = mt["MountTargetId"]
            if keep:
                if not security_group_id or mt["LifeCycleState"] in ("deleting", "deleted"):
                    continue
                groups = call(efs.describe_mount_target_security_groups, MountTargetId=mt_id)
                if security_group_id not in groups.get("SecurityGroups", []):
                    continue
                report.append(f"deleted mount target {mt_id} of kept efs {fs_id} (in {security_group_id})")
            if mt["LifeCycleState"] not in ("deleting", "deleted"):
                _delete_mount_target(efs, mt_id)
            mount_targets_gone.append((mt_id, fs_id))
        if not keep:
            efs_gone.append((fs_id, tags.as_dict(fs.get("Tags")).get(STORAGE, "?")))

    # FSx: ask for every deletion first.
    for fs in _fsx_tagged(fsx, cluster):
        keep = kept("fsx_lustre", fs)
        if keep:
            report.append(keep)
            continue
        name = tags.as_dict(fs.get("Tags")).get(STORAGE, "?")
        if fs.get("Lifecycle") != "DELETING":
            try:
                call(fsx.delete_file_system, FileSystemId=fs["FileSystemId"])
            except ClientError as exc:
                if error_code(exc) != "FileSystemNotFound":
                    raise
        fsx_gone.append((fs["FileSystemId"], name))

    for mt_id, fs_id in mount_targets_gone:
        what = f"EFS mount target {mt_id} of {fs_id}"
        _poll(
            what, lambda mt_id=mt_id: _efs_mount_target_state(efs, mt_id), EFS_DELETED, sleep=sleep, timeout=efs_timeout
        )
    for fs_id, _ in efs_gone:
        try:
            call(efs.delete_file_system, FileSystemId=fs_id)
        except ClientError as exc:
            if error_code(exc) != "FileSystemNotFound":
                raise
    for fs_id, name in efs_gone:
        what = f"EFS file system {fs_id}"
        _poll(what, lambda fs_id=fs_id: _efs_state(efs, fs_id), EFS_DELETED, sleep=sleep, timeout=efs_timeout)
        report.append(f"deleted efs {fs_id} (storage {name})")
    for fs_id, name in fsx_gone:
        what = f"FSx for Lustre file system {fs_id}"
        _poll(what, lambda fs_id=fs_id: _fsx_state(fsx, fs_id), FSX_DELETED, sleep=sleep, timeout=fsx_timeout)
        report.append(f"deleted fsx_lustre {fs_id} (storage {name})")
    return report


def _delete_mount_target(efs, mount_target_id: str) -> None:
    or_if_gone("MountTargetNotFound", None, lambda: call(efs.delete_mount_target, MountTargetId=mount_target_id))


# --- validate ----------------------------------------------------------------------


def check_storage(efs, fsx, s3, entries: Iterable) -> None:
    """Read-only checks for `validate`; ConfigError naming the field of the first problem.

    A named file system must exist (and be Lustre for fsx_lustre); an s3_path's bucket must
    exist, be readable by these credentials (FSx links it with them) and be in the
    file system's region; EFS's elastic throughput only goes with generalPurpose.
    """
    region = _region(fsx)
    for index, entry in _ours(entries):
        field = f"storage.{index}"
        if entry.type == "efs":
            if entry.performance_mode == "maxIO" and entry.throughput_mode == "elastic":
                raise ConfigError(
                    f"{field}.throughput_mode: elastic throughput needs performance_mode generalPurpose; "
                    "set throughput_mode: bursting or performance_mode: generalPurpose"
                )
            if entry.file_system_id and _efs_get(efs, entry.file_system_id) is None:
                raise ConfigError(
                    f"{field}.file_system_id: EFS file system {entry.file_system_id} does not exist in {region}"
                )
            continue
        if entry.file_system_id:
            fs = _fsx_get(fsx, entry.file_system_id)
            if fs is None:
                raise ConfigError(
                    f"{field}.file_system_id: FSx file system {entry.file_system_id} does not exist in {region}"
                )
            if fs.get("FileSystemType") != "LUSTRE":
                raise ConfigError(
                    f"{field}.file_system_id: {entry.file_system_id} is an FSx for {fs.get('FileSystemType')} "
                    "file system, not Lustre"
                )
        if entry.s3_path:
            bucket = entry.s3_path.removeprefix("s3://").split("/", 1)[0]
            try:
                head = call(s3.head_bucket, Bucket=bucket)
            except ClientError as exc:
                status = exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode")
                code = error_code(exc)
                if code in ("404", "NoSuchBucket") or status == 404:
                    raise ConfigError(f"{field}.s3_path: S3 bucket {bucket} does not exist") from None
                if code in ("403", "AccessDenied") or status == 403:
                    raise ConfigError(
                        f"{field}.s3_path: S3 bucket {bucket} exists but these credentials may not read it "
                        "(FSx links it with them)"
                    ) from None
                raise
            bucket_region = head.get("BucketRegion") or head.get("ResponseMetadata", {}).get("HTTPHeaders", {}).get(
                "x-amz-bucket-region"
            )
            if bucket_region and bucket_region != region:
                raise ConfigError(
                    f"{field}.s3_path: S3 bucket {bucket} is in {bucket_region}; FSx for Lustre links buckets of "
                    f"its own region ({region}) only"
                )
