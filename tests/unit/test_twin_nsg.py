"""The Azure twin's network security groups (twins/azure/nsg.py): which rule decides a flow, as Microsoft's
"How network security groups filter network traffic" describes it."""

from __future__ import annotations

from clusterbake.providers.azure.resources import security_rules
from clusterbake.twins.azure.nsg import Flow, Scope, Verdict, evaluate

NSGS = "/subscriptions/s/resourceGroups/g/providers/Microsoft.Network/networkSecurityGroups"
ASG = "/subscriptions/s/resourceGroups/g/providers/Microsoft.Network/applicationSecurityGroups/cluster"
NODE, OTHER_NODE, NOT_A_MEMBER = "10.70.0.4", "10.70.0.5", "10.70.0.9"
SERVER = "10.70.30.4"  # an Azure Managed Lustre server, in a subnet of the same network
PUBLIC = "52.160.0.9"  # an address of the public internet (203.0.113.0/24, for documentation, is not)
SCOPE = Scope(("10.70.0.0/16",), {ASG.lower(): frozenset({NODE, OTHER_NODE})})


def nsg(name: str, *rules: tuple[str, int, str, dict]) -> dict:
    """An NSG of (name, priority, access, properties) rules; Azure's default rules come with it."""
    return {
        "id": f"{NSGS}/{name}",
        "properties": {
            "securityRules": [
                {"name": rule, "properties": {"priority": priority, "direction": "Inbound", "access": access, **props}}
                for rule, priority, access, props in rules
            ]
        },
    }


def any_from(source: str, **more) -> dict:
    return {"protocol": "*", "sourceAddressPrefix": source, "sourcePortRange": "*", "destinationAddressPrefix": "*",
            "destinationPortRange": "*"} | more  # fmt: skip


def tcp(source: str, destination: str, port: int) -> Flow:
    return Flow(source, destination, "Tcp", port, 1023)


def inbound(group: dict, flow: Flow) -> Verdict:
    return evaluate([group], "Inbound", flow, SCOPE)


def decided_by(verdict: Verdict) -> tuple[bool, str | None, int | None]:
    return verdict.allowed, verdict.rule, verdict.priority


def test_the_default_rules_admit_the_network_and_the_load_balancer_and_deny_the_rest():
    empty = nsg("empty")
    assert decided_by(inbound(empty, tcp(SERVER, NODE, 988))) == (True, "AllowVnetInBound", 65000)
    assert decided_by(inbound(empty, tcp("168.63.129.16", NODE, 80))) == (True, "AllowAzureLoadBalancerInBound", 65001)
    assert decided_by(inbound(empty, tcp(PUBLIC, NODE, 22))) == (False, "DenyAllInBound", 65500)
    assert decided_by(inbound(empty, tcp("192.168.5.5", NODE, 22))) == (False, "DenyAllInBound", 65500)


def test_the_lowest_priority_number_decides_whatever_the_order_of_the_list():
    deny_first_in_list = nsg("a", ("deny", 300, "Deny", any_from("*")), ("allow", 200, "Allow", any_from("*")))
    assert decided_by(inbound(deny_first_in_list, tcp(SERVER, NODE, 988))) == (True, "allow", 200)
    allow_later = nsg("b", ("deny", 200, "Deny", any_from("*")), ("allow", 300, "Allow", any_from("*")))
    assert decided_by(inbound(allow_later, tcp(SERVER, NODE, 988))) == (False, "deny", 200)
    # The NSG's own rules come before the defaults: a deny at 4096 beats AllowVnetInBound.
    assert decided_by(inbound(nsg("c", ("deny", 4096, "Deny", any_from("*"))), tcp(SERVER, NODE, 1))) == (
        False,
        "deny",
        4096,
    )


def test_clusterbakes_rules_keep_lustre_servers_out_unless_their_subnet_has_a_rule():
    def clusterbake(prefixes: list[str]) -> dict:
        return {"id": f"{NSGS}/clusterbake-c", "properties": {"securityRules": security_rules(ASG, ["203.0.113.0/24"],
                                                                                              prefixes)}}  # fmt: skip

    old = clusterbake([])
    assert decided_by(inbound(old, tcp(SERVER, NODE, 988))) == (False, "deny-vnet", 4000)
    assert decided_by(inbound(old, tcp(OTHER_NODE, NODE, 988))) == (True, "cluster", 1000)  # ASG to ASG
    assert decided_by(inbound(old, tcp("203.0.113.7", NODE, 22))) == (True, "ssh-0", 100)
    new = clusterbake(["10.70.30.0/24"])
    for port in (988, 1019, 1021, 1023):
        assert decided_by(inbound(new, tcp(SERVER, NODE, port))) == (True, "amlfs-0", 2000)
    for port in (22, 987, 989, 1018, 1024):  # outside the rule's ports: the deny
        assert decided_by(inbound(new, tcp(SERVER, NODE, port))) == (False, "deny-vnet", 4000)
    assert decided_by(inbound(new, Flow(SERVER, NODE, "Udp", 988, 1023))) == (False, "deny-vnet", 4000)
    # The rule's destination is the cluster's ASG: an address of the network outside it stays denied.
    assert decided_by(inbound(new, tcp(SERVER, NOT_A_MEMBER, 988))) == (False, "deny-vnet", 4000)
    assert decided_by(inbound(new, tcp("10.70.31.4", NODE, 988))) == (False, "deny-vnet", 4000)


def test_application_security_groups_match_their_members_addresses_on_either_side():
    group = [{"id": ASG}]
    from_members = nsg("a", ("members", 100, "Allow", any_from("*") | {"sourceApplicationSecurityGroups": group,
                                                                        "sourceAddressPrefix": None}),
                       ("deny", 200, "Deny", any_from("*")))  # fmt: skip
    assert inbound(from_members, tcp(OTHER_NODE, NODE, 22)).rule == "members"
    assert inbound(from_members, tcp(NOT_A_MEMBER, NODE, 22)).rule == "deny"
    to_members = nsg("b", ("to", 100, "Deny", any_from("*") | {"destinationApplicationSecurityGroups": group,
                                                               "destinationAddressPrefix": None}))  # fmt: skip
    assert decided_by(inbound(to_members, tcp(SERVER, NODE, 22))) == (False, "to", 100)
    assert decided_by(inbound(to_members, tcp(SERVER, NOT_A_MEMBER, 22))) == (True, "AllowVnetInBound", 65000)


def test_service_tags_virtual_network_azure_load_balancer_internet_and_any():
    rules = nsg(
        "tags",
        ("lb", 100, "Deny", any_from("AzureLoadBalancer")),
        ("internet", 110, "Deny", any_from("Internet")),
        ("vnet", 120, "Deny", any_from("VirtualNetwork")),
        ("any", 130, "Allow", any_from("*")),
    )
    assert inbound(rules, tcp("168.63.129.16", NODE, 80)).rule == "lb"
    assert inbound(rules, tcp(PUBLIC, NODE, 80)).rule == "internet"
    assert inbound(rules, tcp(SERVER, NODE, 80)).rule == "vnet"
    assert inbound(rules, tcp("192.168.5.5", NODE, 80)).rule == "any"  # private, outside the network: not Internet


def test_address_prefix_lists_and_port_ranges():
    rules = nsg(
        "ranges",
        ("list", 100, "Allow", any_from("*") | {"sourceAddressPrefix": None,
                                                "sourceAddressPrefixes": ["10.70.40.0/24", "10.70.30.4"],
                                                "destinationPortRange": None,
                                                "destinationPortRanges": ["988", "1019-1023"]}),
        ("one-port", 110, "Allow", any_from("10.70.50.0/24", destinationPortRange="22")),
        ("source-port", 120, "Allow", any_from("10.70.60.0/24", sourcePortRange="1019-1023")),
        ("deny", 200, "Deny", any_from("*")),
    )  # fmt: skip
    assert inbound(rules, tcp(SERVER, NODE, 1020)).rule == "list"
    assert inbound(rules, tcp("10.70.40.200", NODE, 988)).rule == "list"
    assert inbound(rules, tcp("10.70.30.5", NODE, 988)).rule == "deny"  # a single address is a /32
    assert inbound(rules, tcp(SERVER, NODE, 1018)).rule == "deny"
    assert inbound(rules, tcp("10.70.50.1", NODE, 22)).rule == "one-port"
    assert inbound(rules, tcp("10.70.50.1", NODE, 23)).rule == "deny"
    assert inbound(rules, tcp("10.70.60.1", NODE, 5000)).rule == "source-port"  # from port 1023
    assert inbound(rules, Flow("10.70.60.1", NODE, "Tcp", 5000, 40000)).rule == "deny"
    # ICMP has no ports: a rule's port ranges do not keep it from matching.
    assert inbound(rules, Flow("10.70.50.1", NODE, "Icmp", 0, 0)).rule == "one-port"


def test_the_subnets_nsg_then_the_nics_both_must_admit_a_flow_in():
    admit = nsg("subnet-admits", ("all", 100, "Allow", any_from("*")))
    deny = nsg("nic-denies", ("none", 100, "Deny", any_from("*")))
    flow = tcp(SERVER, NODE, 988)
    verdict = evaluate([admit, deny], "Inbound", flow, SCOPE)
    assert (verdict.allowed, verdict.nsg, verdict.rule) == (False, f"{NSGS}/nic-denies", "none")
    assert verdict.reason(flow) == (
        "rule none (priority 100) of network security group nic-denies denies inbound TCP 988 from 10.70.30.4 to "
        "10.70.0.4"
    )
    first = evaluate([deny, admit], "Inbound", flow, SCOPE)
    assert first.nsg == f"{NSGS}/nic-denies"  # the first level's denial: the next is not asked
    assert evaluate([None, admit], "Inbound", flow, SCOPE).allowed
    nothing = evaluate([None, None], "Inbound", flow, SCOPE)
    assert (nothing.allowed, nothing.nsg) == (True, None)


def test_outbound_rules_are_their_own_direction():
    group = nsg("out", ("deny-in", 100, "Deny", any_from("*")))
    outbound = {"priority": 100, "direction": "Outbound", "access": "Deny", **any_from("*")}
    group["properties"]["securityRules"].append({"name": "deny-out", "properties": outbound})
    flow = tcp(SERVER, NODE, 988)
    assert decided_by(evaluate([group], "Outbound", flow, SCOPE)) == (False, "deny-out", 100)
    empty = nsg("empty")
    assert decided_by(evaluate([empty], "Outbound", flow, SCOPE)) == (True, "AllowVnetOutBound", 65000)
    assert decided_by(evaluate([empty], "Outbound", tcp(NODE, PUBLIC, 443), SCOPE)) == (
        True,
        "AllowInternetOutBound",
        65001,
    )
