"""Which public endpoints a VM of the twin reaches (review D2, B2).

Azure gives a VM "default outbound access" to public endpoints (Key Vault's
`<vault>.vault.azure.net`, Blob Storage, package mirrors) unless its subnet is private
(`defaultOutboundAccess: false`, the default for new virtual networks) or it is a member of a
Flexible scale set ("Flexible scale sets are secure by default. Any instances created via
Flexible scale sets won't have the default outbound access IP associated to it": "Default outbound
access in Azure"). Such a VM reaches a public endpoint only through explicit outbound: a NAT
gateway on its subnet, or, for that one service, the subnet's service endpoint
(Microsoft.KeyVault, Microsoft.Storage). Route tables (a default route through a firewall) and
private endpoints are not emulated.

The twin's Key Vault and Blob listener for the nodes asks this before it answers a node, and
closes the connection without an answer otherwise (no route: the client sees the connection
fail, as it would time out on Azure).
"""

from __future__ import annotations

from clusterbake.twins.azure.resource import _ref


def _vm_of_address(state, address: str) -> tuple[dict, dict] | None:
    """(NIC, its IP configuration) holding a private address, or None."""
    for nic in state._of_type("Microsoft.Network/networkInterfaces"):
        for config in nic["properties"]["ipConfigurations"]:
            if config["properties"].get("privateIPAddress") == address:
                return nic, config
    return None


def reaches(state, address: str, service: str) -> bool:
    """Whether the VM at private `address` reaches `service`'s public endpoint ("Microsoft.KeyVault",
    "Microsoft.Storage"). An address no NIC of the twin holds (the host, a test client) reaches everything."""
    found = _vm_of_address(state, address)
    if found is None:
        return True
    nic, config = found
    subnet = state.resources.get((_ref(config["properties"].get("subnet")) or "").lower()) or {}
    props = subnet.get("properties") or {}
    if props.get("natGateway"):
        return True
    if any(e.get("service") == service for e in props.get("serviceEndpoints") or []):
        return True
    private = props.get("defaultOutboundAccess") is False
    vm = state.resources.get((_ref(nic["properties"].get("virtualMachine")) or "").lower()) or {}
    scale_set = _ref((vm.get("properties") or {}).get("virtualMachineScaleSet"))
    flexible = bool(scale_set) and (
        (state.resources.get(scale_set.lower()) or {}).get("properties", {}).get("orchestrationMode") == "Flexible"
    )
    return not (private or flexible)
