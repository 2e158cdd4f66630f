"""Shared file systems (storage.py): EFS and FSx for Lustre.

EFS runs against the real moto_server of conftest.py: CreateFileSystem (CreationToken
idempotency: a second create answers FileSystemAlreadyExists), DescribeFileSystems by
token and id and paged with Marker/NextMarker (10 a page), mount targets with an
address from the subnet, DescribeMountTargetSecurityGroups, TagResource, deletion
(FileSystemInUse while mount targets exist). moto's EFS is `available` at once, so
the waits return on their first poll.

FSx for Lustre in moto 5.2.5 is too thin for ensure_file_systems, so its creation is
tested with botocore's Stubber (requests checked against the FSx model):
- moto's file systems have no `Lifecycle` at all (never CREATING, AVAILABLE or
  FAILED) and no `LustreConfiguration.MountName`; it echoes only the
  LustreConfiguration keys of the response shape (ImportPath etc. are dropped);
- CreateDataRepositoryAssociation and DescribeDataRepositoryAssociations are not
  implemented (HTTP 500);
- ClientRequestToken is ignored (the same token twice makes two file systems);
- DescribeFileSystems of an unknown id answers an empty list where FSx answers
  FileSystemNotFound (storage.py takes both as "not there").
What moto's FSx does do (DescribeFileSystems with tags, paged; DeleteFileSystem;
TagResource) is used against the server: finding by tag, delete, check_storage.
S3 HeadBucket is moto's own (404 for a missing bucket, BucketRegion).
"""

from __future__ import annotations

import ipaddress
import time

import botocore.session
import pytest
from botocore.stub import ANY, Stubber

from clusterbake.config import EfsStorage, FsxLustreStorage, NfsStorage
from clusterbake.errors import ClusterbakeError, ConfigError
from clusterbake.providers.aws import storage

REGION = "us-east-1"
SUBNET = "subnet-0123456789abcdef0"
GROUP = "sg-0123456789abcdef0"


def no_sleep(_):
    pass


def efs_entry(name: str, **fields) -> EfsStorage:
    return EfsStorage(name=name, mount_point=f"/{name}", type="efs", **fields)


def fsx_entry(name: str, **fields) -> FsxLustreStorage:
    return FsxLustreStorage(name=name, mount_point=f"/{name}", type="fsx_lustre", **fields)


@pytest.fixture
def group(moto, network, request) -> str:
    name = f"storage-{request.node.name}"[:200]
    return moto.ec2().create_security_group(GroupName=name, Description="t", VpcId=network.vpc_id)["GroupId"]


def _tagged_efs(efs, cluster: str) -> list[dict]:
    found, marker = [], None
    while True:
        page = efs.describe_file_systems(**({"Marker": marker} if marker else {}))
        found += [
            fs for fs in page["FileSystems"] if {"Key": "clusterbake:cluster", "Value": cluster} in fs.get("Tags", [])
        ]
        marker = page.get("NextMarker")
        if not marker:
            return found


def _tagged_fsx(fsx, cluster: str) -> list[dict]:
    pages = fsx.get_paginator("describe_file_systems").paginate()
    return [
        fs
        for page in pages
        for fs in page["FileSystems"]
        if {"Key": "clusterbake:cluster", "Value": cluster} in fs.get("Tags", [])
    ]


# --- EFS against moto --------------------------------------------------------------


def test_efs_is_created_once_with_one_mount_target(moto, network, group):
    efs, fsx = moto.client("efs"), moto.client("fsx")
    entries = [NfsStorage(name="home", mount_point="/home", type="nfs"), efs_entry("shared")]
    endpoints = storage.ensure_file_systems(efs, fsx, "efsonce", entries, network.subnet_id, group, sleep=no_sleep)
    assert set(endpoints) == {"shared"}  # nfs: nothing in AWS
    shared = endpoints["shared"]
    [fs] = _tagged_efs(efs, "efsonce")
    assert shared == {
        "type": "efs",
        "file_system_id": fs["FileSystemId"],
        "address": shared["address"],
        "dns_name": f"{fs['FileSystemId']}.efs.{REGION}.amazonaws.com",
    }
    assert ipaddress.ip_address(shared["address"]) in ipaddress.ip_network("10.50.0.0/20")
    assert fs["CreationToken"] == "clusterbake-efsonce-shared"
    assert fs["Encrypted"] is True
    assert (fs["PerformanceMode"], fs["ThroughputMode"]) == ("generalPurpose", "elastic")
    assert {t["Key"]: t["Value"] for t in fs.get("Tags", [])} == {
        "clusterbake:cluster": "efsonce",
        "clusterbake:storage": "shared",
        "clusterbake:retain": "false",
        "Name": "clusterbake-efsonce-shared",
    }
    [target] = efs.describe_mount_targets(FileSystemId=fs["FileSystemId"])["MountTargets"]
    assert target["SubnetId"] == network.subnet_id
    assert efs.describe_mount_target_security_groups(MountTargetId=target["MountTargetId"])["SecurityGroups"] == [group]

    again = storage.ensure_file_systems(efs, fsx, "efsonce", entries, network.subnet_id, group, sleep=no_sleep)
    assert again == endpoints
    assert len(_tagged_efs(efs, "efsonce")) == 1
    assert len(efs.describe_mount_targets(FileSystemId=fs["FileSystemId"])["MountTargets"]) == 1
    assert storage.describe_endpoints(efs, fsx, "efsonce", entries, REGION, network.subnet_id) == endpoints

    assert storage.delete_file_systems(efs, fsx, "efsonce", entries, sleep=no_sleep) == [
        f"deleted efs {fs['FileSystemId']} (storage shared)"
    ]
    assert _tagged_efs(efs, "efsonce") == []
    assert storage.delete_file_systems(efs, fsx, "efsonce", entries, sleep=no_sleep) == []
    assert storage.describe_endpoints(efs, fsx, "efsonce", entries, REGION) == {}


def test_efs_retain_and_file_system_id_are_kept(moto, network, group):
    efs, fsx = moto.client("efs"), moto.client("fsx")
    existing = efs.create_file_system(CreationToken="made-by-hand-keep", Encrypted=True)["FileSystemId"]
    entries = [
        efs_entry("home", retain=True),
        efs_entry("scratch"),
        efs_entry("data", file_system_id=existing),
    ]
    endpoints = storage.ensure_file_systems(efs, fsx, "efskeep", entries, network.subnet_id, group, sleep=no_sleep)
    assert endpoints["data"]["file_system_id"] == existing
    assert [mt["SubnetId"] for mt in efs.describe_mount_targets(FileSystemId=existing)["MountTargets"]] == [
        network.subnet_id
    ]
    ours = {
        {t["Key"]: t["Value"] for t in fs.get("Tags", [])}["clusterbake:storage"]: fs
        for fs in _tagged_efs(efs, "efskeep")
    }
    assert set(ours) == {"home", "scratch"}  # the named one is not tagged
    assert {t["Key"]: t["Value"] for t in ours["home"]["Tags"]}["clusterbake:retain"] == "true"
    home, scratch = ours["home"]["FileSystemId"], ours["scratch"]["FileSystemId"]

    report = storage.delete_file_systems(efs, fsx, "efskeep", entries, security_group_id=group, sleep=no_sleep)
    targets = {
        fs_id: efs_target
        for fs_id, efs_target in ((home, endpoints["home"]), (existing, endpoints["data"]))
        if efs_target["file_system_id"] == fs_id
    }
    assert len(targets) == 2
    assert sorted(r for r in report if not r.startswith("deleted mount target")) == sorted(
        [
            f"kept efs {home} (storage home: retain)",
            f"kept efs {existing} (storage data: named by file_system_id)",
            f"deleted efs {scratch} (storage scratch)",
        ]
    )
    removed_targets = [r for r in report if r.startswith("deleted mount target")]
    assert sorted(r.split(" of kept efs ")[1] for r in removed_targets) == sorted(
        [f"{home} (in {group})", f"{existing} (in {group})"]
    )
    assert [fs["FileSystemId"] for fs in _tagged_efs(efs, "efskeep")] == [home]
    # Kept file systems lose the mount targets that hold the cluster's security group.
    assert efs.describe_mount_targets(FileSystemId=home)["MountTargets"] == []
    assert efs.describe_mount_targets(FileSystemId=existing)["MountTargets"] == []
    efs.describe_file_systems(FileSystemId=existing)

    again = storage.delete_file_systems(efs, fsx, "efskeep", entries, security_group_id=group, sleep=no_sleep)
    assert sorted(again) == sorted(
        [f"kept efs {home} (storage home: retain)", f"kept efs {existing} (storage data: named by file_system_id)"]
    )

    # The next `up` finds the kept file system again and gives it a new mount target.
    back = storage.ensure_file_systems(efs, fsx, "efskeep", entries, network.subnet_id, group, sleep=no_sleep)
    assert back["home"]["file_system_id"] == home
    assert len(efs.describe_mount_targets(FileSystemId=home)["MountTargets"]) == 1
    storage.delete_file_systems(efs, fsx, "efskeep", [], security_group_id=group, sleep=no_sleep)
    assert [fs["FileSystemId"] for fs in _tagged_efs(efs, "efskeep")] == [home]  # still tagged retain=true
    efs.delete_mount_target(
        MountTargetId=efs.describe_mount_targets(FileSystemId=existing)["MountTargets"][0]["MountTargetId"]
    )
    efs.delete_file_system(FileSystemId=existing)


def test_entries_gone_from_the_config_are_deleted_unless_tagged_retain(moto, network, group):
    efs, fsx = moto.client("efs"), moto.client("fsx")
    entries = [efs_entry("old"), efs_entry("precious", retain=True), efs_entry("stays")]
    storage.ensure_file_systems(efs, fsx, "efsgone", entries, network.subnet_id, group, sleep=no_sleep)
    ids = {
        {t["Key"]: t["Value"] for t in fs.get("Tags", [])}["clusterbake:storage"]: fs["FileSystemId"]
        for fs in _tagged_efs(efs, "efsgone")
    }
    # Another cluster's file system is never touched.
    storage.ensure_file_systems(efs, fsx, "efsother", [efs_entry("old")], network.subnet_id, group, sleep=no_sleep)

    report = storage.delete_file_systems(efs, fsx, "efsgone", [efs_entry("stays")], sleep=no_sleep)
    assert sorted(report) == sorted(
        [
            f"deleted efs {ids['old']} (storage old)",
            f"kept efs {ids['precious']} (storage precious: retain)",
            f"deleted efs {ids['stays']} (storage stays)",
        ]
    )
    assert [fs["FileSystemId"] for fs in _tagged_efs(efs, "efsgone")] == [ids["precious"]]
    assert len(_tagged_efs(efs, "efsother")) == 1

    # retain: false in the config wins over the tag: the file system goes.
    assert storage.delete_file_systems(efs, fsx, "efsgone", [efs_entry("precious")], sleep=no_sleep) == [
        f"deleted efs {ids['precious']} (storage precious)"
    ]
    storage.delete_file_systems(efs, fsx, "efsother", [], sleep=no_sleep)
    assert _tagged_efs(efs, "efsother") == []


def test_retain_changes_are_written_to_the_tag(moto, network, group):
    efs, fsx = moto.client("efs"), moto.client("fsx")
    storage.ensure_file_systems(efs, fsx, "efsflip", [efs_entry("home")], network.subnet_id, group, sleep=no_sleep)
    storage.ensure_file_systems(
        efs, fsx, "efsflip", [efs_entry("home", retain=True)], network.subnet_id, group, sleep=no_sleep
    )
    [fs] = _tagged_efs(efs, "efsflip")
    assert {t["Key"]: t["Value"] for t in fs.get("Tags", [])}["clusterbake:retain"] == "true"
    # Removed from the config later: the tag keeps it.
    assert storage.delete_file_systems(efs, fsx, "efsflip", [], sleep=no_sleep) == [
        f"kept efs {fs['FileSystemId']} (storage home: retain)"
    ]
    storage.delete_file_systems(efs, fsx, "efsflip", [efs_entry("home")], sleep=no_sleep)
    assert _tagged_efs(efs, "efsflip") == []


def test_a_creation_token_of_another_owner_is_refused(moto, network, group):
    efs, fsx = moto.client("efs"), moto.client("fsx")
    efs.create_file_system(CreationToken="clusterbake-efstaken-home", Tags=[{"Key": "Name", "Value": "not ours"}])
    with pytest.raises(ClusterbakeError) as info:
        storage.ensure_file_systems(efs, fsx, "efstaken", [efs_entry("home")], network.subnet_id, group, sleep=no_sleep)
    assert "storage.0 (home): EFS file system fs-" in str(info.value)
    assert "has CreationToken clusterbake-efstaken-home but is not tagged clusterbake:cluster=efstaken" in str(
        info.value
    )


def test_check_storage(moto):
    efs, fsx, s3 = moto.client("efs"), moto.client("fsx"), moto.client("s3")
    s3.create_bucket(Bucket="clusterbake-check-data")
    lustre = fsx.create_file_system(FileSystemType="LUSTRE", StorageCapacity=1200, SubnetIds=[SUBNET])
    lustre_id = lustre["FileSystem"]["FileSystemId"]
    fine = [
        NfsStorage(name="home", mount_point="/home", type="nfs"),
        fsx_entry("scratch", s3_path="s3://clusterbake-check-data/input"),
        fsx_entry("named", file_system_id=lustre_id),
    ]
    storage.check_storage(efs, fsx, s3, fine)
    cases = [
        (efs_entry("e", file_system_id="fs-0123456789abcdef0"), r"storage\.1\.file_system_id: EFS file system fs-0123"),
        (fsx_entry("f", file_system_id="fs-0123456789abcdef0"), r"storage\.1\.file_system_id: FSx file system fs-0123"),
        (
            fsx_entry("s", s3_path="s3://clusterbake-no-such-bucket/x"),
            r"storage\.1\.s3_path: S3 bucket clusterbake-no-such-bucket does not exist",
        ),
        (efs_entry("m", performance_mode="maxIO"), r"storage\.1\.throughput_mode: elastic throughput needs"),
    ]
    for entry, message in cases:
        with pytest.raises(ConfigError, match=message):
            storage.check_storage(efs, fsx, s3, [fine[0], entry])
    fsx.delete_file_system(FileSystemId=lustre_id)


# --- FSx: delete against moto ------------------------------------------------------


def _moto_fsx(fsx, cluster: str, entry) -> str:
    """A file system as ensure_file_systems makes it (moto cannot take it through the waits)."""
    params = storage.fsx_create_params(cluster, entry, SUBNET, GROUP)
    return fsx.create_file_system(**params)["FileSystem"]["FileSystemId"]


def test_fsx_delete_keeps_retain_and_other_clusters(moto):
    efs, fsx = moto.client("efs"), moto.client("fsx")
    entries = [
        fsx_entry("scratch"),
        fsx_entry("persist", deployment_type="PERSISTENT_2", throughput_per_tib=250, retain=True),
    ]
    scratch = _moto_fsx(fsx, "fsxdel", entries[0])
    persist = _moto_fsx(fsx, "fsxdel", entries[1])
    removed = _moto_fsx(fsx, "fsxdel", fsx_entry("removed"))
    other = _moto_fsx(fsx, "fsxother", entries[0])
    untagged = fsx.create_file_system(FileSystemType="LUSTRE", StorageCapacity=1200, SubnetIds=[SUBNET])
    untagged_id = untagged["FileSystem"]["FileSystemId"]

    report = storage.delete_file_systems(efs, fsx, "fsxdel", entries, sleep=no_sleep)
    assert sorted(report) == sorted(
        [
            f"deleted fsx_lustre {scratch} (storage scratch)",
            f"kept fsx_lustre {persist} (storage persist: retain)",
            f"deleted fsx_lustre {removed} (storage removed)",
        ]
    )
    assert [fs["FileSystemId"] for fs in _tagged_fsx(fsx, "fsxdel")] == [persist]
    assert storage.delete_file_systems(efs, fsx, "fsxdel", entries, sleep=no_sleep) == [
        f"kept fsx_lustre {persist} (storage persist: retain)"
    ]
    assert [fs["FileSystemId"] for fs in _tagged_fsx(fsx, "fsxother")] == [other]
    # Named by file_system_id: kept although tagged for the cluster and not retained.
    named = [fsx_entry("persist", deployment_type="PERSISTENT_2", throughput_per_tib=250, file_system_id=persist)]
    assert storage.delete_file_systems(efs, fsx, "fsxdel", named, sleep=no_sleep) == [
        f"kept fsx_lustre {persist} (storage persist: named by file_system_id)"
    ]
    assert storage.delete_file_systems(
        efs,
        fsx,
        "fsxdel",
        [fsx_entry("persist", deployment_type="PERSISTENT_2", throughput_per_tib=250)],
        sleep=no_sleep,
    ) == [f"deleted fsx_lustre {persist} (storage persist)"]
    assert _tagged_fsx(fsx, "fsxdel") == []
    assert storage.delete_file_systems(efs, fsx, "fsxdel", entries, sleep=no_sleep) == []
    for fs_id in (other, untagged_id):
        fsx.delete_file_system(FileSystemId=fs_id)


# --- FSx creation with Stubber -----------------------------------------------------


def _client(service: str):
    return botocore.session.get_session().create_client(
        service, region_name=REGION, aws_access_key_id="testing", aws_secret_access_key="testing"
    )


def _tags(cluster: str, name: str, retain: str = "false") -> list[dict]:
    return [
        {"Key": "clusterbake:cluster", "Value": cluster},
        {"Key": "clusterbake:storage", "Value": name},
        {"Key": "clusterbake:retain", "Value": retain},
        {"Key": "Name", "Value": f"clusterbake-{cluster}-{name}"},
    ]


def _fs(fs_id: str, lifecycle: str, lustre: dict, cluster="lus", name="scratch", **extra) -> dict:
    return {
        "FileSystemId": fs_id,
        "FileSystemType": "LUSTRE",
        "Lifecycle": lifecycle,
        "StorageCapacity": 1200,
        "DNSName": f"{fs_id}.fsx.{REGION}.amazonaws.com",
        "ResourceARN": f"arn:aws:fsx:{REGION}:123456789012:file-system/{fs_id}",
        "LustreConfiguration": lustre,
        "Tags": _tags(cluster, name),
        **extra,
    }


FS = "fs-0123456789abcdef0"


def _expect_root_link(stub, name: str, s3_path: str) -> None:
    """DescribeDataRepositoryAssociations (none), CreateDataRepositoryAssociation of `/` with `s3_path`
    (import and export of new, changed and deleted objects), then its lifecycle until AVAILABLE."""
    stub.add_response(
        "describe_data_repository_associations",
        {"Associations": []},
        {"Filters": [{"Name": "file-system-id", "Values": [FS]}]},
    )
    events = {"Events": ["NEW", "CHANGED", "DELETED"]}
    stub.add_response(
        "create_data_repository_association",
        {"Association": {"AssociationId": "dra-0123456789abcdef0", "Lifecycle": "CREATING"}},
        {
            "ClientRequestToken": ANY,
            "FileSystemId": FS,
            "FileSystemPath": "/",
            "DataRepositoryPath": s3_path,
            "BatchImportMetaDataOnCreate": True,
            "S3": {"AutoImportPolicy": events, "AutoExportPolicy": events},
            "Tags": _tags("lus", name),
        },
    )
    by_association = {"AssociationIds": ["dra-0123456789abcdef0"]}
    for lifecycle in ("CREATING", "AVAILABLE"):
        stub.add_response(
            "describe_data_repository_associations",
            {"Associations": [{"AssociationId": "dra-0123456789abcdef0", "Lifecycle": lifecycle}]},
            by_association,
        )


def test_scratch_file_system_with_s3_is_linked_by_an_association_that_exports():
    """Realcloud review A7: SCRATCH_2's legacy ImportPath/ExportPath exports nothing on Lustre 2.15."""
    fsx, efs = _client("fsx"), _client("efs")
    entry = fsx_entry("scratch", s3_path="s3://lus-data/input")
    with Stubber(fsx) as stub:
        stub.add_response("describe_file_systems", {"FileSystems": []}, {})
        stub.add_response(
            "create_file_system",
            {"FileSystem": _fs(FS, "CREATING", {"DeploymentType": "SCRATCH_2"})},
            {
                "ClientRequestToken": ANY,
                "FileSystemType": "LUSTRE",
                "FileSystemTypeVersion": "2.15",
                "StorageCapacity": 1200,
                "SubnetIds": [SUBNET],
                "SecurityGroupIds": [GROUP],
                "LustreConfiguration": {"DeploymentType": "SCRATCH_2"},
                "Tags": _tags("lus", "scratch"),
            },
        )
        by_id = {"FileSystemIds": [FS]}
        stub.add_response("describe_file_systems", {"FileSystems": [_fs(FS, "CREATING", {})]}, by_id)
        available = _fs(FS, "AVAILABLE", {"DeploymentType": "SCRATCH_2", "MountName": "abcdefgh"})
        stub.add_response("describe_file_systems", {"FileSystems": [available]}, by_id)
        stub.add_response("describe_file_systems", {"FileSystems": [available]}, by_id)
        _expect_root_link(stub, "scratch", "s3://lus-data/input")
        endpoints = storage.ensure_file_systems(efs, fsx, "lus", [entry], SUBNET, GROUP, sleep=no_sleep)
        stub.assert_no_pending_responses()
    assert endpoints == {
        "scratch": {
            "type": "fsx_lustre",
            "file_system_id": FS,
            "dns_name": f"{FS}.fsx.{REGION}.amazonaws.com",
            "mount_name": "abcdefgh",
        }
    }


def test_an_existing_file_system_is_not_created_again():
    fsx, efs = _client("fsx"), _client("efs")
    entry = fsx_entry("scratch")
    available = _fs(FS, "AVAILABLE", {"DeploymentType": "SCRATCH_2", "MountName": "abcdefgh"})
    with Stubber(fsx) as stub:
        stub.add_response(
            "describe_file_systems",
            {"FileSystems": [_fs("fs-0000000000000000f", "AVAILABLE", {}, cluster="other"), available]},
            {},
        )
        stub.add_response("describe_file_systems", {"FileSystems": [available]}, {"FileSystemIds": [FS]})
        stub.add_response("describe_file_systems", {"FileSystems": [available]}, {"FileSystemIds": [FS]})
        endpoints = storage.ensure_file_systems(efs, fsx, "lus", [entry], SUBNET, GROUP, sleep=no_sleep)
        stub.assert_no_pending_responses()  # no CreateFileSystem
    assert endpoints["scratch"]["mount_name"] == "abcdefgh"


def test_persistent_file_system_gets_a_data_repository_association():
    fsx, efs = _client("fsx"), _client("efs")
    entry = fsx_entry(
        "persist",
        deployment_type="PERSISTENT_2",
        throughput_per_tib=250,
        storage_capacity_gib=2400,
        s3_path="s3://lus-data/ckpt",
    )
    lustre = {"DeploymentType": "PERSISTENT_2", "PerUnitStorageThroughput": 250, "MountName": "qrstuvwx"}
    by_id = {"FileSystemIds": [FS]}
    with Stubber(fsx) as stub:
        stub.add_response("describe_file_systems", {"FileSystems": []}, {})
        stub.add_response(
            "create_file_system",
            {"FileSystem": _fs(FS, "CREATING", lustre, name="persist")},
            {
                "ClientRequestToken": ANY,
                "FileSystemType": "LUSTRE",
                "FileSystemTypeVersion": "2.15",
                "StorageCapacity": 2400,
                "SubnetIds": [SUBNET],
                "SecurityGroupIds": [GROUP],
                "LustreConfiguration": {"DeploymentType": "PERSISTENT_2", "PerUnitStorageThroughput": 250},
                "Tags": _tags("lus", "persist"),
            },
        )
        stub.add_response(
            "describe_file_systems", {"FileSystems": [_fs(FS, "AVAILABLE", lustre, name="persist")]}, by_id
        )
        stub.add_response(
            "describe_file_systems", {"FileSystems": [_fs(FS, "AVAILABLE", lustre, name="persist")]}, by_id
        )
        _expect_root_link(stub, "persist", "s3://lus-data/ckpt")
        endpoints = storage.ensure_file_systems(efs, fsx, "lus", [entry], SUBNET, GROUP, sleep=no_sleep)
        stub.assert_no_pending_responses()
    assert endpoints["persist"] == {
        "type": "fsx_lustre",
        "file_system_id": FS,
        "dns_name": f"{FS}.fsx.{REGION}.amazonaws.com",
        "mount_name": "qrstuvwx",
    }


def test_a_failed_file_system_names_the_entry_and_awss_message():
    fsx, efs = _client("fsx"), _client("efs")
    entries = [NfsStorage(name="home", mount_point="/home", type="nfs"), fsx_entry("scratch")]
    message = "The subnet subnet-0123456789abcdef0 does not have enough free IP addresses."
    with Stubber(fsx) as stub:
        stub.add_response("describe_file_systems", {"FileSystems": []}, {})
        stub.add_response("create_file_system", {"FileSystem": _fs(FS, "CREATING", {})}, None)
        stub.add_response(
            "describe_file_systems",
            {"FileSystems": [_fs(FS, "FAILED", {}, FailureDetails={"Message": message})]},
            {"FileSystemIds": [FS]},
        )
        with pytest.raises(ClusterbakeError) as info:
            storage.ensure_file_systems(efs, fsx, "lus", entries, SUBNET, GROUP, sleep=no_sleep)
        stub.assert_no_pending_responses()
    assert str(info.value) == f"storage.1 (scratch): FSx for Lustre file system {FS}: FAILED: {message}"


def test_a_failed_data_repository_association_names_the_entry():
    fsx, efs = _client("fsx"), _client("efs")
    entry = fsx_entry("persist", deployment_type="PERSISTENT_2", throughput_per_tib=125, s3_path="s3://lus-data")
    available = _fs(FS, "AVAILABLE", {"DeploymentType": "PERSISTENT_2", "MountName": "m"}, name="persist")
    with Stubber(fsx) as stub:
        stub.add_response("describe_file_systems", {"FileSystems": [available]}, {})
        stub.add_response("describe_file_systems", {"FileSystems": [available]}, {"FileSystemIds": [FS]})
        stub.add_response("describe_file_systems", {"FileSystems": [available]}, {"FileSystemIds": [FS]})
        stub.add_response("describe_data_repository_associations", {"Associations": []}, None)
        stub.add_response(
            "create_data_repository_association", {"Association": {"AssociationId": "dra-0000000000000000a"}}, None
        )
        stub.add_response(
            "describe_data_repository_associations",
            {
                "Associations": [
                    {
                        "AssociationId": "dra-0000000000000000a",
                        "Lifecycle": "MISCONFIGURED",
                        "FailureDetails": {"Message": "Access denied to s3://lus-data"},
                    }
                ]
            },
            {"AssociationIds": ["dra-0000000000000000a"]},
        )
        with pytest.raises(
            ClusterbakeError,
            match=r"^storage\.0 \(persist\): data repository association dra-0+a .*MISCONFIGURED: Access denied",
        ):
            storage.ensure_file_systems(efs, fsx, "lus", [entry], SUBNET, GROUP, sleep=no_sleep)
        stub.assert_no_pending_responses()


def test_creation_that_takes_too_long_times_out():
    fsx, efs = _client("fsx"), _client("efs")
    creating = _fs(FS, "CREATING", {})
    with Stubber(fsx) as stub:
        stub.add_response("describe_file_systems", {"FileSystems": [creating]}, {})
        stub.add_response("describe_file_systems", {"FileSystems": [creating]}, {"FileSystemIds": [FS]})
        with pytest.raises(
            ClusterbakeError, match=r"storage\.0 \(scratch\): FSx for Lustre file system .*: still CREATING after 0s"
        ):
            storage.ensure_file_systems(
                efs, fsx, "lus", [fsx_entry("scratch")], SUBNET, GROUP, sleep=no_sleep, fsx_timeout=0
            )


def test_describe_endpoints_reads_only_and_skips_what_is_not_mountable():
    fsx, efs = _client("fsx"), _client("efs")
    entries = [fsx_entry("scratch"), fsx_entry("named", file_system_id="fs-0000000000000000b"), fsx_entry("later")]
    old = _fs("fs-0000000000000000a", "DELETING", {"MountName": "old"})
    new = _fs(FS, "AVAILABLE", {"MountName": "new"})
    named = _fs("fs-0000000000000000b", "AVAILABLE", {"MountName": "nmd"}, cluster="someone", name="x")
    with Stubber(fsx) as stub:  # only Describe calls are queued: any other call fails the test
        stub.add_response("describe_file_systems", {"FileSystems": [old, new]}, {})
        stub.add_response(
            "describe_file_systems", {"FileSystems": [named]}, {"FileSystemIds": ["fs-0000000000000000b"]}
        )
        endpoints = storage.describe_endpoints(efs, fsx, "lus", entries, REGION)
        stub.assert_no_pending_responses()
    assert {name: e["mount_name"] for name, e in endpoints.items()} == {"scratch": "new", "named": "nmd"}


def test_efs_listing_follows_next_marker(moto):
    efs, fsx = moto.client("efs"), moto.client("fsx")
    # moto pages DescribeFileSystems by 10, with NextMarker as EFS does.
    made = [
        efs.create_file_system(
            CreationToken=f"clusterbake-efspage-v{n}",
            Tags=[{"Key": k, "Value": v} for k, v in storage.storage_tags("efspage", efs_entry(f"v{n}")).items()],
        )["FileSystemId"]
        for n in range(12)
    ]
    assert efs.describe_file_systems().get("NextMarker")
    report = storage.delete_file_systems(efs, fsx, "efspage", [], sleep=no_sleep)
    assert sorted(report) == sorted(f"deleted efs {fs_id} (storage v{n})" for n, fs_id in enumerate(made))
    assert _tagged_efs(efs, "efspage") == []


def test_a_scratch_file_system_linked_to_s3_on_the_twin_exports_through_its_association(moto, network, group):
    """The EC2 twin's FSx (realcloud review A7, D7): a file system is CREATING before it is AVAILABLE, and
    only a data repository association exports; SCRATCH_2's legacy ImportPath would import only. The
    product waits for both and links SCRATCH_2 by an association with an AutoExportPolicy; `cluster down`
    takes the association with the file system."""
    efs, fsx = moto.client("efs"), moto.client("fsx")
    entry = fsx_entry("scratch", s3_path="s3://lus-twin/out")
    quick = lambda seconds: time.sleep(min(seconds, 0.5))  # noqa: E731  (the twin's CREATING lasts 2 s)
    endpoints = storage.ensure_file_systems(efs, fsx, "lustwin", [entry], network.subnet_id, group, sleep=quick)
    fs_id = endpoints["scratch"]["file_system_id"]
    (described,) = fsx.describe_file_systems(FileSystemIds=[fs_id])["FileSystems"]
    assert described["Lifecycle"] == "AVAILABLE"
    assert "DataRepositoryConfiguration" not in described["LustreConfiguration"]  # no legacy, import-only link
    assert endpoints["scratch"]["mount_name"] == described["LustreConfiguration"]["MountName"]
    filters = [{"Name": "file-system-id", "Values": [fs_id]}]
    (association,) = fsx.describe_data_repository_associations(Filters=filters)["Associations"]
    assert (association["FileSystemPath"], association["DataRepositoryPath"], association["Lifecycle"]) == (
        "/", "s3://lus-twin/out", "AVAILABLE")  # fmt: skip
    assert association["S3"]["AutoExportPolicy"]["Events"] == ["NEW", "CHANGED", "DELETED"]
    report = storage.delete_file_systems(efs, fsx, "lustwin", [entry], sleep=quick)
    assert report == [f"deleted fsx_lustre {fs_id} (storage scratch)"]
    assert fsx.describe_data_repository_associations(Filters=filters)["Associations"] == []
