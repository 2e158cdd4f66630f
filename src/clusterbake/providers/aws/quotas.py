"""EC2's vCPU quotas for the whole plan, read before anything is created (Service Quotas).

EC2 counts running On-Demand instances in vCPUs per instance class, and Spot instances per
class too (User Guide, "Amazon EC2 service quotas": "Running On-Demand <class> instances",
"All <class> Spot Instance Requests"); a launch past one fails with VcpuLimitExceeded or
MaxSpotInstanceCountExceeded, typically halfway through a cluster. Here, before the first
create: each planned node not running yet (static and elastic, at max_count) of a class,
plus the vCPUs of the region's running instances of that class (DescribeInstances:
CpuOptions), against the applied quota (GetServiceQuota; a quota never raised answers
NoSuchResourceException, then GetAWSDefaultServiceQuota).

A group in a Capacity Block is left out: clusterbake cannot say from AWS's documents
whether its instances count against the On-Demand quota, and says so. A type whose class
has no known quota is said to be unchecked, never guessed.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from botocore.exceptions import ClientError

from clusterbake.config import ClusterConfig
from clusterbake.errors import ConfigError
from clusterbake.providers.aws.api import call, error_code, paginate
from clusterbake.providers.aws.catalogue import InstanceTypeInfo

SERVICE_CODE = "ec2"
COUNTED_STATES = ("pending", "running")  # the instances a vCPU quota counts
# Instance class (the type's leading letters) -> (On-Demand quota, Spot quota), Service Quotas codes.
QUOTA_CODES: dict[str, tuple[str, str]] = {
    "standard": ("L-1216C47A", "L-34B43A08"),  # A, C, D, H, I, M, R, T, Z
    "f": ("L-74FC7D96", "L-88CF9481"),
    "g": ("L-DB2E81BA", "L-3819A6DF"),  # G and VT
    "p": ("L-417A185B", "L-7212CCBC"),
    "x": ("L-7295265B", "L-E3A00192"),
    "inf": ("L-1945791B", "L-B5D1601B"),
    "trn": ("L-2C3B7624", "L-5480EFD2"),
    "dl": ("L-6E869C2A", "L-85EED4F7"),
}
CLASS_NAMES = {
    "standard": "Standard (A, C, D, H, I, M, R, T, Z)",
    "g": "G and VT",
    "inf": "Inf",
    "trn": "Trn",
    "dl": "DL",
}
STANDARD_LETTERS = set("acdhimrtz")
UNKNOWN_FAMILIES = {"hpc", "mac"}  # quotas of their own (HPC; Mac dedicated hosts), not in the table above


def quota_class(instance_type: str) -> str | None:
    """The quota class of an instance type ("p5.48xlarge" -> "p", "m7i.large" -> "standard"), None
    where no quota is known here (HPC, high memory "u-", mac)."""
    letters = re.match(r"[a-z]+", instance_type.lower())
    family = letters.group(0) if letters else ""
    if family == "vt":
        return "g"
    if family in QUOTA_CODES:
        return family
    if family[:1] in STANDARD_LETTERS and family not in UNKNOWN_FAMILIES:
        return "standard"
    return None


@dataclass
class QuotaNeed:
    code: str
    name: str
    need: int  # vCPUs of the plan's nodes not running yet
    fields: list[str]


def _quota_value(sq, code: str) -> float:
    try:
        return float(call(sq.get_service_quota, ServiceCode=SERVICE_CODE, QuotaCode=code)["Quota"]["Value"])
    except ClientError as exc:
        if error_code(exc) != "NoSuchResourceException":
            raise
    return float(call(sq.get_aws_default_service_quota, ServiceCode=SERVICE_CODE, QuotaCode=code)["Quota"]["Value"])


def _running_vcpus(ec2) -> dict[str, int]:
    """vCPUs of the region's pending and running instances, by quota code."""
    used: dict[str, int] = {}
    filters = [{"Name": "instance-state-name", "Values": list(COUNTED_STATES)}]
    for reservation in paginate(ec2, "describe_instances", "Reservations", Filters=filters, MaxResults=1000):
        for instance in reservation["Instances"]:
            klass = quota_class(instance["InstanceType"])
            if klass is None:
                continue
            cpu = instance.get("CpuOptions") or {}
            vcpus = int(cpu.get("CoreCount", 0)) * int(cpu.get("ThreadsPerCore", 1))
            code = QUOTA_CODES[klass][1 if instance.get("InstanceLifecycle") == "spot" else 0]
            used[code] = used.get(code, 0) + vcpus
    return used


def plan_needs(
    config: ClusterConfig, infos: dict[str, InstanceTypeInfo], running: set[str], blocks: set[str]
) -> tuple[dict[str, QuotaNeed], list[str]]:
    """The vCPUs each quota must still hold for the plan (`running`: names of the cluster's live
    instances; `blocks`: groups in a Capacity Block), and what is not checked, said."""
    needs: dict[str, QuotaNeed] = {}
    unchecked: list[str] = []
    sections = [("head.instance_type", config.head.instance_type, ["head"], False)]
    if config.login_nodes is not None:
        names = config.login_nodes.node_names()
        sections.append(("login_nodes.instance_type", config.login_nodes.instance_type, names, False))
    for index, group in enumerate(config.node_groups):
        field = f"node_groups.{index}.instance_type"
        if group.name in blocks:
            unchecked.append(f"{field}: a Capacity Block's instances (not counted against a vCPU quota here)")
            continue
        names = group.node_names()
        sections.append((field, group.instance_type, names, group.spot))
    for field, instance_type, names, spot in sections:
        missing = [name for name in names if name not in running]
        info = infos.get(instance_type)
        klass = quota_class(instance_type)
        if not missing or info is None:
            continue
        if klass is None:
            unchecked.append(f"{field}: {instance_type} (no vCPU quota known for its class)")
            continue
        code = QUOTA_CODES[klass][1 if spot else 0]
        kind = "All {} Spot Instance Requests" if spot else "Running On-Demand {} instances"
        entry = needs.setdefault(code, QuotaNeed(code, kind.format(CLASS_NAMES.get(klass, klass.upper())), 0, []))
        entry.need += len(missing) * info.vcpus
        entry.fields.append(f"{field}: {len(missing)} x {instance_type}")
    return needs, unchecked


def check(sq, ec2, config: ClusterConfig, infos, running: set[str], blocks: set[str]) -> list[str]:
    """Refuse a plan past an applied quota (ConfigError naming the quota, the need and the request to
    raise it); returns what was not checked."""
    needs, unchecked = plan_needs(config, infos, running, blocks)
    if not needs:
        return unchecked
    used = _running_vcpus(ec2)
    region = config.aws.region
    for code, entry in needs.items():
        value = _quota_value(sq, code)
        in_use = used.get(code, 0)
        if in_use + entry.need > value:
            wanted = in_use + entry.need
            raise ConfigError(
                f'{"; ".join(entry.fields)}: {entry.need} vCPUs of the EC2 quota "{entry.name}" ({code}) '
                f"in {region}, "
                f"which allows {value:g} with {in_use} in use; nothing was created. Raise it (Service Quotas, "
                f"or `aws service-quotas request-service-quota-increase --service-code ec2 --quota-code {code} "
                f"--desired-value {wanted} --region {region}`), or plan fewer nodes"
            )
    return unchecked
