"""Subnet addresses in the EC2 twin as EC2 gives them out (realcloud review A4, D5).

- Allocation: "Amazon EC2 automatically selects an IP address within the subnet range"
  (AssignPrivateIpAddresses), in no documented order; moto hands out the lowest free one, so
  a product that plans from the top looked safe. Here an interface created without an
  address gets a pseudo-random free one (a seeded random source: the same run, the same
  addresses), never one of the subnet's first four or its last, nor one in a CIDR reservation.
- CIDR reservations' tags: moto drops them (GetSubnetCidrReservations
  answers `Tags: []`), so a product could not find its own reservations again.
"""

from __future__ import annotations

import ipaddress
import os
import random
import time

from moto.ec2.models.elastic_network_interfaces import NetworkInterface, NetworkInterfaceBackend
from moto.ec2.models.subnets import Subnet, SubnetCidrReservation

ADDRESS_HOLD = 5.0  # seconds a terminated instance keeps its address and place ($MOTO_ADDRESS_HOLD)
_RANDOM = random.Random(20261206)


def holds_its_place(instance) -> bool:
    """Not terminated, or terminated less than $MOTO_ADDRESS_HOLD seconds ago: EC2 releases a terminated
    instance's interface (its address, its place in a reservation) only once it has shut down."""
    hold = float(os.environ.get("MOTO_ADDRESS_HOLD", ADDRESS_HOLD))
    return instance.state != "terminated" or time.monotonic() - getattr(instance, "terminated_at", 0.0) < hold


_PROBES = 64  # random tries before the lowest free address is taken (a nearly full subnet)


def get_available_subnet_ip(self: Subnet, instance) -> str:
    network = self.cidr
    first, last = int(network.network_address) + 4, int(network.broadcast_address) - 1

    def free(address) -> bool:
        return str(address) not in self._subnet_ips and address not in self._reserved_ips

    for _ in range(_PROBES):
        address = ipaddress.ip_address(_RANDOM.randint(first, last))
        if free(address):
            break
    else:
        address = next((a for a in map(ipaddress.ip_address, range(first, last + 1)) if free(a)), None)
        if address is None:
            raise StopIteration()  # moto's own answer to a full subnet
    self._unused_ips.discard(str(address))
    self._subnet_ips[str(address)] = instance
    return str(address)


_eni_init = NetworkInterface.__init__
_delete_eni = NetworkInterfaceBackend.delete_network_interface


def eni_init(self: NetworkInterface, ec2_backend, subnet, private_ip_address, private_ip_addresses=None, *args, **kw):
    chosen_by_ec2 = not private_ip_address and not private_ip_addresses
    _eni_init(self, ec2_backend, subnet, private_ip_address, private_ip_addresses, *args, **kw)
    if chosen_by_ec2 and self.subnet is not None:
        address = get_available_subnet_ip(self.subnet, self)
        self.private_ip_address = address
        self.private_ip_addresses[0]["PrivateIpAddress"] = address
        self.address_from_subnet = address


def delete_network_interface(self: NetworkInterfaceBackend, eni_id: str) -> None:
    interface = self.enis.get(eni_id)
    _delete_eni(self, eni_id)
    if getattr(interface, "address_from_subnet", None):
        interface.subnet.del_subnet_ip(interface.address_from_subnet)


_init = SubnetCidrReservation.__init__


def reservation_init(self: SubnetCidrReservation, *args, **kwargs) -> None:
    _init(self, *args, **kwargs)
    tags = {t["Key"]: t["Value"] for spec in self.tag_specifications for t in spec.get("Tags", [])}
    if tags:
        self.ec2_backend.create_tags([self.id], tags)


PATCHES = {
    Subnet: {"get_available_subnet_ip": get_available_subnet_ip},
    SubnetCidrReservation: {"__init__": reservation_init},
    NetworkInterface: {"__init__": eni_init},
    NetworkInterfaceBackend: {"delete_network_interface": delete_network_interface},
}
