"""EC2's vCPU quotas in Service Quotas, which moto 5.2.5 has only for VPC (any other service code
answers NoSuchResourceException, and GetAWSDefaultServiceQuota is not implemented).

- GetAWSDefaultServiceQuota (ec2): AWS's defaults for a new account. The one AWS documents in
  an example is "Running On-Demand Standard (A, C, D, H, I, M, R, T, Z) instances", 5 vCPUs
  (Service Quotas CLI reference); the accelerator classes' 0 is what new accounts report
  (the twin's reading: AWS publishes no table of defaults).
- GetServiceQuota (ec2): the twin account's applied values, an established account's
  (APPLIED: the twin's placeholders, generous enough for every example and test), each
  overridden by the file $MOTO_QUOTAS_FILE ({"L-417A185B": 192}: a test's shortfall); a code
  the file sets to null answers NoSuchResourceException, as AWS answers for a quota never
  raised (the caller then reads the default).

Usage is not tracked here: clusterbake counts the region's running vCPUs itself
(DescribeInstances), as Service Quotas' usage metrics come from CloudWatch.
"""

from __future__ import annotations

import json
import os
from typing import Any

from moto.servicequotas.exceptions import NoSuchResource
from moto.servicequotas.models import ServiceQuotasBackend
from moto.servicequotas.responses import ServiceQuotasResponse

# code -> (name, usage class, AWS default, the twin account's applied value)
EC2_QUOTAS: dict[str, tuple[str, str, float, float]] = {
    "L-1216C47A": ("Running On-Demand Standard (A, C, D, H, I, M, R, T, Z) instances", "Standard/OnDemand", 5, 1152),
    "L-34B43A08": ("All Standard (A, C, D, H, I, M, R, T, Z) Spot Instance Requests", "Standard/Spot", 5, 1152),
    "L-DB2E81BA": ("Running On-Demand G and VT instances", "G/OnDemand", 0, 768),
    "L-3819A6DF": ("All G and VT Spot Instance Requests", "G/Spot", 0, 768),
    "L-417A185B": ("Running On-Demand P instances", "P/OnDemand", 0, 1536),
    "L-7212CCBC": ("All P Spot Instance Requests", "P/Spot", 0, 1536),
    "L-74FC7D96": ("Running On-Demand F instances", "F/OnDemand", 0, 128),
    "L-88CF9481": ("All F Spot Instance Requests", "F/Spot", 0, 128),
    "L-7295265B": ("Running On-Demand X instances", "X/OnDemand", 0, 128),
    "L-E3A00192": ("All X Spot Instance Requests", "X/Spot", 0, 128),
    "L-1945791B": ("Running On-Demand Inf instances", "Inf/OnDemand", 0, 128),
    "L-B5D1601B": ("All Inf Spot Instance Requests", "Inf/Spot", 0, 128),
    "L-2C3B7624": ("Running On-Demand Trn instances", "Trn/OnDemand", 0, 512),
    "L-5480EFD2": ("All Trn Spot Instance Requests", "Trn/Spot", 0, 512),
    "L-6E869C2A": ("Running On-Demand DL instances", "DL/OnDemand", 0, 96),
    "L-85EED4F7": ("All DL Spot Instance Requests", "DL/Spot", 0, 96),
}
_moto_get_service_quota = ServiceQuotasBackend.get_service_quota


def _quota(backend: ServiceQuotasBackend, code: str, value: float) -> dict[str, Any]:
    name, usage_class, _, _ = EC2_QUOTAS[code]
    return {
        "ServiceCode": "ec2",
        "ServiceName": "Amazon Elastic Compute Cloud (Amazon EC2)",
        "QuotaArn": f"arn:aws:servicequotas:{backend.region_name}:{backend.account_id}:ec2/{code}",
        "QuotaCode": code,
        "QuotaName": name,
        "Value": float(value),
        "Unit": "None",
        "Adjustable": True,
        "GlobalQuota": False,
        "UsageMetric": {
            "MetricNamespace": "AWS/Usage",
            "MetricName": "ResourceCount",
            "MetricDimensions": {"Class": usage_class, "Resource": "vCPU", "Service": "EC2", "Type": "Resource"},
            "MetricStatisticRecommendation": "Maximum",
        },
    }


def _applied() -> dict[str, float | None]:
    values: dict[str, float | None] = {code: entry[3] for code, entry in EC2_QUOTAS.items()}
    path = os.environ.get("MOTO_QUOTAS_FILE")
    if path and os.path.exists(path):
        with open(path) as source:
            values.update(json.load(source))
    return values


def get_service_quota(self: ServiceQuotasBackend, service_code: str, quota_code: str) -> dict[str, Any]:
    if service_code != "ec2":
        return _moto_get_service_quota(self, service_code, quota_code)
    value = _applied().get(quota_code)
    if quota_code not in EC2_QUOTAS or value is None:
        raise NoSuchResource
    return _quota(self, quota_code, value)


def get_aws_default_service_quota(self: ServiceQuotasResponse) -> str:
    params = json.loads(self.body)
    code = str(params.get("QuotaCode"))
    if params.get("ServiceCode") != "ec2" or code not in EC2_QUOTAS:
        raise NoSuchResource
    return json.dumps({"Quota": _quota(self.backend, code, EC2_QUOTAS[code][2])})


PATCHES = {
    ServiceQuotasBackend: {"get_service_quota": get_service_quota},
    ServiceQuotasResponse: {"get_aws_default_service_quota": get_aws_default_service_quota},
}
