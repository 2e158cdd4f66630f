"""The private addresses other resources hold in the cluster's subnet, so that no new node is given one.

Read from the subnet itself, not from a listing of NICs: a subnet's `ipConfigurations` names every
IP configuration in it (NICs of any resource group, other teams' included), while ARM answers a
subscription-wide NIC listing with only the NICs the caller may read. The addresses come from
one NIC listing per resource group those configurations are in (the NIC's group is in the
configuration's id), not one GET per NIC.

A configuration whose address cannot be read (its resource group is not readable to the caller,
or it is not a NIC's) still holds an address: `taken` asks the virtual network which of the
addresses about to be given out are free (Check IP Address Availability), and those that are not
are left alone.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from clusterbake.providers.azure.api import error_code


@dataclass
class Held:
    """What the subnet's IP configurations hold: the addresses read, and the configurations not read."""

    addresses: set[str] = field(default_factory=set)
    unread: list[str] = field(default_factory=list)


def held(network, subnet_id: str) -> Held:
    """The addresses of the subnet's IP configurations (network: the SDK's NetworkManagementClient)."""
    from azure.core.exceptions import HttpResponseError

    parts = subnet_id.split("/")
    subnet = network.subnets.get(parts[4], parts[8], parts[10])
    by_group: dict[str, set[str]] = {}
    found = Held()
    for config in subnet.ip_configurations or []:
        config_id = config.id.lower()
        segments = config_id.split("/")
        if len(segments) > 8 and segments[6:8] == ["microsoft.network", "networkinterfaces"]:
            by_group.setdefault(segments[4], set()).add(config_id)
        else:
            found.unread.append(config.id)  # a load balancer's, a gateway's, ...: not a NIC of a group
    for rg, ids in sorted(by_group.items()):
        try:
            nics = list(network.network_interfaces.list(rg))
        except HttpResponseError as exc:
            if exc.status_code not in (403, 404) and error_code(exc) != "AuthorizationFailed":
                raise
            nics = []  # not readable here (or gone): its configurations' addresses are asked for below
        for nic in nics:
            for config in nic.ip_configurations or []:
                if config.id and config.id.lower() in ids and config.private_ip_address:
                    found.addresses.add(config.private_ip_address)
                    ids.discard(config.id.lower())
        found.unread += sorted(ids)
    return found


def taken(network, subnet_id: str, candidates: list[str]) -> set[str]:
    """Of `candidates`, the addresses the subnet's virtual network says are not available."""
    parts = subnet_id.split("/")
    check = network.virtual_networks.check_ip_address_availability
    return {address for address in candidates if not check(parts[4], parts[8], ip_address=address).available}
