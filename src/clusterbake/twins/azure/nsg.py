"""Network security groups as Azure applies them to a flow (Microsoft's "How network security groups filter
network traffic" and "Network security groups" overview), for the twin's checks of who reaches whom.

- A flow into a NIC passes the NSG of the NIC's subnet first, then the NIC's own; a flow out of a NIC
  passes the NIC's NSG first, then its subnet's. A level without an NSG lets everything through; a flow
  one level denies goes no further.
- In one NSG, the rules of the flow's direction are taken by priority, lowest number first: the NSG's own
  rules (100-4096), then Azure's default rules (65000 AllowVnetInBound, 65001 AllowAzureLoadBalancerInBound,
  65500 DenyAllInBound and their outbound peers). The first rule that matches decides, Allow or Deny.
- A rule matches on protocol (`*`, Tcp, Udp, Icmp, Esp, Ah), on source and destination (address prefixes,
  `*`, service tags, or application security groups: the addresses of their member IP configurations)
  and on ports (`*`, a port, a range `low-high`; the `...Ranges` properties are lists of them).

Service tags as the twin reads them ("Virtual network service tags"): VirtualNetwork is the address space of
the virtual network the evaluated NIC is in (Azure adds peered networks, gateways' on-premises ranges and
user-defined routes' prefixes, none of which the twin emulates); AzureLoadBalancer is the host's virtual IP
168.63.129.16, where Azure's health probes come from; Internet is every public address outside
VirtualNetwork. Other service tags are not emulated (the twin's NSGs refuse them). Flows are a connection's
first packet: NSGs are stateful, so replies to an admitted connection are not asked about here.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

HOST_VIRTUAL_IP = "168.63.129.16"
SERVICE_TAGS = ("*", "VirtualNetwork", "AzureLoadBalancer", "Internet")
PORTED = ("tcp", "udp")  # the protocols whose rules' port ranges apply

# Azure's default rules of every NSG: (name, priority, direction, access, source, destination), any protocol and port.
DEFAULT_RULES = (
    ("AllowVnetInBound", 65000, "Inbound", "Allow", "VirtualNetwork", "VirtualNetwork"),
    ("AllowAzureLoadBalancerInBound", 65001, "Inbound", "Allow", "AzureLoadBalancer", "*"),
    ("DenyAllInBound", 65500, "Inbound", "Deny", "*", "*"),
    ("AllowVnetOutBound", 65000, "Outbound", "Allow", "VirtualNetwork", "VirtualNetwork"),
    ("AllowInternetOutBound", 65001, "Outbound", "Allow", "*", "Internet"),
    ("DenyAllOutBound", 65500, "Outbound", "Deny", "*", "*"),
)


def default_rules(nsg_id: str) -> list[dict]:
    """The `defaultSecurityRules` Azure shows on every NSG."""
    return [
        {
            "name": name,
            "id": f"{nsg_id}/defaultSecurityRules/{name}",
            "properties": {
                "priority": priority,
                "direction": direction,
                "access": access,
                "protocol": "*",
                "sourceAddressPrefix": source,
                "destinationAddressPrefix": destination,
                "sourcePortRange": "*",
                "destinationPortRange": "*",
                "provisioningState": "Succeeded",
            },
        }
        for name, priority, direction, access, source, destination in DEFAULT_RULES
    ]


@dataclass(frozen=True)
class Flow:
    """A connection's first packet."""

    source: str
    destination: str
    protocol: str  # Tcp, Udp, Icmp, ...
    destination_port: int
    source_port: int


@dataclass(frozen=True)
class Scope:
    """What the names in rules stand for where an NSG is evaluated."""

    virtual_network: tuple[str, ...]  # the address prefixes of the evaluated NIC's virtual network
    groups: Mapping[str, frozenset[str]] = field(default_factory=dict)  # ASG id (lower case) -> member addresses


@dataclass(frozen=True)
class Verdict:
    allowed: bool
    direction: str = ""
    nsg: str | None = None  # id of the NSG whose rule decided; None: no NSG on the path
    rule: str | None = None
    priority: int | None = None

    def reason(self, flow: Flow) -> str:
        """What decided, in words."""
        if self.nsg is None:
            return f"no network security group on the path to {flow.destination}"
        verb = "admits" if self.allowed else "denies"
        return (
            f"rule {self.rule} (priority {self.priority}) of network security group {self.nsg.rsplit('/', 1)[-1]} "
            f"{verb} {self.direction.lower()} {flow.protocol.upper()} {flow.destination_port} from {flow.source} to "
            f"{flow.destination}"
        )


def _in_prefix(address: str, prefix: str, scope: Scope) -> bool:
    if prefix == "*":
        return True
    ip = ipaddress.ip_address(address)
    in_network = any(ip in ipaddress.ip_network(p, strict=False) for p in scope.virtual_network)
    if prefix == "VirtualNetwork":
        return in_network
    if prefix == "AzureLoadBalancer":
        return address == HOST_VIRTUAL_IP
    if prefix == "Internet":
        return ip.is_global and not in_network
    return ip in ipaddress.ip_network(prefix, strict=False)


def _listed(props: dict, single: str, plural: str) -> list:
    """A rule's one value and its list of them (`sourceAddressPrefix` and `sourceAddressPrefixes`), together."""
    return ([props[single]] if props.get(single) else []) + list(props.get(plural) or [])


def _side_matches(props: dict, side: str, address: str, scope: Scope) -> bool:
    groups = props.get(f"{side}ApplicationSecurityGroups") or []
    if groups:
        return any(address in scope.groups.get((g.get("id") or "").lower(), ()) for g in groups)
    prefixes = _listed(props, f"{side}AddressPrefix", f"{side}AddressPrefixes")
    return any(_in_prefix(address, prefix, scope) for prefix in prefixes)


def _port_matches(props: dict, side: str, port: int) -> bool:
    for text in _listed(props, f"{side}PortRange", f"{side}PortRanges"):
        if text == "*":
            return True
        low, _, high = str(text).partition("-")
        if int(low) <= port <= int(high or low):
            return True
    return False


def matches(props: dict, flow: Flow, scope: Scope) -> bool:
    """Whether one rule (its `properties`) matches the flow."""
    protocol = props.get("protocol", "*")
    if protocol != "*" and protocol.lower() != flow.protocol.lower():
        return False
    if flow.protocol.lower() in PORTED and not (
        _port_matches(props, "source", flow.source_port) and _port_matches(props, "destination", flow.destination_port)
    ):
        return False
    return _side_matches(props, "source", flow.source, scope) and _side_matches(
        props, "destination", flow.destination, scope
    )


def ordered_rules(nsg: dict, direction: str) -> list[dict]:
    """The NSG's rules of a direction in the order Azure takes them: by priority, its own before the defaults."""
    props = nsg.get("properties") or {}
    defaults = props.get("defaultSecurityRules") or default_rules(nsg.get("id", ""))
    found = [*(props.get("securityRules") or []), *defaults]
    return sorted(
        (r for r in found if r["properties"].get("direction") == direction), key=lambda r: r["properties"]["priority"]
    )


def decide(nsg: dict, direction: str, flow: Flow, scope: Scope) -> Verdict:
    """One NSG's verdict: its first matching rule's access."""
    for rule in ordered_rules(nsg, direction):
        props = rule["properties"]
        if matches(props, flow, scope):
            return Verdict(props["access"] == "Allow", direction, nsg["id"], rule["name"], props["priority"])
    # Unreachable with Azure's defaults (DenyAll matches everything); a rule list without them denies.
    return Verdict(False, direction, nsg["id"], "(none)", None)


def evaluate(nsgs: Iterable[dict | None], direction: str, flow: Flow, scope: Scope) -> Verdict:
    """The NSGs on one side of a flow, in Azure's order (inbound: the subnet's, then the NIC's; outbound: the
    NIC's, then the subnet's; None where a level has none): the first that denies decides, else the last."""
    verdict = Verdict(True, direction)
    for nsg in nsgs:
        if nsg is None:
            continue
        verdict = decide(nsg, direction, flow, scope)
        if not verdict.allowed:
            break
    return verdict
