"""Virtual networks, subnets, network security groups, application security groups and network interfaces,
as ARM validates them.

A mixin of ArmState (state.py): the store, `self._base`, `self.start` and the lock come from there. What the
NSGs let through between two addresses of a network: flow_verdict (the rules themselves: nsg.py)."""

from __future__ import annotations

import ipaddress

from clusterbake.twins.azure import nsg
from clusterbake.twins.azure.resource import ArmError, ResourceId, _cidr, _ref, not_found


class NetworkMixin:
    def _put_network_virtualnetworks(self, rid, body, existing):
        resource = self._base(rid, body, existing)
        props = body.get("properties") or {}
        prefixes = (props.get("addressSpace") or {}).get("addressPrefixes") or []
        if not prefixes:
            raise ArmError(
                400,
                "InvalidRequestFormat",
                "The virtual network needs at least one address prefix.",
                "properties.addressSpace.addressPrefixes",
            )
        networks = [_cidr(p, "properties.addressSpace.addressPrefixes") for p in prefixes]
        resource["properties"] = {
            "addressSpace": {"addressPrefixes": [str(n) for n in networks]},
            "resourceGuid": existing["properties"]["resourceGuid"] if existing else self.guid("vnet"),
            "provisioningState": "Succeeded",
        }
        self.resources[rid.key] = resource  # subnets below find their network
        if "subnets" in props:
            wanted = {s["name"].lower(): s for s in props["subnets"] or []}
            for key in [k for k in self.resources if k.startswith(rid.key + "/subnets/")]:
                if key.rsplit("/", 1)[-1] not in wanted:
                    self._check_delete(ResourceId.parse(key), self.resources[key])
                    self._remove(key)
            for subnet in wanted.values():
                child = ResourceId(
                    rid.subscription, rid.group, rid.namespace, [*rid.types, "subnets"], [*rid.names, subnet["name"]]
                )
                self.resources[child.key] = self._put_network_virtualnetworks_subnets(
                    child, subnet, self.resources.get(child.key)
                ) | {"id": str(child), "name": subnet["name"], "type": child.type_name}
                self.resources[child.key]["properties"]["provisioningState"] = "Succeeded"
        return resource

    def _put_network_virtualnetworks_subnets(self, rid, body, existing):
        vnet = self.resources.get(rid.parent().key)
        if vnet is None:
            raise not_found(str(rid.parent()), "Microsoft.Network/virtualNetworks")
        props = body.get("properties") or {}
        prefix = _cidr(props.get("addressPrefix"), "properties.addressPrefix")
        if not any(
            prefix.subnet_of(ipaddress.ip_network(p)) for p in vnet["properties"]["addressSpace"]["addressPrefixes"]
        ):
            raise ArmError(
                400,
                "NetcfgSubnetRangeOutsideVnet",
                f"Subnet '{rid.name}' is not valid because its IP address range is outside the IP address range "
                "of virtual network.",
            )
        for key, other in self.resources.items():
            sibling = key.startswith(rid.parent().key + "/subnets/") and key != rid.key
            if sibling and prefix.overlaps(ipaddress.ip_network(other["properties"]["addressPrefix"])):
                raise ArmError(
                    400,
                    "NetcfgSubnetRangesOverlap",
                    f"Subnet '{rid.name}' is not valid because its IP address range overlaps with that of "
                    f"an existing subnet in virtual network '{vnet['name']}'.",
                )
        resource = self._base(rid, body, existing, location=False)
        resource["properties"] = {"addressPrefix": str(prefix), "provisioningState": "Succeeded"}
        endpoints = props.get("serviceEndpoints") or []
        if endpoints:
            location = vnet["location"]
            resource["properties"]["serviceEndpoints"] = [
                {
                    "service": e.get("service"),
                    "locations": e.get("locations") or [location],
                    "provisioningState": "Succeeded",
                }
                for e in endpoints
            ]
        self._link(
            resource, props, "networkSecurityGroup", "Microsoft.Network/networkSecurityGroups", "networkSecurityGroup"
        )
        self._link(resource, props, "natGateway", "Microsoft.Network/natGateways", "natGateway")
        if isinstance(props.get("defaultOutboundAccess"), bool):  # egress.py: False makes the subnet private
            resource["properties"]["defaultOutboundAccess"] = props["defaultOutboundAccess"]
        return resource

    def _put_network_natgateways(self, rid, body, existing):
        """A NAT gateway (Standard; its public addresses are not emulated: egress.py counts it as outbound)."""
        resource = self._base(rid, body, existing)
        if (body.get("sku") or {}).get("name") != "Standard":
            raise ArmError(400, "InvalidParameter", "A NAT gateway's sku name must be Standard.", "sku.name")
        resource["sku"] = {"name": "Standard"}
        props = body.get("properties") or {}
        resource["properties"] = {
            "idleTimeoutInMinutes": int(props.get("idleTimeoutInMinutes") or 4),
            "provisioningState": "Succeeded",
        }
        return resource

    def _put_network_applicationsecuritygroups(self, rid, body, existing):
        resource = self._base(rid, body, existing)
        resource["properties"] = {
            "resourceGuid": existing["properties"]["resourceGuid"] if existing else self.guid("asg"),
            "provisioningState": "Succeeded",
        }
        return resource

    def _put_network_networksecuritygroups(self, rid, body, existing):
        resource = self._base(rid, body, existing)
        rules = []
        seen: dict[tuple[str, int], str] = {}
        for index, rule in enumerate((body.get("properties") or {}).get("securityRules") or []):
            target = f"properties.securityRules[{index}]"
            p = rule.get("properties") or {}
            name = rule.get("name")
            if not name:
                raise ArmError(400, "InvalidRequestFormat", "A security rule needs a name.", target)
            priority = p.get("priority")
            if not isinstance(priority, int) or not 100 <= priority <= 4096:
                raise ArmError(
                    400,
                    "SecurityRuleInvalidPriority",
                    f"Security rule {name} has invalid Priority. Value provided: {priority}. Allowed range 100-4096.",
                )
            direction = p.get("direction")
            if direction not in ("Inbound", "Outbound"):
                raise ArmError(
                    400, "InvalidRequestFormat", f"Security rule {name}: direction Inbound or Outbound.", target
                )
            if (direction, priority) in seen:
                raise ArmError(
                    400,
                    "SecurityRuleConflict",
                    f"Security rule {name} conflicts with rule {seen[(direction, priority)]}. Rules cannot have the "
                    "same Priority and Direction.",
                )
            seen[(direction, priority)] = name
            if p.get("access") not in ("Allow", "Deny"):
                raise ArmError(400, "InvalidRequestFormat", f"Security rule {name}: access Allow or Deny.", target)
            if p.get("protocol") not in ("Tcp", "Udp", "Icmp", "Esp", "Ah", "*"):
                raise ArmError(
                    400,
                    "SecurityRuleInvalidProtocol",
                    f"Security rule {name} has invalid protocol {p.get('protocol')}.",
                )
            for side in ("source", "destination"):
                groups = p.get(f"{side}ApplicationSecurityGroups") or []
                for group in groups:
                    self._require(_ref(group), "Microsoft.Network/applicationSecurityGroups", f"{target}.{side}")
                prefixes = [p.get(f"{side}AddressPrefix")] if p.get(f"{side}AddressPrefix") else []
                prefixes += p.get(f"{side}AddressPrefixes") or []
                if bool(groups) == bool(prefixes):
                    raise ArmError(
                        400,
                        "SecurityRuleParameterContainsUnsupportedValue" if groups else "InvalidRequestFormat",
                        f"Security rule {name}: give {side} address prefixes or {side} application security groups.",
                    )
                for prefix in prefixes:
                    if prefix not in ("*", "VirtualNetwork", "Internet", "AzureLoadBalancer"):
                        _cidr(prefix, f"{target}.{side}AddressPrefix")
            rules.append(
                {
                    "name": name,
                    "id": f"{rid}/securityRules/{name}",
                    "type": "Microsoft.Network/networkSecurityGroups/securityRules",
                    "properties": {**p, "provisioningState": "Succeeded"},
                }
            )
        resource["properties"] = {
            "securityRules": rules,
            "defaultSecurityRules": nsg.default_rules(str(rid)),
            "resourceGuid": existing["properties"]["resourceGuid"] if existing else self.guid("nsg"),
            "provisioningState": "Succeeded",
        }
        return resource

    def _addresses_in_use(self, subnet_id: str, except_nic: str | None = None) -> set[str]:
        """Private addresses of the subnet's NICs and of the file systems (AMLFS) in it."""
        return {
            c["properties"].get("privateIPAddress")
            for nic in self._of_type("Microsoft.Network/networkInterfaces")
            if nic["id"].lower() != (except_nic or "").lower()
            for c in nic["properties"]["ipConfigurations"]
            if (_ref(c["properties"].get("subnet")) or "").lower() == subnet_id.lower()
        } | self.amlfs_addresses(subnet_id)

    def _put_network_networkinterfaces(self, rid, body, existing):
        resource = self._base(rid, body, existing)
        props = body.get("properties") or {}
        configs = props.get("ipConfigurations") or []
        if not configs:
            raise ArmError(
                400,
                "InvalidRequestFormat",
                "A network interface needs at least one IP configuration.",
                "properties.ipConfigurations",
            )
        out_configs = []
        for index, config in enumerate(configs):
            target = f"properties.ipConfigurations[{index}]"
            cp = config.get("properties") or {}
            subnet = self._require(
                _ref(cp.get("subnet")), "Microsoft.Network/virtualNetworks/subnets", f"{target}.subnet"
            )
            vnet = self.resources[ResourceId.parse(subnet["id"]).parent().key]
            if vnet["location"] != resource["location"]:
                raise ArmError(
                    400,
                    "InvalidResourceReference",
                    f"Subnet {subnet['id']} is in {vnet['location']}, the network interface in {resource['location']}.",
                )
            network = ipaddress.ip_network(subnet["properties"]["addressPrefix"])
            hosts = list(network.hosts())
            reserved = {str(a) for a in hosts[:3]} | {str(network.broadcast_address)}
            in_use = self._addresses_in_use(subnet["id"], except_nic=str(rid))
            method = cp.get("privateIPAllocationMethod") or ("Static" if cp.get("privateIPAddress") else "Dynamic")
            if method == "Static":
                address = cp.get("privateIPAddress")
                try:
                    ip = ipaddress.ip_address(address)
                except ValueError:
                    raise ArmError(400, "InvalidPrivateIPAddressFormat", f"{address} is not an IP address.") from None
                if ip not in network:
                    raise ArmError(
                        400,
                        "PrivateIPAddressNotInSubnet",
                        f"IP configuration {config.get('name')} is referencing private IP address {address} which "
                        f"is not in subnet {subnet['id']} ({network}).",
                    )
                if str(ip) in reserved:
                    raise ArmError(
                        400,
                        "PrivateIPAddressIsReserved",
                        f"Private static IP address {address} is reserved: Azure keeps the first four addresses "
                        "and the last of every subnet.",
                    )
                if str(ip) in in_use:
                    raise ArmError(
                        400,
                        "PrivateIPAddressInUse",
                        f"IP configuration {config.get('name')} is using the private IP address {address} which is "
                        f"already allocated to resource {self._owner_of(subnet['id'], str(ip))}.",
                    )
            elif method == "Dynamic":
                previous = None
                if existing:
                    previous = next(
                        (
                            c["properties"]["privateIPAddress"]
                            for c in existing["properties"]["ipConfigurations"]
                            if c["name"] == config.get("name")
                        ),
                        None,
                    )
                address = previous or next(
                    (str(a) for a in hosts if str(a) not in reserved and str(a) not in in_use), None
                )
                if address is None:
                    raise ArmError(
                        400,
                        "SubnetIsFull",
                        f"Subnet {subnet['name']} with address prefix {network} does not have "
                        "enough capacity for 1 IP addresses.",
                    )
            else:
                raise ArmError(400, "InvalidRequestFormat", f"privateIPAllocationMethod {method}.", target)
            groups = []
            for group in cp.get("applicationSecurityGroups") or []:
                groups.append(
                    {
                        "id": self._require(
                            _ref(group),
                            "Microsoft.Network/applicationSecurityGroups",
                            f"{target}.applicationSecurityGroups",
                        )["id"]
                    }
                )
            out_configs.append(
                {
                    "name": config.get("name") or "ipconfig1",
                    "id": f"{rid}/ipConfigurations/{config.get('name') or 'ipconfig1'}",
                    "properties": {
                        "privateIPAddress": address,
                        "privateIPAllocationMethod": method,
                        "privateIPAddressVersion": "IPv4",
                        "subnet": {"id": subnet["id"]},
                        "primary": index == 0,
                        "applicationSecurityGroups": groups,
                        "provisioningState": "Succeeded",
                    },
                }
            )
        resource["properties"] = {
            "ipConfigurations": out_configs,
            "enableAcceleratedNetworking": bool(props.get("enableAcceleratedNetworking")),
            "macAddress": existing["properties"]["macAddress"]
            if existing
            else "00-0D-3A-" + "-".join(self.guid("mac")[i : i + 2].upper() for i in (0, 2, 4)),
            "resourceGuid": existing["properties"]["resourceGuid"] if existing else self.guid("nic"),
            "provisioningState": "Succeeded",
        }
        nsg_type = "Microsoft.Network/networkSecurityGroups"
        self._link(resource, props, "networkSecurityGroup", nsg_type, "properties.networkSecurityGroup")
        if existing and existing["properties"].get("virtualMachine"):
            resource["properties"]["virtualMachine"] = existing["properties"]["virtualMachine"]
        return resource

    def check_ip_address_availability(self, vnet: dict, address: str | None) -> dict:
        """Virtual Networks - Check IP Address Availability: whether `address` of one of the network's subnets is
        free (IPAddressAvailabilityResult: available, availableIPAddresses when taken, isPlatformReserved).
        Whoever holds it (a NIC in any resource group, a file system) makes it unavailable. An address
        outside every subnet is refused (InvalidParameter: the twin's strict reading, undocumented)."""
        try:
            ip = ipaddress.ip_address(address or "")
        except ValueError:
            raise ArmError(400, "InvalidParameter", f"'{address}' is not an IP address.", "ipAddress") from None
        for key in sorted(k for k in self.resources if k.startswith(vnet["id"].lower() + "/subnets/")):
            subnet = self.resources[key]
            network = ipaddress.ip_network(subnet["properties"]["addressPrefix"])
            if ip not in network:
                continue
            hosts = list(network.hosts())
            reserved = {str(a) for a in hosts[:3]} | {str(network.network_address), str(network.broadcast_address)}
            if str(ip) in reserved:
                return {"available": False, "isPlatformReserved": True}
            in_use = self._addresses_in_use(subnet["id"])
            if str(ip) not in in_use:
                return {"available": True, "isPlatformReserved": False}
            free = [str(a) for a in hosts if str(a) not in reserved and str(a) not in in_use][:5]
            return {"available": False, "availableIPAddresses": free, "isPlatformReserved": False}
        raise ArmError(
            400, "InvalidParameter", f"IP address {ip} is not in any subnet of virtual network {vnet['name']}.",
            "ipAddress",
        )  # fmt: skip

    def _owner_of(self, subnet_id: str, address: str) -> str:
        for nic in self._of_type("Microsoft.Network/networkInterfaces"):
            for c in nic["properties"]["ipConfigurations"]:
                if (
                    c["properties"]["privateIPAddress"] == address
                    and _ref(c["properties"]["subnet"]).lower() == subnet_id.lower()
                ):
                    return c["id"]
        for fs in self._of_type("Microsoft.StorageCache/amlFilesystems"):
            if fs["properties"]["clientInfo"]["mgsAddress"] == address:
                return fs["id"]
        return "?"

    # --- what the NSGs let through (nsg.py) --------------------------------------------------------

    def flow_verdict(self, vnet_id: str, flow: nsg.Flow) -> nsg.Verdict:
        """Whether Azure's NSGs let a flow between two addresses of one virtual network through: outbound at
        the source (its NIC's NSG, then its subnet's), inbound at the destination (its subnet's, then its
        NIC's). An address no NIC holds (a service's, as an AMLFS's servers) is in the subnet whose range
        holds it: only that subnet's NSG applies to it."""
        vnet = self.resources[vnet_id.lower()]
        scope = nsg.Scope(tuple(vnet["properties"]["addressSpace"]["addressPrefixes"]), self._asg_members(vnet_id))
        source_subnet, source_nic = self._placed(vnet_id, flow.source)
        outbound = nsg.evaluate((self._nsg_of(source_nic), self._nsg_of(source_subnet)), "Outbound", flow, scope)
        if not outbound.allowed:
            return outbound
        subnet, nic = self._placed(vnet_id, flow.destination)
        return nsg.evaluate((self._nsg_of(subnet), self._nsg_of(nic)), "Inbound", flow, scope)

    def _network_configs(self, vnet_id: str):
        """(NIC, IP configuration) of every NIC with an address in the virtual network."""
        prefix = vnet_id.lower() + "/subnets/"
        for nic in self._of_type("Microsoft.Network/networkInterfaces"):
            for config in nic["properties"]["ipConfigurations"]:
                if (_ref(config["properties"].get("subnet")) or "").lower().startswith(prefix):
                    yield nic, config

    def _asg_members(self, vnet_id: str) -> dict[str, frozenset[str]]:
        members: dict[str, set[str]] = {}
        for _, config in self._network_configs(vnet_id):
            for group in config["properties"].get("applicationSecurityGroups") or []:
                members.setdefault(group["id"].lower(), set()).add(config["properties"]["privateIPAddress"])
        return {group: frozenset(addresses) for group, addresses in members.items()}

    def _placed(self, vnet_id: str, address: str) -> tuple[dict | None, dict | None]:
        """(subnet, NIC) of an address of the virtual network; NIC None for an address no NIC holds."""
        for nic, config in self._network_configs(vnet_id):
            if config["properties"]["privateIPAddress"] == address:
                return self.resources.get(_ref(config["properties"]["subnet"]).lower()), nic
        prefix = vnet_id.lower() + "/subnets/"
        for key, subnet in self.resources.items():
            in_network = key.startswith(prefix) and "/" not in key[len(prefix) :]
            if in_network and ipaddress.ip_address(address) in ipaddress.ip_network(
                subnet["properties"]["addressPrefix"]
            ):
                return subnet, None
        return None, None

    def _nsg_of(self, resource: dict | None) -> dict | None:
        """The NSG a subnet or NIC is associated with, if any."""
        ref = _ref(((resource or {}).get("properties") or {}).get("networkSecurityGroup"))
        return self.resources.get(ref.lower()) if ref else None
