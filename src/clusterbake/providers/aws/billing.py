"""The cost guard of the aws provider: what runs now costs per hour, and what still bills after `down`.

`estimate`: every running (or pending) instance of the cluster at its market: on-demand,
or spot when EC2 says `InstanceLifecycle: spot` (prices.py; unknown prices stay
unknown). Capacity Blocks are paid when reserved, not by the hour: not priced. EBS
volumes, EFS/FSx storage and data transfer are not included, and the estimate says so.

`leftovers`: read-only, after `cluster down`: instances of the cluster in any state but
terminated, EBS volumes tagged for the cluster (launch templates tag them), EFS and
FSx file systems of the cluster (tagged, or named by `file_system_id`) and the
cluster's join-bundle secrets. File systems kept on purpose (`retain: true`, a
`file_system_id`) are listed as such. What cannot be checked (no permission, ...) is
said, not passed over.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

from botocore.exceptions import BotoCoreError, ClientError

from clusterbake.providers.aws import discover, storage, tags
from clusterbake.providers.aws import secrets as join_secrets
from clusterbake.providers.aws.api import paginate
from clusterbake.providers.aws.prices import Price, reason
from clusterbake.providers.base import BillingCheck, CostEstimate, Leftover, MachineCost

RUNNING = ("pending", "running")
NOT_INCLUDED = ["EBS volumes", "EFS/FSx storage", "data transfer"]
VOLUME_GONE = ("deleting", "deleted")
EFS_GONE = ("deleting", "deleted")


def market(instance: dict) -> str:
    """on-demand, spot, capacity-block or scheduled (EC2's InstanceLifecycle; absent: on-demand)."""
    return instance.get("InstanceLifecycle") or "on-demand"


def estimate(
    instances: Iterable[dict],
    on_demand: Callable[[str], Price],
    spot: Callable[[str, str], Price],
    zone: str | None = None,
) -> CostEstimate:
    """The cost of `instances` (DescribeInstances items) per hour; `on_demand(type)` and
    `spot(type, zone)` give prices."""
    machines, stopped = [], 0
    for instance in sorted(instances, key=lambda i: (discover.name_of(i) or "~", i["InstanceId"])):
        if instance["State"]["Name"] not in RUNNING:
            stopped += instance["State"]["Name"] in ("stopping", "stopped")
            continue
        kind, instance_type = market(instance), instance["InstanceType"]
        if kind == "on-demand":
            price = on_demand(instance_type)
        elif kind == "spot":
            price = spot(instance_type, instance.get("Placement", {}).get("AvailabilityZone") or zone or "")
        elif kind == "capacity-block":
            price = Price(None, "unknown: a Capacity Block is paid when it is reserved, not by the hour")
        else:
            price = Price(None, f"unknown: no price for instance lifecycle {kind}")
        machines.append(
            MachineCost(
                node=discover.name_of(instance) or "?",
                instance_id=instance["InstanceId"],
                instance_type=instance_type,
                market=kind,
                usd_per_hour=price.usd_per_hour,
                source=price.source,
            )
        )
    note = f"{stopped} stopped instance(s): no instance hours, their EBS volumes still bill" if stopped else ""
    return CostEstimate(machines=machines, not_included=list(NOT_INCLUDED), note=note)


def _volumes(ec2, cluster: str) -> list[dict]:
    return paginate(ec2, "describe_volumes", "Volumes", Filters=[tags.cluster_filter(cluster)], MaxResults=500)


def _kept_reason(fs: dict, entries: list, kind: str) -> str | None:
    """Why a file system of the cluster is kept on purpose (as storage.delete_file_systems decides), or None."""
    have = tags.as_dict(fs.get("Tags"))
    name = have.get(storage.STORAGE, "?")
    for entry in entries:
        if entry.file_system_id == fs["FileSystemId"]:
            return f"storage {entry.name}: named by file_system_id"
    entry = next((e for e in entries if e.type == kind and e.name == name and not e.file_system_id), None)
    retain = entry.retain if entry is not None else have.get(storage.RETAIN) == "true"
    return f"storage {name}: retain" if retain else None


def leftovers(ec2, efs, fsx, sm, cluster: str, entries: Iterable) -> BillingCheck:
    """What of `cluster` still bills (read-only); `entries`: the config's storage entries."""
    entries = [e for e in entries if getattr(e, "type", None) in storage.TYPES]
    check = BillingCheck()

    def checked(what: str, find: Callable[[], list[Leftover]]) -> None:
        try:
            check.leftovers.extend(find())
        except (ClientError, BotoCoreError) as exc:
            check.unchecked.append(f"{what} ({reason(exc)})")

    def instances() -> list[Leftover]:
        found = discover.cluster_instances(ec2, cluster, states=discover.NOT_GONE)
        return [
            Leftover(
                f"instance {discover.name_of(i) or '?'} ({i['InstanceId']} {i['InstanceType']}, {i['State']['Name']})"
            )
            for i in sorted(found, key=lambda i: i["InstanceId"])
        ]

    def volumes() -> list[Leftover]:
        return [
            Leftover(f"EBS volume {v['VolumeId']} ({v.get('Size', '?')} GiB {v.get('VolumeType', '')}, {v['State']})")
            for v in sorted(_volumes(ec2, cluster), key=lambda v: v["VolumeId"])
            if v["State"] not in VOLUME_GONE
        ]

    def file_systems(kind: str) -> list[Leftover]:
        if kind == "efs":
            label, found, gone = "efs", storage._efs_tagged(efs, cluster), EFS_GONE
            get, state_key = storage._efs_get, "LifeCycleState"
            client = efs
        else:
            label, found, gone = "fsx_lustre", storage._fsx_tagged(fsx, cluster), ("DELETING",)
            get, state_key = storage._fsx_get, "Lifecycle"
            client = fsx
        seen = {fs["FileSystemId"]: fs for fs in found}
        for entry in entries:  # named ones need not carry the cluster's tag
            if entry.type == kind and entry.file_system_id and entry.file_system_id not in seen:
                fs = get(client, entry.file_system_id)
                if fs is not None:
                    seen[fs["FileSystemId"]] = fs
        result = []
        for fs_id, fs in sorted(seen.items()):
            if fs.get(state_key) in gone:
                continue
            kept = _kept_reason(fs, entries, kind)
            what = f"{label} {fs_id}" + (f" ({kept})" if kept else f" ({fs.get(state_key, '?')})")
            result.append(Leftover(what, kept=kept is not None))
        return result

    def secrets() -> list[Leftover]:
        return [Leftover(f"secret {s['Name']}") for s in join_secrets.find(sm, cluster) if not s.get("DeletedDate")]

    checked("instances", instances)
    checked("EBS volumes", volumes)
    checked("EFS file systems", lambda: file_systems("efs"))
    checked("FSx file systems", lambda: file_systems("fsx_lustre"))
    checked("secrets", secrets)
    return check
