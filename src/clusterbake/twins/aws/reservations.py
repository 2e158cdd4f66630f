"""Capacity reservations in the EC2 twin: On-Demand Capacity Reservations and Capacity Blocks.

moto 5.2.5 implements none of these calls, and its RunInstances takes any
CapacityReservationTarget (realcloud review A1, D1). Here, as the EC2 User Guide describes
them ("Launch instances into an existing Capacity Reservation", "Launch instances using
Capacity Blocks"):

- CreateCapacityReservation (an ODCR: active at once, `open` unless targeted, in a cluster
  placement group when PlacementGroupArn names one), DescribeCapacityReservations (ids,
  filters state, instance-type, tag:KEY), CancelCapacityReservation.
- DescribeCapacityBlockOfferings: one offering per zone of the region for the type, count and
  duration asked, starting now or at StartDateRange's earliest; PurchaseCapacityBlock makes it
  a reservation of type `capacity-block` (targeted). Its state follows the clock: `scheduled`
  before its start, `active`, `expired` after its end.
- RunInstances into a reservation: it must exist (InvalidCapacityReservationId.NotFound), be
  active, match the instance type, the subnet's zone and the placement group (the ODCR's, or
  none: a Capacity Block is placed by EC2), and a Capacity Block only with MarketType
  `capacity-block` (that market type only with one). More instances than the reservation has
  room for fail with ReservationCapacityExceeded. An instance holds its place until it has
  terminated and the twin's address hold ($MOTO_ADDRESS_HOLD) has passed, as EC2 cleans an
  instance up for minutes before its place is free. Instances launched into a block say
  InstanceLifecycle `capacity-block` (moto says `spot` for any market type).

Still lenient: platform and tenancy are not matched, an `open` ODCR does not take untargeted
launches, instances of an expired block keep running (EC2 ends them 30 minutes before the end).
"""

from __future__ import annotations

import datetime
import itertools
import uuid

from moto.core.responses import ActionResult
from moto.ec2.exceptions import EC2ClientError
from moto.ec2.responses import EC2Response

from clusterbake.twins.aws import subnets
from clusterbake.twins.aws.filters import matches

_RESERVATIONS: dict[tuple[str, str], dict[str, dict]] = {}
_OFFERINGS: dict[str, dict] = {}
_NUMBERS = itertools.count(1)


def _store(response: EC2Response) -> dict[str, dict]:
    return _RESERVATIONS.setdefault((response.current_account, response.region), {})


def _now() -> datetime.datetime:
    return datetime.datetime.now(datetime.UTC).replace(microsecond=0)


def _date(value) -> datetime.datetime | None:
    """A timestamp parameter (moto hands it on parsed, or as the request's ISO 8601 text)."""
    if value is None:
        return None
    if not isinstance(value, datetime.datetime):
        value = datetime.datetime.fromisoformat(str(value).replace("Z", "+00:00"))
    return value if value.tzinfo else value.replace(tzinfo=datetime.UTC)


def _state(reservation: dict) -> str:
    if reservation["State"] == "cancelled":
        return "cancelled"
    now = _now()
    if reservation["StartDate"] > now:
        return "scheduled"
    end = reservation.get("EndDate")
    return "expired" if end is not None and end <= now else "active"


def _holders(response: EC2Response, reservation_id: str) -> int:
    """Instances that hold a place in the reservation (a terminated one for the address hold's time)."""
    return sum(
        1
        for launch in response.ec2_backend.all_reservations()
        for instance in launch.instances
        if getattr(instance, "capacity_reservation_id", None) == reservation_id and subnets.holds_its_place(instance)
    )


def _view(response: EC2Response, reservation: dict) -> dict:
    state = _state(reservation)
    available = reservation["TotalInstanceCount"] - _holders(response, reservation["CapacityReservationId"])
    return {**reservation, "State": state, "AvailableInstanceCount": max(available, 0) if state == "active" else 0}


def _new(response: EC2Response, **fields) -> dict:
    reservation_id = f"cr-{uuid.uuid4().hex[:17]}"
    tags = response._parse_tag_specification().get("capacity-reservation", {})
    reservation = {
        "CapacityReservationId": reservation_id,
        "OwnerId": response.current_account,
        "CapacityReservationArn": f"arn:{response.partition}:ec2:{response.region}:{response.current_account}:"
        f"capacity-reservation/{reservation_id}",
        "Tenancy": "default",
        "InstancePlatform": response._get_param("InstancePlatform") or "Linux/UNIX",
        "CreateDate": _now(),
        "State": "active",
        "Tags": [{"Key": k, "Value": v} for k, v in tags.items()],
        **fields,
    }
    _store(response)[reservation_id] = reservation
    return reservation


def create_capacity_reservation(self: EC2Response) -> ActionResult:
    count = int(self._get_param("InstanceCount"))
    reservation = _new(
        self,
        InstanceType=self._get_param("InstanceType"),
        AvailabilityZone=self._get_param("AvailabilityZone"),
        TotalInstanceCount=count,
        StartDate=_now(),
        EndDate=_date(self._get_param("EndDate")),
        EndDateType=self._get_param("EndDateType") or "unlimited",
        InstanceMatchCriteria=self._get_param("InstanceMatchCriteria") or "open",
        PlacementGroupArn=self._get_param("PlacementGroupArn"),
        ReservationType="default",
    )
    return ActionResult({"CapacityReservation": _view(self, reservation)})


def describe_capacity_reservations(self: EC2Response) -> ActionResult:
    ids = self._get_param("CapacityReservationIds", []) or []
    filters = self._filters_from_querystring()
    store = _store(self)
    for reservation_id in ids:
        if reservation_id not in store:
            raise _not_found(reservation_id)
    found = []
    for reservation in (store[i] for i in ids) if ids else store.values():
        view = _view(self, reservation)
        if matches(view, filters, {"state": "State", "instance-type": "InstanceType"}):
            found.append(view)
    return ActionResult({"CapacityReservations": found})


def cancel_capacity_reservation(self: EC2Response) -> ActionResult:
    reservation_id = self._get_param("CapacityReservationId")
    reservation = _store(self).get(reservation_id)
    if reservation is None:
        raise _not_found(reservation_id)
    if reservation["ReservationType"] == "capacity-block":
        raise EC2ClientError("InvalidParameterValue", "A Capacity Block cannot be cancelled.")
    reservation["State"] = "cancelled"
    return ActionResult({"Return": True})


def describe_capacity_block_offerings(self: EC2Response) -> ActionResult:
    instance_type = self._get_param("InstanceType")
    count = int(self._get_param("InstanceCount") or 1)
    hours = int(self._get_param("CapacityDurationHours"))
    start = max(_date(self._get_param("StartDateRange")) or _now(), _now())
    offerings = []
    for zone in self.ec2_backend.describe_availability_zones():
        offering = {
            "CapacityBlockOfferingId": f"cb-{next(_NUMBERS):017x}",
            "InstanceType": instance_type,
            "AvailabilityZone": zone.name,
            "InstanceCount": count,
            "StartDate": start,
            "EndDate": start + datetime.timedelta(hours=hours),
            "CapacityBlockDurationHours": hours,
            "UpfrontFee": f"{30.0 * count * hours:.2f}",  # made up: the twin knows no Capacity Block prices
            "CurrencyCode": "USD",
            "Tenancy": "default",
        }
        _OFFERINGS[offering["CapacityBlockOfferingId"]] = offering
        offerings.append(offering)
    return ActionResult({"CapacityBlockOfferings": offerings})


def purchase_capacity_block(self: EC2Response) -> ActionResult:
    offering_id = self._get_param("CapacityBlockOfferingId")
    offering = _OFFERINGS.pop(offering_id, None)
    if offering is None:
        raise EC2ClientError("InvalidParameterValue", f"The Capacity Block offering '{offering_id}' is not available.")
    reservation = _new(
        self,
        InstanceType=offering["InstanceType"],
        AvailabilityZone=offering["AvailabilityZone"],
        TotalInstanceCount=offering["InstanceCount"],
        StartDate=offering["StartDate"],
        EndDate=offering["EndDate"],
        EndDateType="limited",
        InstanceMatchCriteria="targeted",
        ReservationType="capacity-block",
    )
    return ActionResult({"CapacityReservation": _view(self, reservation)})


def _launch_zone(response: EC2Response) -> str | None:
    subnet_id = response._get_param("SubnetId")
    for interface in response._get_param("NetworkInterfaces", []) or []:
        subnet_id = subnet_id or interface.get("SubnetId")
    if subnet_id:
        return response.ec2_backend.get_subnet(subnet_id).availability_zone
    return response._get_param("Placement.AvailabilityZone")


def _not_found(reservation_id: str) -> EC2ClientError:
    return EC2ClientError(
        "InvalidCapacityReservationId.NotFound", f"The capacity reservation ID '{reservation_id}' does not exist"
    )


def _mismatch(message: str) -> EC2ClientError:
    return EC2ClientError("InvalidParameterCombination", message)


def check_run_instances(response: EC2Response, instance_type: str | None) -> str | None:
    """The reservation a RunInstances request targets, refused where EC2 refuses it; None: no target."""
    market = response._get_param("InstanceMarketOptions.MarketType")
    target = response._get_param("CapacityReservationSpecification.CapacityReservationTarget") or {}
    reservation_id = target.get("CapacityReservationId")
    if not reservation_id:
        if market == "capacity-block":
            raise _mismatch("MarketType capacity-block needs a CapacityReservationId of a Capacity Block.")
        return None
    reservation = _store(response).get(reservation_id)
    if reservation is None:
        raise _not_found(reservation_id)
    view = _view(response, reservation)
    if view["State"] != "active":
        raise EC2ClientError(
            "InvalidParameterValue",
            f"Capacity Reservation {reservation_id} is {view['State']}; instances launch only into an active one.",
        )
    block = view["ReservationType"] == "capacity-block"
    if block and market != "capacity-block":
        raise _mismatch(
            f"{reservation_id} is a Capacity Block: launch with InstanceMarketOptions MarketType capacity-block."
        )
    if not block and market == "capacity-block":
        raise _mismatch(f"{reservation_id} is not a Capacity Block; MarketType capacity-block needs one.")
    if instance_type != view["InstanceType"]:
        raise _mismatch(f"Instance type {instance_type} does not match Capacity Reservation {reservation_id} "
                        f"({view['InstanceType']}).")  # fmt: skip
    zone = _launch_zone(response)
    if zone and zone != view["AvailabilityZone"]:
        raise _mismatch(f"Availability Zone {zone} does not match Capacity Reservation {reservation_id} "
                        f"({view['AvailabilityZone']}).")  # fmt: skip
    group = response._get_param("Placement.GroupName")
    reserved_group = (view.get("PlacementGroupArn") or "").rpartition("placement-group/")[2] or None
    if group != reserved_group:
        where = f"placement group {reserved_group}" if reserved_group else "no placement group"
        raise _mismatch(f"Capacity Reservation {reservation_id} is for {where}; the launch names "
                        f"{group or 'none'}.")  # fmt: skip
    count = int(response._get_param("MinCount", if_none="1"))
    if count > view["AvailableInstanceCount"]:
        raise EC2ClientError(
            "ReservationCapacityExceeded",
            f"The requested number of {instance_type} instances exceeds the available capacity of the targeted "
            "Capacity Reservation.",
        )
    return reservation_id


def mark_launched(instances, reservation_id: str | None, market: str | None) -> None:
    """The instances hold their places in the reservation; a block's say so in InstanceLifecycle."""
    for instance in instances:
        instance.capacity_reservation_id = reservation_id
        if market == "capacity-block":
            instance.lifecycle = "capacity-block"


ACTIONS = {
    "create_capacity_reservation": create_capacity_reservation,
    "describe_capacity_reservations": describe_capacity_reservations,
    "cancel_capacity_reservation": cancel_capacity_reservation,
    "describe_capacity_block_offerings": describe_capacity_block_offerings,
    "purchase_capacity_block": purchase_capacity_block,
}
