"""What the EC2 twin adds to moto 5.2.5 so that it behaves like EC2 where clusterbake relies on it.

`install()` patches moto's response classes in this process; both the twin
(`clusterbake twin up aws`) and the aws tests' moto_server (tests/aws/moto_ec2_server.py)
call it. Everything else is moto's own server and backends. Each addition is a gap
seen in moto 5.2.5 against EC2's documented behaviour:

- Placement groups: moto answers CreatePlacementGroup, DescribePlacementGroups and
  DeletePlacementGroup with "not implemented" (HTTP 500). A minimal in-memory version
  (name, strategy, state, tags; filters group-name and tag:KEY). Request and response
  shapes go through botocore's EC2 model (moto parses and serializes with it).
- Launch templates: RunInstances with a launch template takes only the template's
  AMI, type, key, security groups, user data and tags in moto; EC2 also applies its
  network interfaces (the subnet!), IAM instance profile, metadata options, market
  options and placement. Those template settings are applied here wherever the
  request does not set them itself, as EC2 does.
- The AMI's ImdsSupport: moto ignores RegisterImage's ImdsSupport. EC2 launches an instance of
  an AMI registered with ImdsSupport v2.0 (ours: packer/plugins) with HttpTokens=required and
  HttpPutResponseHopLimit=2 unless the launch (or its template) sets them; moto uses 1. Here
  such AMIs are remembered and their instances get EC2's defaults, so a launch that leaves
  the hop limit out lets a container one hop behind the node get a token, as on EC2.
- Capacity: EC2 fails RunInstances with InsufficientInstanceCapacity when a zone has no
  capacity for a type (or another capacity code: a vCPU quota, a type not offered, ...);
  moto never does. When the file named by $MOTO_CAPACITY_FILE exists ({"p5.48xlarge": 1},
  or {"p5.48xlarge": {"count": 1, "code": "VcpuLimitExceeded"}}), RunInstances fails with
  that error once the number of non-terminated instances of the type would exceed the
  limit, with EC2's message for the code (CAPACITY_MESSAGES).
- FSx for Lustre: lifecycle, MountName, data repository associations and their export,
  legacy linking import-only; fsx.py.
- EBS keys: the account's default key, a snapshot's key, an AMI's own snapshots; ebs_keys.py.
- Subnet addresses: EC2's choice of a free address in no order, tags of CIDR reservations;
  subnets.py says how.
- IAM's eventual consistency: a new instance profile refused by EC2 and a new role's
  credentials not served for a few seconds; iam_spread.py says how.
- Secrets Manager's names and keys: a force-deleted name held a while, KmsKeyId as AWS
  describes it; secret_store.py says how.
- A record of the calls served (service, action, caller's access key id) in $MOTO_CALLS_FILE, when
  set: what an operator's policy must allow (clusterbake permissions).
- EC2's vCPU quotas in Service Quotas (applied and default values, a test's shortfall from
  $MOTO_QUOTAS_FILE): service_quotas.py.
- Capacity reservations and Capacity Blocks: moto has none and launches into any reservation
  id; reservations.py has EC2's (its own docstring says what it checks).
- Addresses in use: EC2 refuses RunInstances with InvalidIPAddress.InUse when a requested
  private address is held by any network interface (an instance's, an EFS mount target's,
  any other); moto gives one address to two. A terminated instance's interface is released
  only after the instance finished shutting down, minutes for a large one; moto frees the
  address at once. Here it stays held for $MOTO_ADDRESS_HOLD seconds (default 5) after
  TerminateInstances.
- IAM resources of EC2 calls: with IAM authorization on, moto checks every EC2 call against
  resource `*`, so a policy that names ARNs (the head role's, iam.py) would deny
  everything. Here RunInstances is checked against each resource EC2 checks that the
  request names: `instance/*`, `volume/*` and `network-interface/*`, the launch template, the
  subnet and security groups of its interfaces, the image (the template's, unless the request
  names one), its key pair, placement group, capacity reservation and (Spot)
  `spot-instances-request/*`, and ec2:CreateTags on each kind of resource it tags as it creates
  it (its TagSpecifications and its template's, key ec2:CreateAction); and, when
  an instance profile comes with it (request or template), `iam:PassRole` of the
  profile's role, which EC2 checks and moto does not; TerminateInstances and CreateTags
  against each instance (and interface, volume) they name. Other EC2 calls stay checked
  against `*`.
- Conditions of EC2 calls: moto evaluates none (a condition never denies there; AWS denies
  when a condition does not hold). For the EC2 calls above every statement is evaluated again
  with its conditions: operators String/Arn Equals, NotEquals, Like, NotLike (and IfExists),
  Bool; keys ec2:LaunchTemplate (the template's ARN, when the launch names one),
  ec2:CreateAction (tags put on at launch), kms:ViaService and kms:GrantIsForAWSResource (a
  customer managed key EC2 uses for the launch's volumes, ebs_keys.py),
  ec2:InstanceType (on the instance resource: the request's type, else the template's),
  ec2:ResourceTag/<key> (TerminateInstances and CreateTags: the instance's tags). A key the
  request does not have fails its condition, as on AWS (IfExists: holds); an operator not
  listed denies. Secrets Manager calls likewise, with the key secretsmanager:VersionStage
  (the stage the request names; a request that names none, or only a VersionId, has none).
- IAM resources of Secrets Manager calls: with IAM authorization on, moto checks every
  Secrets Manager call against resource `*`, so a policy that names secret ARNs (the
  only kind clusterbake writes) would deny everything. The resource is the secret's
  ARN here (for a secret that does not exist yet, its ARN without the random suffix).
- Session policies: moto keeps AssumeRole's `Policy` and never applies it. AWS grants a
  session the intersection of its role's policies and the session policy: here a call with
  such a session's credentials must also be allowed by its session policy (actions and
  resources; conditions, as everywhere in moto, are not evaluated).
- Role principals in trust policies: moto compares the caller's ARN with the trust policy's
  principal as strings, so a role ARN never matches a session of that role
  (`arn:aws:sts::<account>:assumed-role/<name>/<session>`), which on AWS it does: a role
  that trusts another role is assumable from that role's sessions (the jobs role, from the
  nodes' sessions of the node role).
- The Spot service-linked role: moto launches Spot instances in any account. EC2 needs
  AWSServiceRoleForEC2Spot; at an account's first Spot launch it creates the role for a
  caller allowed iam:CreateServiceLinkedRole and refuses anyone else with
  AuthFailure.ServiceLinkedRoleCreationNotPermitted (403). Here likewise (with IAM
  authorization off every caller may). moto also names the role AWSServiceRoleForspot and
  answers a second CreateServiceLinkedRole with EntityAlreadyExists; IAM's names are
  AWSServiceRoleForEC2Spot and InvalidInput ("... has been taken in this account").
- One-time Spot: moto stops any instance. EC2 refuses StopInstances for a Spot instance of a
  one-time request (RunInstances' default, and clusterbake's) with UnsupportedOperation
  ("You can only stop Spot Instances associated with persistent Spot Instance requests").
- Faults: moto never throttles, never fails on its side and never drops a connection; EC2 does
  all three. When the file named by $MOTO_FAULTS_FILE exists ({"DescribeInstances":
  {"fault": "InternalError", "times": 2}}), the next `times` calls of that action (of any
  service) get the fault: RequestLimitExceeded (HTTP 503), InternalError (500), Unavailable
  (503), each in the service's own error format, or `drop`: the connection is closed before
  any answer (botocore: ConnectionClosedError). Each fault used is counted down in the file.
  The action `*` stands for every action: the first `times` calls of each one get the fault.
- Console output: moto answers GetConsoleOutput with the same sample text for every instance.
  Here it is the node's own console (what its boot wrote to /dev/console, the last 64 KiB, as
  EC2 keeps), from `CONSOLE_LOG(instance_id)` (the twin's daemon sets it), and nothing before
  the node booted.
- Signatures of bodyless REST calls: to check a request's signature moto rebuilds it
  with `data=body or data`, and for a GET without a body (EFS DescribeFileSystems,
  DescribeMountTargets) its `data` holds the request's headers, which become a body
  that was never signed: every such call fails with SignatureDoesNotMatch. Such a
  request is rebuilt with an empty body here, as it was sent.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import socket
import threading
import time
import uuid
from collections.abc import Callable
from pathlib import Path

from moto.core.exceptions import AccessDeniedError, ServiceException
from moto.core.responses import ActionResult, BaseResponse, EmptyResult
from moto.ec2.exceptions import EC2ClientError
from moto.ec2.responses import EC2Response
from moto.iam import models as iam_models
from moto.iam.access_control import (
    AssumedRoleAccessKey,
    IAMPolicy,
    IAMPolicyStatement,
    IAMRequest,
    IAMRequestBase,
    PermissionResult,
)
from moto.iam.exceptions import InvalidInput
from moto.iam.responses import IamResponse
from moto.secretsmanager.responses import SecretsManagerResponse

from clusterbake.twins.aws import (
    ebs_keys,
    fsx,
    iam_spread,
    reservations,
    secret_store,
    service_quotas,
    subnets,
    topology,
)
from clusterbake.twins.aws.filters import matches

_PLACEMENT_GROUPS: dict[tuple[str, str], dict[str, dict]] = {}
# RunInstances parameters a launch template may set and moto does not apply.
TEMPLATE_KEYS = (
    "NetworkInterfaces",
    "IamInstanceProfile",
    "MetadataOptions",
    "InstanceMarketOptions",
    "Placement",
    "CapacityReservationSpecification",
)


def _groups(response: EC2Response) -> dict[str, dict]:
    return _PLACEMENT_GROUPS.setdefault((response.current_account, response.region), {})


def create_placement_group(self: EC2Response) -> ActionResult:
    name = self._get_param("GroupName")
    groups = _groups(self)
    if name in groups:
        raise EC2ClientError("InvalidPlacementGroup.Duplicate", f"The placement group '{name}' already exists.")
    tags = self._parse_tag_specification().get("placement-group", {})
    group = {
        "GroupName": name,
        "GroupId": f"pg-{uuid.uuid4().hex[:17]}",
        "Strategy": self._get_param("Strategy") or "cluster",
        "State": "available",
        "Tags": [{"Key": k, "Value": v} for k, v in tags.items()],
    }
    groups[name] = group
    return ActionResult({"PlacementGroup": group})


def describe_placement_groups(self: EC2Response) -> ActionResult:
    names = self._get_param("GroupNames", [])
    filters = self._filters_from_querystring()
    found = []
    for group in _groups(self).values():
        if names and group["GroupName"] not in names:
            continue
        if matches(group, filters, {"group-name": "GroupName"}):
            found.append(group)
    missing = set(names) - {g["GroupName"] for g in found}
    if missing:
        raise EC2ClientError("InvalidPlacementGroup.Unknown", f"The Placement Group '{min(missing)}' is unknown.")
    return ActionResult({"PlacementGroups": found})


def delete_placement_group(self: EC2Response) -> ActionResult:
    name = self._get_param("GroupName")
    if _groups(self).pop(name, None) is None:
        raise EC2ClientError("InvalidPlacementGroup.Unknown", f"The Placement Group '{name}' is unknown.")
    return EmptyResult()


def _apply_launch_template(response: EC2Response) -> None:
    template = response._get_param("LaunchTemplate", {})
    if not template:
        return
    data = response.ec2_backend._get_template_from_args(template).data
    for key in TEMPLATE_KEYS:
        if data.get(key) and not response._get_param(key):
            response.params[key] = data[key]
    if response._get_param("SubnetId") and response.params.get("NetworkInterfaces") is data.get("NetworkInterfaces"):
        # A request-level subnet replaces the template's interfaces (EC2 refuses both in one request).
        response.params.pop("NetworkInterfaces")


# EC2's capacity errors of RunInstances (API reference, "Error codes": errors-overview), with
# EC2's words; a limit of the capacity file names one (default InsufficientInstanceCapacity).
CAPACITY_MESSAGES = {
    "InsufficientInstanceCapacity": "We currently do not have sufficient {type} capacity in the Availability Zone "
    "you requested. Our system will be working on provisioning additional capacity.",
    "InsufficientCapacity": "There is not enough capacity to fulfill your request for {type}.",
    "InsufficientHostCapacity": "There is not enough capacity to fulfill your Dedicated Host request for {type}.",
    "InsufficientReservedInstanceCapacity": "There is not enough capacity to fulfill your Reserved Instance "
    "request for {type}.",
    "ReservationCapacityExceeded": "The requested number of {type} instances exceeds the available capacity of the "
    "targeted Capacity Reservation.",
    "VcpuLimitExceeded": "You have requested more vCPU capacity than your current vCPU limit allows for the "
    "instance bucket that the specified instance type ({type}) belongs to. Please visit "
    "http://aws.amazon.com/contact-us/ec2-request to request an adjustment to this limit.",
    "InstanceLimitExceeded": "You have requested more instances than your current instance limit allows for the "
    "specified instance type ({type}).",
    "Unsupported": "Your requested instance type ({type}) is not supported in your requested Availability Zone.",
    "UnfulfillableCapacity": "There is no Spot capacity available that matches your request for {type}.",
    "MaxSpotInstanceCountExceeded": "Max spot instance count exceeded",
    "SpotMaxPriceTooLow": "Your Spot request price is lower than the minimum required Spot request fulfillment "
    "price for {type}.",
}


def capacity_limit(value) -> tuple[int, str]:
    """(count, error code) of one entry of the capacity file: a count, or {"count", "code"}."""
    if isinstance(value, dict):
        count, code = value.get("count"), value.get("code", "InsufficientInstanceCapacity")
    else:
        count, code = value, "InsufficientInstanceCapacity"
    if not isinstance(count, int) or isinstance(count, bool) or count < 0 or code not in CAPACITY_MESSAGES:
        codes = ", ".join(sorted(CAPACITY_MESSAGES))
        raise ValueError(f'capacity: expected a count >= 0 or {{"count": N, "code": one of {codes}}}')
    return count, code


def _instance_type(response: EC2Response) -> str | None:
    """The request's instance type, else its launch template's."""
    instance_type = response._get_param("InstanceType")
    template = response._get_param("LaunchTemplate", {})
    if not instance_type and template:
        instance_type = response.ec2_backend._get_template_from_args(template).data.get("InstanceType")
    return instance_type


def _check_capacity(response: EC2Response) -> None:
    path = os.environ.get("MOTO_CAPACITY_FILE")
    if not path or not os.path.exists(path):
        return
    with open(path) as handle:
        limits = json.load(handle)
    instance_type = _instance_type(response)
    if instance_type not in limits or response._get_param("CapacityReservationSpecification"):
        return  # a reservation's capacity is its own (reservations.py)
    count = int(response._get_param("MinCount", if_none="1"))
    used = sum(
        1
        for reservation in response.ec2_backend.all_reservations()
        for instance in reservation.instances
        if instance.instance_type == instance_type and instance.state != "terminated"
    )
    limit, code = capacity_limit(limits[instance_type])
    if used + count > limit:
        raise EC2ClientError(code, CAPACITY_MESSAGES[code].format(type=instance_type))


def _requested_addresses(response: EC2Response) -> list[str]:
    addresses = [response._get_param("PrivateIpAddress")]
    for interface in response._get_param("NetworkInterfaces", []) or []:
        addresses.append(interface.get("PrivateIpAddress"))
        addresses += [a.get("PrivateIpAddress") for a in interface.get("PrivateIpAddresses", []) or []]
    return [a for a in addresses if a]


def _held_addresses(response: EC2Response) -> set[str]:
    """Every address a network interface holds, and those of instances terminated moments ago."""
    backend = response.ec2_backend
    held = set()
    for interface in backend.describe_network_interfaces():
        if interface.instance is not None and interface.instance.state == "terminated":
            continue  # its instance's hold (below) says
        held |= {interface.private_ip_address, *(a.get("PrivateIpAddress") for a in interface.private_ip_addresses)}
    for reservation in backend.all_reservations():
        for instance in reservation.instances:
            if subnets.holds_its_place(instance):
                held.add(instance.private_ip)
    return held - {None}


def _check_addresses(response: EC2Response) -> None:
    wanted = set(_requested_addresses(response))
    if not wanted:
        return
    for address in sorted(wanted & _held_addresses(response)):
        raise EC2ClientError("InvalidIPAddress.InUse", f"Address {address} is in use.")


_terminate_instances = EC2Response.terminate_instances


def terminate_instances(self: EC2Response) -> ActionResult:
    """Terminated now, as moto does, with the time: the address stays held for a while (subnets.holds_its_place)."""
    result = _terminate_instances(self)
    now = time.monotonic()
    for instance_id in self._get_param("InstanceIds", []) or []:
        with contextlib.suppress(Exception):
            self.ec2_backend.get_instance(instance_id).terminated_at = now
    return result


_run_instances = EC2Response.run_instances


def run_instances(self: EC2Response) -> ActionResult:
    _check_capacity(self)
    _apply_launch_template(self)
    iam_spread.check_profile(self)
    _apply_imds_support(self)
    _check_addresses(self)
    market = self._get_param("InstanceMarketOptions.MarketType")
    reservation_id = reservations.check_run_instances(self, _instance_type(self))
    if market == "spot":
        _check_spot_role(self)
    result = _run_instances(self)
    reservations.mark_launched(result.result.instances, reservation_id, market)
    if not _may_use_volume_keys(self, result.result.instances):
        ebs_keys.fail_launch(result.result.instances)
    if market == "spot":
        kind = self._get_param("InstanceMarketOptions.SpotOptions.SpotInstanceType") or "one-time"
        for instance in result.result.instances:
            instance.spot_instance_type = kind
    return result


# The faults a test may inject (FAULTS file): HTTP status, EC2's code and words.
FAULTS = {
    "RequestLimitExceeded": (503, "Request limit exceeded."),
    "InternalError": (500, "An internal error has occurred."),
    "Unavailable": (503, "The server is overloaded and can't handle the request."),
    "drop": (0, "the connection is closed before any answer"),
}
_FAULTS_LOCK = threading.Lock()


def check_faults(faults) -> dict:
    """The faults file's content, checked: {action: {"fault": one of FAULTS, "times": N >= 1}}; `*` (every
    action) may name several, {"faults": [...]}, taken in turn by the actions in the order they are first
    called."""
    if not isinstance(faults, dict):
        raise ValueError('faults: expected {"Action": {"fault": ..., "times": N}, ...}')
    for action, fault in faults.items():
        kinds = fault.get("faults") if action == "*" and isinstance(fault, dict) else None
        kinds = (
            kinds if isinstance(kinds, list) and kinds else [fault.get("fault") if isinstance(fault, dict) else None]
        )
        if (
            not isinstance(fault, dict)
            or any(kind not in FAULTS for kind in kinds)
            or not isinstance(fault.get("times"), int)
            or fault["times"] < 1
        ):
            raise ValueError(f'faults.{action}: expected {{"fault": one of {", ".join(FAULTS)}, "times": N >= 1}}')
    return faults


def _take_fault(action: str) -> str | None:
    """The fault the next call of `action` gets (None: none), counted down in the faults file (for `*`:
    per action, in its `seen` counts)."""
    path = os.environ.get("MOTO_FAULTS_FILE")
    if not path:
        return None
    with _FAULTS_LOCK:
        try:
            with open(path) as handle:
                faults = json.load(handle)
        except (OSError, ValueError):
            return None
        fault = faults.get(action)
        if isinstance(fault, dict) and fault.get("times", 0) >= 1:
            fault["times"] -= 1
            if fault["times"] == 0:
                del faults[action]
        elif isinstance(every := faults.get("*"), dict):
            seen = every.setdefault("seen", {})
            if seen.get(action, 0) >= every.get("times", 0):
                return None
            seen[action] = seen.get(action, 0) + 1
            kinds = every.get("faults") or [every["fault"]]
            fault = {"fault": kinds[list(seen).index(action) % len(kinds)]}
        else:
            return None
        tmp = f"{path}.{os.getpid()}.tmp"
        with open(tmp, "w") as handle:
            json.dump(faults, handle)
        os.replace(tmp, path)
    return fault["fault"]


class InjectedFault(ServiceException):
    """A fault's error, in the format of the service called (defined outside moto's packages, whose
    exceptions moto looks up in the service their module names)."""


_call_action = BaseResponse.call_action


def _record_call(response: BaseResponse) -> None:
    """One line per call into $MOTO_CALLS_FILE, when set: service, action and the caller's access key id
    (the calls an operator's permissions must allow: tests/aws/test_permissions.py)."""
    path = os.environ.get("MOTO_CALLS_FILE")
    if not path:
        return
    found = re.search(r"Credential=([^/,\s]+)/", response.headers.get("Authorization", ""))
    line = {"service": response.service_name, "action": response._get_action(), "key": found[1] if found else ""}
    with open(path, "a") as calls:
        calls.write(json.dumps(line) + "\n")


def call_action(self: BaseResponse):
    _record_call(self)
    fault = _take_fault(self._get_action())
    if fault is None:
        return _call_action(self)
    if fault == "drop":
        connection = getattr(self.normalized_request, "environ", {}).get("werkzeug.socket")
        if connection is not None:
            with contextlib.suppress(OSError):
                connection.shutdown(socket.SHUT_RDWR)
        return 500, {}, ""  # nobody reads it
    status, message = FAULTS[fault]
    _, headers, body = self.serialized(ActionResult(InjectedFault(fault, message)))
    return status, headers, body


SPOT_SERVICE = "spot.amazonaws.com"
SPOT_ROLE = "AWSServiceRoleForEC2Spot"


class _ServiceLinkedRoleRequest(IAMRequest):
    """An IAM check of iam:CreateServiceLinkedRole on behalf of the EC2 call being made."""

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self._action = "iam:CreateServiceLinkedRole"


def _check_spot_role(response: EC2Response) -> None:
    """A Spot launch needs AWSServiceRoleForEC2Spot: made for a caller who may make it, else refused."""
    iam = iam_models.iam_backends[response.current_account][response.partition]
    if any(role.name == SPOT_ROLE for role in iam.roles.values()):
        return
    arn = f"arn:{response.partition}:iam::{response.current_account}:role/aws-service-role/{SPOT_SERVICE}/{SPOT_ROLE}"
    try:
        response._authenticate_and_authorize_action(_ServiceLinkedRoleRequest, arn)
    except AccessDeniedError:
        raise EC2ClientError(
            "AuthFailure.ServiceLinkedRoleCreationNotPermitted",
            "The provided credentials do not have permission to create the service-linked role for EC2 Spot Instances.",
        ) from None
    iam.create_service_linked_role(SPOT_SERVICE, "Default EC2 Spot Service Linked Role", "")


_create_service_linked_role = iam_models.IAMBackend.create_service_linked_role


def create_service_linked_role(self, service_name: str, description: str, suffix: str):
    """IAM's answer to a service-linked role that exists: InvalidInput, not EntityAlreadyExists."""
    if service_name == SPOT_SERVICE and not suffix and any(role.name == SPOT_ROLE for role in self.roles.values()):
        raise InvalidInput(
            f"Service role name {SPOT_ROLE} has been taken in this account, please try a different suffix."
        )
    return _create_service_linked_role(self, service_name, description, suffix)


_stop_instances = EC2Response.stop_instances


def stop_instances(self: EC2Response) -> ActionResult:
    for instance_id in self._get_param("InstanceIds", []) or []:
        instance = self.ec2_backend.get_instance(instance_id)
        if instance.lifecycle == "spot" and getattr(instance, "spot_instance_type", "one-time") != "persistent":
            raise EC2ClientError(
                "UnsupportedOperation",
                f"You can't stop the Spot Instance '{instance_id}' because it is associated with a one-time Spot "
                "Instance request. You can only stop Spot Instances associated with persistent Spot Instance requests.",
            )
    return _stop_instances(self)


# The twin's daemon: instance id -> the node's console log (None: not a node of the twin).
CONSOLE_LOG: Callable[[str], Path | None] = lambda instance_id: None  # noqa: E731
CONSOLE_BYTES = 64 * 1024  # what EC2 keeps of an instance's console


def get_console_output(self: EC2Response) -> ActionResult:
    from moto.core.utils import utcnow
    from moto.ec2.utils import Base64EncodedString

    instance = self.ec2_backend.get_instance(self._get_param("InstanceId"))
    path = CONSOLE_LOG(instance.id)
    try:
        with open(path, "rb") as handle:  # type: ignore[arg-type]
            handle.seek(max(0, os.fstat(handle.fileno()).st_size - CONSOLE_BYTES))
            text = handle.read().decode(errors="replace")
    except (OSError, TypeError):
        text = ""
    result = {"InstanceId": instance.id, "Timestamp": utcnow()}
    if text:
        result["Output"] = Base64EncodedString.from_raw_string(text)
    return ActionResult(result)


_IMDS_V2_IMAGES: set[str] = set()  # AMIs registered with ImdsSupport v2.0
_register_image = EC2Response.register_image


def register_image(self: EC2Response) -> ActionResult:
    result = _register_image(self)
    ebs_keys.use_requested_root_snapshot(self, result.result["ImageId"])
    if self._get_param("ImdsSupport") == "v2.0":
        _IMDS_V2_IMAGES.add(result.result["ImageId"])
    return result


def _apply_imds_support(response: EC2Response) -> None:
    """EC2's metadata defaults for an AMI registered with ImdsSupport v2.0 (moto: tokens optional, hop 1)."""
    if response._get_param("ImageId") not in _IMDS_V2_IMAGES:
        return
    options = dict(response._get_param("MetadataOptions") or {})
    options.setdefault("HttpTokens", "required")
    options.setdefault("HttpPutResponseHopLimit", 2)
    response.params["MetadataOptions"] = options


# --- IAM resources of EC2 calls -------------------------------------------------------

_RESOURCE_PREFIXES = {"i-": "instance", "eni-": "network-interface", "vol-": "volume", "sir-": "spot-instances-request"}


def _ec2_arn(response: EC2Response, kind: str, resource_id: str) -> str:
    if kind == "image":
        return f"arn:aws:ec2:{response.region}::image/{resource_id}"
    return f"arn:aws:ec2:{response.region}:{response.current_account}:{kind}/{resource_id}"


def _run_instances_resources(response: EC2Response) -> list[str]:
    template_ref = response._get_param("LaunchTemplate", {}) or {}
    data: dict = {}
    resources = [_ec2_arn(response, "instance", "*")]
    if template_ref:
        version = response.ec2_backend._get_template_from_args(template_ref)
        data = version.data
        resources.append(_ec2_arn(response, "launch-template", version.template.id))
    interfaces = response._get_param("NetworkInterfaces", []) or data.get("NetworkInterfaces", []) or []
    subnets = {response._get_param("SubnetId")} | {i.get("SubnetId") for i in interfaces}
    groups = set(response._get_param("SecurityGroupIds", []) or data.get("SecurityGroupIds", []) or [])
    for interface in interfaces:
        groups |= set(interface.get("Groups", []) or interface.get("SecurityGroupIds", []) or [])
    resources += [_ec2_arn(response, "subnet", s) for s in sorted(subnets - {None})]
    resources += [_ec2_arn(response, "security-group", g) for g in sorted(groups)]
    image = response._get_param("ImageId") or data.get("ImageId")
    if image:
        resources.append(_ec2_arn(response, "image", image))
    # What every launch creates, and what the request (or its template) names besides (the EC2 API
    # reference's RunInstances resource types).
    resources += [_ec2_arn(response, "volume", "*"), _ec2_arn(response, "network-interface", "*")]
    key = response._get_param("KeyName") or data.get("KeyName")
    if key:
        resources.append(_ec2_arn(response, "key-pair", key))
    group = response._get_param("Placement.GroupName") or (data.get("Placement") or {}).get("GroupName")
    if group:
        resources.append(_ec2_arn(response, "placement-group", group))
    if (response._get_param("InstanceMarketOptions.MarketType") or "") == "spot":
        resources.append(_ec2_arn(response, "spot-instances-request", "*"))
    target = response._get_param("CapacityReservationSpecification.CapacityReservationTarget") or {}
    if target.get("CapacityReservationId"):
        resources.append(_ec2_arn(response, "capacity-reservation", target["CapacityReservationId"]))
    return resources


LAUNCH_TAGGED = {"instance", "volume", "network-interface", "spot-instances-request", "elastic-gpu"}


def _tagged_at_launch(response: EC2Response) -> list[str]:
    """The resources a RunInstances tags as it creates them (its TagSpecifications and its template's):
    each needs ec2:CreateTags with ec2:CreateAction RunInstances."""
    kinds = {spec.get("ResourceType") for spec in response._get_param("TagSpecifications", []) or []}
    template_ref = response._get_param("LaunchTemplate", {}) or {}
    if template_ref:
        data = response.ec2_backend._get_template_from_args(template_ref).data
        kinds |= {spec.get("ResourceType") for spec in data.get("TagSpecifications", []) or []}
    # Only what RunInstances creates: moto keeps CreateLaunchTemplate's own tags (resource type
    # launch-template) in the template's data, which EC2 does not apply at launch.
    return [_ec2_arn(response, kind, "*") for kind in sorted(kinds & LAUNCH_TAGGED)]


def _ec2_resources(response: EC2Response) -> list[str]:
    action = response._get_action()
    if action == "RunInstances":
        return _run_instances_resources(response)
    if action == "TerminateInstances":
        return [_ec2_arn(response, "instance", i) for i in response._get_param("InstanceIds", []) or []] or ["*"]
    if action == "CreateTags":
        named = []
        for resource_id in response._get_param("Resources", []) or []:
            kind = next((k for p, k in _RESOURCE_PREFIXES.items() if resource_id.startswith(p)), None)
            named.append(_ec2_arn(response, kind, resource_id) if kind else "*")
        return named or ["*"]
    return ["*"]


def _passed_role(response: EC2Response) -> str | None:
    """The ARN of the role an instance profile of this RunInstances passes to EC2 (None: none)."""
    if response._get_action() != "RunInstances":
        return None
    profile = response._get_param("IamInstanceProfile", {}) or {}
    template_ref = response._get_param("LaunchTemplate", {}) or {}
    if not profile and template_ref:
        profile = response.ec2_backend._get_template_from_args(template_ref).data.get("IamInstanceProfile") or {}
    found = iam_spread.named_profile(response, profile) if profile else None
    return found.roles[0].arn if found is not None and found.roles else None


class _PassRoleRequest(IAMRequest):
    """An IAM check of iam:PassRole on behalf of the EC2 call being made."""

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self._action = "iam:PassRole"


def authorize_ec2(self: EC2Response, resource: str = "*") -> None:
    _CALL.response, _CALL.also = self, None
    try:
        for each in _ec2_resources(self):
            self._authenticate_and_authorize_action(_ConditionedRequest, each)
        if self._get_action() == "RunInstances":
            _CALL.also = "ec2:CreateTags"
            for each in _tagged_at_launch(self):
                self._authenticate_and_authorize_action(_AlsoRequest, each)
    finally:
        _CALL.response, _CALL.also = None, None
    role = _passed_role(self)
    if role:
        self._authenticate_and_authorize_action(_PassRoleRequest, role)


_CALL = threading.local()  # the EC2 or Secrets Manager call being authorized (its request gives the conditions' keys)


def _condition_context(response: EC2Response | SecretsManagerResponse, resource: str) -> dict[str, list[str]]:
    """The condition keys of one resource of an EC2 or Secrets Manager call, as AWS sets them."""
    context: dict[str, list[str]] = {}
    if ":kms:" in resource and ":key/" in resource:  # a key EC2 uses for the caller (_may_use_volume_keys)
        return {"kms:ViaService": [f"ec2.{response.region}.amazonaws.com"], "kms:GrantIsForAWSResource": ["true"]}
    if isinstance(response, SecretsManagerResponse):
        stage = response._get_param("VersionStage")  # the stage the request names; none when it names none
        return {"secretsmanager:VersionStage": [stage]} if stage else context
    kind_and_id = resource.rsplit(":", 1)[-1]
    if getattr(_CALL, "also", None) == "ec2:CreateTags":  # tags a launch puts on what it creates
        return {"ec2:CreateAction": [response._get_action()]}
    if response._get_action() == "RunInstances":
        template_ref = response._get_param("LaunchTemplate", {}) or {}
        data: dict = {}
        if template_ref:
            version = response.ec2_backend._get_template_from_args(template_ref)
            data = version.data
            context["ec2:LaunchTemplate"] = [_ec2_arn(response, "launch-template", version.template.id)]
        if kind_and_id.startswith("instance/"):
            instance_type = response._get_param("InstanceType") or data.get("InstanceType")
            if instance_type:
                context["ec2:InstanceType"] = [instance_type]
    elif kind_and_id.startswith("instance/i-"):
        try:
            instance = response.ec2_backend.get_instance(kind_and_id.removeprefix("instance/"))
        except Exception:
            return context  # EC2 answers an unknown instance itself
        for tag in instance.get_tags():
            context[f"ec2:ResourceTag/{tag['key']}"] = [tag["value"]]
    return context


def _holds(operator: str, expected, values: list[str] | None) -> bool:
    if_exists = operator.endswith("IfExists")
    operator = operator.removesuffix("IfExists")
    if values is None:
        return if_exists
    wanted = [str(v) for v in (expected if isinstance(expected, list) else [expected])]
    like = lambda pattern, value: re.fullmatch(re.escape(pattern).replace(r"\*", ".*").replace(r"\?", "."), value)  # noqa: E731
    if operator in ("StringEquals", "ArnEquals"):
        return any(v in wanted for v in values)
    if operator in ("StringNotEquals", "ArnNotEquals"):
        return all(v not in wanted for v in values)
    if operator in ("StringLike", "ArnLike"):
        return any(like(w, v) for w in wanted for v in values)
    if operator in ("StringNotLike", "ArnNotLike"):
        return not any(like(w, v) for w in wanted for v in values)
    if operator == "Bool":
        return any(v.lower() == w.lower() for w in wanted for v in values)
    return False  # an operator this twin does not know: deny rather than pass


def _statement_applies(statement: dict, action: str, resource: str, context: dict[str, list[str]]) -> bool:
    unconditioned = {k: v for k, v in statement.items() if k != "Condition"}
    if IAMPolicyStatement(unconditioned).is_action_permitted(action, resource) == PermissionResult.NEUTRAL:
        return False
    return all(
        _holds(operator, expected, context.get(key))
        for operator, pairs in (statement.get("Condition") or {}).items()
        for key, expected in pairs.items()
    )


class _ConditionedRequest(IAMRequest):
    """An EC2 or Secrets Manager resource's IAM check, then its policies again with their conditions."""

    def check_action_permitted(self, resource: str) -> None:
        super().check_action_permitted(resource)
        context = _condition_context(_CALL.response, resource)
        allowed = False
        for policy in self._access_key.collect_policies():
            document = IAMPolicy(policy)._policy_json
            statements = document["Statement"] if isinstance(document["Statement"], list) else [document["Statement"]]
            for statement in statements:
                if _statement_applies(statement, self._action, resource, context):
                    if statement.get("Effect") == "Deny":
                        self._raise_access_denied()
                    allowed = True
        if not allowed:
            self._raise_access_denied()


class _AlsoRequest(_ConditionedRequest):
    """An IAM check of another action the call needs (_CALL.also: kms:CreateGrant on a volume's key,
    ec2:CreateTags on what a launch tags), with its conditions."""

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self._action = _CALL.also


def _may_use_volume_keys(response: EC2Response, instances) -> bool:
    """Whether the caller may let EC2 use each customer managed key of the instances' volumes."""
    image_id = instances[0].image_id if instances else None
    _CALL.response = response
    try:
        for key in ebs_keys.customer_keys(response, image_id):
            for action in ebs_keys.KEY_ACTIONS:
                _CALL.also = action
                response._authenticate_and_authorize_action(_AlsoRequest, key)
    except AccessDeniedError:
        return False
    finally:
        _CALL.response, _CALL.also = None, None
    return True


def authorize_secrets(self: SecretsManagerResponse, resource: str = "*") -> None:
    _CALL.response = self
    try:
        self._authenticate_and_authorize_action(_ConditionedRequest, resource)
    finally:
        _CALL.response = None


def _secret_resource(self: SecretsManagerResponse) -> str:
    secret_id = self._get_param("SecretId") or self._get_param("Name")
    if not secret_id:
        return "*"
    secret = self.backend.secrets.get(secret_id)
    if secret is not None:
        return secret.arn
    if secret_id.startswith("arn:"):
        return secret_id
    return f"arn:aws:secretsmanager:{self.region}:{self.current_account}:secret:{secret_id}"


def _iam_resource(self: IamResponse) -> str:
    """The resource IAM authorizes an IAM call against, as AWS's service authorization reference says:
    the instance profile for its own actions (AddRoleToInstanceProfile included), else the role, a
    service-linked role by its service's path; moto gives a role's ARN only once the role exists, so
    a policy scoped to role ARNs could not allow CreateRole there."""
    data = self.data
    prefix = f"arn:{self.partition}:iam::{self.current_account}"
    path = (data.get("Path") or ["/"])[0]
    if data.get("InstanceProfileName"):
        name = data["InstanceProfileName"][0]
        profile = next((p for p in self.backend.instance_profiles.values() if p.name == name), None)
        return profile.arn if profile else f"{prefix}:instance-profile{path}{data['InstanceProfileName'][0]}"
    if data.get("RoleName"):
        role = next((r for r in self.backend.roles.values() if r.name == data["RoleName"][0]), None)
        return role.arn if role else f"{prefix}:role{path}{data['RoleName'][0]}"
    if self._get_action() == "CreateServiceLinkedRole" and data.get("AWSServiceName"):
        service = data["AWSServiceName"][0]
        name = iam_models.SERVICE_NAME_CONVERSION.get(service.split(".")[0], service.split(".")[0])
        return f"{prefix}:role/aws-service-role/{service}/AWSServiceRoleFor{name}"
    return "*"


_check_action_permitted = IAMRequestBase.check_action_permitted


def _session_policy(access_key) -> str | None:
    if not isinstance(access_key, AssumedRoleAccessKey):
        return None
    from moto.sts.models import sts_backends

    for session in sts_backends[access_key.account_id][access_key.partition].assumed_roles:
        if session.access_key_id == access_key._access_key_id:
            return session.policy or None
    return None


def check_action_permitted(self: IAMRequestBase, resource: str) -> None:
    _check_action_permitted(self, resource)
    if self._action == "sts:GetCallerIdentity":
        return  # always allowed, as on AWS
    policy = _session_policy(self._access_key)
    if policy and IAMPolicy(policy).is_action_permitted(self._action, resource) != PermissionResult.PERMITTED:
        self._raise_access_denied()


_check_principal = IAMPolicyStatement._check_principal
_SESSION_ARN = re.compile(r"^arn:([^:]+):sts::(\d{12}):assumed-role/([^/]+)/[^/]+$")
_ROLE_ARN = re.compile(r"^arn:([^:]+):iam::(\d{12}):role/(?:.*/)?([^/]+)$")


def check_principal(self: IAMPolicyStatement, principal: str) -> bool:
    if _check_principal(self, principal):
        return True
    session = _SESSION_ARN.match(principal)
    expected = (self._statement.get("Principal") or {}).get("AWS") or []
    expected = [expected] if isinstance(expected, str) else expected
    return bool(session) and any(
        (role := _ROLE_ARN.match(arn)) and role.groups() == session.groups() for arn in expected
    )


_create_aws_request = IAMRequestBase._create_aws_request


def create_aws_request(self: IAMRequestBase):
    request = _create_aws_request(self)
    if not self._body and self._method in ("GET", "HEAD", "DELETE"):
        request.data = b""
    return request


def install() -> None:
    """Patch this process's moto (idempotent): each class's methods replaced by ours of that name."""
    patches = {
        EC2Response: {
            "create_placement_group": create_placement_group,
            "describe_placement_groups": describe_placement_groups,
            "delete_placement_group": delete_placement_group,
            "run_instances": run_instances,
            "stop_instances": stop_instances,
            "terminate_instances": terminate_instances,
            "register_image": register_image,
            "get_console_output": get_console_output,
            "_authenticate_and_authorize_normal_action": authorize_ec2,
            **reservations.ACTIONS,
            **iam_spread.ACTIONS,
            **ebs_keys.ACTIONS,
            **topology.ACTIONS,
        },
        SecretsManagerResponse: {
            "_determine_resource": _secret_resource,
            "_authenticate_and_authorize_normal_action": authorize_secrets,
        },
        IAMRequestBase: {"_create_aws_request": create_aws_request, "check_action_permitted": check_action_permitted},
        IamResponse: {"_determine_resource": _iam_resource},
        IAMPolicyStatement: {"_check_principal": check_principal},
        iam_models.IAMBackend: {"create_service_linked_role": create_service_linked_role},
        BaseResponse: {"call_action": call_action},
        **secret_store.PATCHES,
        **subnets.PATCHES,
        **ebs_keys.PATCHES,
        **fsx.PATCHES,
        **service_quotas.PATCHES,
    }
    for cls, methods in patches.items():
        for name, method in methods.items():
            setattr(cls, name, method)
    iam_models.SERVICE_NAME_CONVERSION["spot"] = "EC2Spot"  # IAM's AWSServiceRoleForEC2Spot
