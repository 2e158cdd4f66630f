"""The cluster's planned addresses kept out of EC2's hands: explicit subnet CIDR reservations.

EC2 picks a free address of the subnet for any interface it creates without one (another
stack's EFS or FSx, a load balancer, a NAT gateway, a VPC endpoint, another cluster's node),
in no documented order. A planned address of an elastic node, free today, may be taken
tomorrow, and its resume then fails with InvalidIPAddress.InUse (realcloud review A4). An
`explicit` reservation ("you assign the reserved IP addresses to network interfaces",
CreateSubnetCidrReservation) keeps EC2 from giving them out, while launches that name them
still get them. The planned addresses are collapsed into the fewest CIDR blocks holding
only them, each reserved and tagged `clusterbake:cluster`; `cluster up` makes the set match
the plan (a block that no longer fits is deleted, then the new ones made), `cluster down`
deletes them. Other owners' explicit reservations count as addresses in use.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Iterable

from clusterbake.providers.aws import tags
from clusterbake.providers.aws.api import call


def blocks(addresses: Iterable[str]) -> list[str]:
    """The fewest CIDR blocks that hold exactly these addresses."""
    return [str(net) for net in ipaddress.collapse_addresses(ipaddress.ip_network(a) for a in set(addresses))]


def _all(client, subnet_id: str) -> list[dict]:
    found = call(client.get_subnet_cidr_reservations, SubnetId=subnet_id)
    return found.get("SubnetIpv4CidrReservations", [])


def _ours(reservation: dict, cluster: str) -> bool:
    return tags.as_dict(reservation.get("Tags")).get(tags.CLUSTER) == cluster


def made(client, subnet_id: str, cluster: str) -> bool:
    """Whether the cluster has reservations in the subnet already."""
    return any(_ours(reservation, cluster) for reservation in _all(client, subnet_id))


def held_by_others(client, subnet_id: str, cluster: str) -> set[str]:
    """Addresses in explicit reservations of the subnet that are not this cluster's."""
    return {
        str(address)
        for reservation in _all(client, subnet_id)
        if reservation.get("ReservationType") == "explicit" and not _ours(reservation, cluster)
        for address in ipaddress.ip_network(reservation["Cidr"])
    }


def ensure(client, subnet_id: str, cluster: str, addresses: Iterable[str]) -> list[str]:
    """Reserve exactly the blocks of `addresses` for the cluster; what changed, said as blocks."""
    wanted = set(blocks(addresses))
    ours = [r for r in _all(client, subnet_id) if _ours(r, cluster)]
    changes = []
    for reservation in ours:
        if reservation["Cidr"] not in wanted:
            call(client.delete_subnet_cidr_reservation, SubnetCidrReservationId=reservation["SubnetCidrReservationId"])
            changes.append(f"released {reservation['Cidr']}")
    have = {r["Cidr"] for r in ours}
    for cidr in sorted(wanted - have):
        call(
            client.create_subnet_cidr_reservation,
            SubnetId=subnet_id,
            Cidr=cidr,
            ReservationType="explicit",
            Description=f"clusterbake cluster {cluster}: planned node addresses",
            TagSpecifications=[tags.spec("subnet-cidr-reservation", {tags.CLUSTER: cluster})],
        )
        changes.append(f"reserved {cidr}")
    return changes


def delete_all(client, subnet_id: str, cluster: str) -> list[str]:
    """Delete the cluster's reservations; what was deleted."""
    removed = []
    for reservation in _all(client, subnet_id):
        if _ours(reservation, cluster):
            call(client.delete_subnet_cidr_reservation, SubnetCidrReservationId=reservation["SubnetCidrReservationId"])
            removed.append(f"subnet CIDR reservation {reservation['Cidr']} ({reservation['SubnetCidrReservationId']})")
    return removed
