"""The azure provider: VMs in an existing virtual network and subnet, found again by their tags.

The compute nodes' VMs, NICs and placement are in a resource group of their own (the only one
the head's power identity may write in), everything else in azure.resource_group; all of it
tagged clusterbake-cluster=<cluster> (resources.py lists what and why). `cluster up` checks
first (checks.py, read-only), then creates what is missing: a re-run creates nothing. Each node
group's VMs are created together; if any of them fails (AllocationFailed, SkuNotAvailable,
quota) the group's new VMs are deleted again and the error names the size, zone and count.
`cluster down` deletes every tagged resource (and purges the soft-deleted vault, and the
resource groups clusterbake created)."""

from __future__ import annotations

import os
from functools import cached_property
from pathlib import Path

from clusterbake.config import ClusterConfig, NodeGroup
from clusterbake.dry_run import CREATE, EXISTS, PlannedResource
from clusterbake.errors import ClusterbakeError, ConfigError
from clusterbake.gpu_systems import infiniband_expectation
from clusterbake.images.store import azure_image_source, find_azure_image
from clusterbake.inventory import build_inventory
from clusterbake.plan import LOGIN_GROUP, NodeSpec
from clusterbake.progress import say
from clusterbake.providers import common
from clusterbake.providers.azure import (
    amlfs,
    billing,
    blobs,
    checks,
    discover,
    image_facts,
    join_secrets,
    power,
    power_settings,
    prices,
    resources,
    storage,
    subnet_addresses,
    tags,
    teardown,
)
from clusterbake.providers.azure.api import (
    Clients,
    azure_error_translation,
    azure_errors,
    caller_identity,
    get_or_none,
    message,
)
from clusterbake.providers.azure.catalogue import Catalogue, SkuInfo, azure_plan, node_hardware, uses_infiniband
from clusterbake.providers.base import BillingCheck, CostEstimate, Price
from clusterbake.providers.cloud import CloudProvider, Machine, Publish
from clusterbake.providers.userdata import user_data
from clusterbake.state import StateDir
from clusterbake.topology import switches


class AzureProvider(CloudProvider):
    machine_noun = "VM"
    create_verb = "creates"
    ready_hint = "check azure.ssh_cidrs / azure.bastion and the VMs' boot diagnostics"
    sdk_errors = staticmethod(azure_error_translation)

    def __init__(self, config: ClusterConfig, state: StateDir, clients: Clients | None = None):
        if config.azure is None:
            raise ConfigError("azure: required with provider azure")
        super().__init__(config, state)
        self.azure = config.azure
        self.login_user, self.bastion = self.azure.admin_user, self.azure.bastion
        self.subnet_field = self.azure.subnet_field
        self.clients = clients or Clients(self.azure.subscription_id)
        self._subnet: checks.Subnet | None = None
        self._infos: dict[str, SkuInfo] | None = None

    # --- what the config means on Azure ----------------------------------------------------

    @cached_property
    def catalogue(self) -> Catalogue:
        return Catalogue(self.clients.compute, self.azure.location)

    @property
    def infos(self) -> dict[str, SkuInfo]:
        if self._infos is None:
            self._infos = checks.check_sizes(self.config, self.catalogue)
        return self._infos

    @property
    def subnet(self) -> checks.Subnet:
        if self._subnet is None:
            self._subnet = checks.check_subnet(self.clients.network, self.config)
        return self._subnet

    def planned(self) -> list[NodeSpec]:
        """Every planned node with its Slurm spec from the VM sizes (azure_plan)."""
        return azure_plan(self.config, self.infos)

    def _wants_placement_group(self, group: NodeGroup) -> bool:
        return True if group.placement_group is None else group.placement_group

    @property
    def nodes_group(self) -> str:
        """The compute nodes' resource group (resources.nodes_group_name)."""
        return resources.nodes_group_name(
            self.config.cluster_name, self.azure.resource_group, self.azure.nodes_resource_group
        )

    def _group_of(self, nodegroup: str) -> str:
        """Where a node group's VMs and NICs are: the head's and the login nodes' in azure.resource_group
        (the head's power identity writes none of them), compute nodes' in theirs."""
        return self.azure.resource_group if nodegroup in ("head", LOGIN_GROUP) else self.nodes_group

    @property
    def vault_name(self) -> str:
        return self.azure.key_vault_name or resources.vault_name(
            self.config.cluster_name, self.azure.subscription_id, self.azure.resource_group
        )

    def _free_addresses(self, machines: dict[str, Machine]) -> dict[str, str]:
        """Every planned node's address (addresses()), none that another resource of the subnet holds
        (subnet_addresses: its IP configurations'; those this caller cannot read are asked about)."""
        network, subnet = self.clients.network, self.subnet.id
        held = subnet_addresses.held(network, subnet)
        in_use = set(held.addresses)
        addresses = self.addresses(machines, in_use=in_use)
        if not held.unread:
            return addresses
        say(f"    {len(held.unread)} IP configuration(s) of the subnet not readable here (another resource "
            "group's): asking the virtual network which addresses are free")  # fmt: skip
        asked = {m.address for m in machines.values()}  # ours: held by the cluster's own NICs
        while new := sorted(set(addresses.values()) - asked):
            asked |= set(new)
            taken = subnet_addresses.taken(network, subnet, new)
            if not taken:
                break
            in_use |= taken
            addresses = self.addresses(machines, in_use=in_use)
        return addresses

    @property
    def subnet_cidr(self) -> str:
        return self.subnet.prefix

    # --- discovery ------------------------------------------------------------------------

    def machines(self, power: bool = False) -> dict[str, Machine]:
        """The cluster's VMs by node name (`power`: each one's power state; a few list calls, discover.py)."""
        return discover.machines_of(self.cluster_vms(power=power))

    def cluster_vms(self, power: bool = False) -> dict[str, dict]:
        """The cluster's VMs by node name, from both its resource groups (discover.cluster_vms)."""
        return discover.cluster_vms(self.clients, self.config.cluster_name, self._groups(), power=power)

    def _groups(self) -> list[str]:
        """The cluster's resource groups that exist: the compute nodes' first (`cluster down`'s order)."""
        get = self.clients.resources.resource_groups.get
        return [rg for rg in (self.nodes_group, self.azure.resource_group) if get_or_none(get, rg) is not None]

    # --- lifecycle ------------------------------------------------------------------------

    def find_image(self) -> str:
        """azure.image, else the image the image store recorded (images/azure-latest.json)."""
        return find_azure_image(self.config, self.state)

    @azure_errors
    def validate(self) -> None:
        """Subnet, VM sizes (location, zone, restrictions, InfiniBand, spot), quota, room in the subnet:
        read-only calls."""
        self._subnet = checks.check_subnet(self.clients.network, self.config)
        checks.check_outbound(self._subnet, self.config, self.powered)
        self._check_nodes_group()
        storage.check_service_endpoint(self._subnet, self.config)
        blobs.check_existing(self.clients.storage, self.config)
        amlfs.check(self.clients.storagecache, self.config, self._subnet.id)
        self._infos = checks.check_sizes(self.config, self.catalogue)
        checks.check_quota(self.config, self.clients.compute, self._infos, set(self.cluster_vms()))
        self.addresses()  # a subnet too small for the planned nodes is a config error

    def check_image(self, image: Path | str) -> None:
        """The image exists, boots on every size and takes azure.security_type (image_facts)."""
        field = azure_image_source(self.config, self.state)
        facts = image_facts.read(self.clients.compute, str(image), field)
        sizes = [(f, self.infos[size]) for f, size in common.instance_type_fields(self.config)]
        image_facts.check_fits(facts, str(image), field, self.azure.security_type, sizes)

    @azure_errors
    def provision(self, image: Path | str | None) -> None:
        image = str(image) if image else self.find_image()
        self.check_image(image)
        rg = self.azure.resource_group
        self.cluster.ensure_secrets()
        self._ensure_group()
        asg_id = self._ensure_asg()
        login_asg_id = self._ensure_asg(login=True) if self.config.login_nodes else None
        nsg_id = self._ensure_nsg(asg_id, login_asg_id)
        storage.ensure(self.clients.storage, self.config, self.subnet.id)
        blobs.ensure(self.clients.storage, self.config, self.subnet.id)
        # Azure takes minutes to make a Lustre file system: started now, waited for before the VMs.
        lustre = amlfs.start(self.clients.storagecache, self.config, self.subnet.id)
        identity = self._ensure_identity()
        blobs.grant(self.clients.authorization, self.config, identity["principal_id"])
        vault_url = self._ensure_vault(identity["principal_id"])
        head_identity = self._ensure_power(image, identity["id"], [nsg_id, asg_id]) if self.powered else None
        placement = {}
        for group in self.config.node_groups:
            placement[group.name] = self._ensure_group_placement(group)
        existing = self.cluster_vms()
        addresses = self._free_addresses(discover.machines_of(existing))
        planned = self.planned()
        static = [n for n in planned if not n.elastic]
        extra = sorted(set(existing) - {n.name for n in planned})
        if extra:
            say(f"    warning: VMs not in the config: {', '.join(extra)} (`cluster down` removes them)")
        if head_identity is not None and "head" in existing:
            self._ensure_head_identities(existing["head"], identity, head_identity)
        self._start_stopped({n.name: existing[n.name] for n in static if n.name in existing})
        missing = [n for n in static if n.name not in existing]
        if not missing:
            say(f"    all {len(static)} nodes exist")
        public_key = self.cluster.ssh_key.with_suffix(".pub").read_text().strip()
        context = {
            "image": image,
            "nsg_id": nsg_id,
            # Each role's application security groups: the login nodes' own besides the cluster's.
            "asg_ids": {"head": [asg_id], "compute": [asg_id], "login": [asg_id, login_asg_id]},
            "identity": identity,
            "head_identity": head_identity,
            "vault_url": vault_url,
            "public_key": public_key,
        }
        amlfs.wait(lustre)  # the nodes mount them as they join
        failures = []
        for nodegroup in ["head", *self.self_joining_groups()]:
            nodes = [n for n in missing if n.nodegroup == nodegroup]
            if nodes:
                try:
                    self._create_group(nodegroup, nodes, addresses, placement.get(nodegroup, {}), context)
                except ClusterbakeError as exc:
                    failures.append(str(exc))
        self._write_state(image, addresses, vault_url, identity, head_identity)
        if failures:
            raise ClusterbakeError("\n".join(failures))
        say(f"    {len(static)} nodes provisioned in {rg} (the head) and {self.nodes_group}")
        if len(planned) > len(static):
            say(f"    {len(planned) - len(static)} elastic node(s) powered up by Slurm for jobs")

    def _ensure_group(self) -> None:
        for rg in (self.azure.resource_group, self.nodes_group):
            self._ensure_one_group(rg)

    def _created_by_us(self, group) -> bool:
        group_tags = group.tags or {}
        return group_tags.get(tags.CREATED_GROUP) == "true" and group_tags.get(tags.CLUSTER) == self.config.cluster_name

    def _check_nodes_group(self) -> None:
        """The compute nodes' group is the cluster's alone: the head's power identity may write every VM there."""
        found = get_or_none(self.clients.resources.resource_groups.get, self.nodes_group)
        if found is not None and not self._created_by_us(found):
            field = "azure.nodes_resource_group" if self.azure.nodes_resource_group else "azure.resource_group"
            raise ConfigError(
                f"{field}: resource group {self.nodes_group} (the compute nodes') exists but clusterbake did not "
                f"create it for cluster {self.config.cluster_name}, and the head's power identity may write every "
                "VM there. Set azure.nodes_resource_group to a group that does not exist yet"
            )

    def _ensure_one_group(self, rg: str) -> None:
        api = self.clients.resources.resource_groups
        found = get_or_none(api.get, rg)
        if found is None:
            api.create_or_update(
                rg,
                {
                    "location": self.azure.location,
                    "tags": {**tags.cluster_tags(self.config.cluster_name), tags.CREATED_GROUP: "true"},
                },
            )
            say(f"    resource group {rg} created")
        elif found.location.replace(" ", "").lower() != self.azure.location:
            say(
                f"    note: resource group {rg} is in {found.location}; "
                f"the cluster's resources go to {self.azure.location}"
            )

    def _ensure_asg(self, login: bool = False) -> str:
        """The cluster's application security group, or (`login`) the login nodes'."""
        cluster = self.config.cluster_name
        name = common.resource_name(cluster, LOGIN_GROUP) if login else resources.cluster_name(cluster)
        body = {"location": self.azure.location, "tags": tags.cluster_tags(self.config.cluster_name)}
        found, created = self._find_or_create(self.clients.network.application_security_groups, name, body, poll=True)
        if created:
            say(f"    application security group {name} created")
        else:
            self._owned(found.tags, f"application security group {name}")
        return found.id

    def _ensure_nsg(self, asg_id: str, login_asg_id: str | None) -> str:
        name = resources.cluster_name(self.config.cluster_name)
        api = self.clients.network.network_security_groups
        lustre = amlfs.server_prefixes(self.clients.network, self.clients.storagecache, self.config, self.subnet)
        login = (login_asg_id, self.config.login_nodes.ssh_cidrs) if login_asg_id else None
        rules = resources.security_rules(asg_id, self.azure.ssh_cidrs, lustre, login)
        found = get_or_none(api.get, self.azure.resource_group, name)
        if found is not None:
            self._owned(found.tags, f"network security group {name}")
            if not resources.rules_differ(found.security_rules or [], rules):
                return found.id
        result = api.begin_create_or_update(
            self.azure.resource_group,
            name,
            {
                "location": self.azure.location,
                "tags": tags.cluster_tags(self.config.cluster_name),
                "properties": {"securityRules": rules},
            },
        ).result()
        lustre_note = f", Lustre from {', '.join(lustre)}" if lustre else ""
        say(
            f"    network security group {name} {'updated' if found else 'created'} (SSH from {self.azure.ssh_cidrs}"
            f"{lustre_note})"
        )
        return result.id

    @property
    def powered(self) -> bool:
        """The head's power program starts nodes: elastic ones, or lost static ones it replaces
        (recovery.replace_lost_nodes)."""
        return any(g.elastic for g in self.config.node_groups) or (
            self.config.recovery.replace_lost_nodes and any(g.static_count for g in self.config.node_groups)
        )

    def _identity_ids(self, node: NodeSpec, context: dict) -> list[str]:
        """Every VM has the nodes' identity; the head of an elastic cluster also its own (power.py)."""
        ids = [context["identity"]["id"]]
        if node.role == "head" and context.get("head_identity"):
            ids.append(context["head_identity"]["id"])
        return ids

    def _ensure_power(self, image: str, nodes_identity: str, security_groups: list[str]) -> dict:
        """The head's identity and what it may do (power.py): the custom role and its assignments, and
        giving VMs the nodes' identity (`nodes_identity`, its resource id); a NIC joins `security_groups`."""
        head = self._ensure_identity(power.head_identity_name(self.config.cluster_name))
        assignable, assigned = power.scopes(
            self.azure.subscription_id, self.nodes_group, [self.subnet.id, *security_groups], image
        )
        auth = self.clients.authorization
        role = power.ensure_role(
            auth, self.azure.subscription_id, self.azure.resource_group, self.config.cluster_name, assignable
        )
        made = power.ensure_grants(
            auth, self.azure.subscription_id, head["principal_id"], role, assigned, nodes_identity
        )
        if made:
            say(f"    head's identity: {made} role assignment(s) made or removed to power nodes up and down")
        return head

    def _ensure_head_identities(self, head_vm: dict, identity: dict, head_identity: dict) -> None:
        """A head created before the cluster had elastic groups gets its power identity too."""
        vm = self.clients.compute.virtual_machines.get(self.azure.resource_group, head_vm["name"])
        have = {k.lower() for k in ((vm.identity.user_assigned_identities or {}) if vm.identity else {})}
        if head_identity["id"].lower() in have:
            return
        ids = {i: {} for i in sorted({identity["id"], head_identity["id"], *have})}
        self.clients.compute.virtual_machines.begin_update(
            self.azure.resource_group,
            head_vm["name"],
            {"identity": {"type": "UserAssigned", "userAssignedIdentities": ids}},
        ).result()
        say(f"    head {head_vm['name']}: identity {power.head_identity_name(self.config.cluster_name)} added")

    def _ensure_identity(self, name: str | None = None) -> dict:
        name = name or resources.identity_name(self.config.cluster_name)
        body = {"location": self.azure.location, "tags": tags.cluster_tags(self.config.cluster_name)}
        found, created = self._find_or_create(self.clients.msi.user_assigned_identities, name, body)
        if created:
            say(f"    managed identity {name} created")
        else:
            self._owned(found.tags, f"managed identity {name}")
        return {"id": found.id, "principal_id": found.principal_id, "client_id": found.client_id}

    def _identity(self, name: str | None = None) -> dict | None:
        """An identity of the cluster ({id, principal_id, client_id}; default the nodes'), None before
        `cluster up` made it."""
        name = name or resources.identity_name(self.config.cluster_name)
        found = get_or_none(self.clients.msi.user_assigned_identities.get, self.azure.resource_group, name)
        if found is None:
            return None
        return {"id": found.id, "principal_id": found.principal_id, "client_id": found.client_id}

    def _ensure_vault(self, node_principal: str) -> str:
        name = self.vault_name
        api = self.clients.keyvault.vaults
        caller, tenant = caller_identity()
        policies = [
            {"tenantId": tenant, "objectId": caller, "permissions": {"secrets": ["get", "set", "list", "delete"]}},
            {"tenantId": tenant, "objectId": node_principal, "permissions": {"secrets": ["get"]}},
        ]
        found = get_or_none(api.get, self.azure.resource_group, name)
        if found is None and get_or_none(api.get_deleted, name, self.azure.location) is not None:
            # A vault of this name was deleted (soft delete keeps it for its retention days): recover it.
            api.begin_create_or_update(
                self.azure.resource_group,
                name,
                {
                    "location": self.azure.location,
                    "properties": {
                        "tenantId": tenant,
                        "sku": {"family": "A", "name": "standard"},
                        "createMode": "recover",
                    },
                },
            ).result()
            say(f"    key vault {name} recovered (it was soft-deleted)")
            found = get_or_none(api.get, self.azure.resource_group, name)
        if found is not None:
            self._owned(found.tags, f"key vault {name}")
            self._add_access_policies(found, policies)
            return found.properties.vault_uri
        vault = api.begin_create_or_update(
            self.azure.resource_group,
            name,
            {
                "location": self.azure.location,
                "tags": tags.cluster_tags(self.config.cluster_name),
                "properties": {
                    "tenantId": tenant,
                    "sku": {"family": "A", "name": "standard"},
                    "accessPolicies": policies,
                    "enableRbacAuthorization": False,
                },
            },
        ).result()
        say(f"    key vault {name} created ({vault.properties.vault_uri})")
        return vault.properties.vault_uri

    def _add_access_policies(self, vault, policies: list[dict]) -> None:
        """Add what `policies` grant and the vault's policies lack, with the "add" operation (it merges
        permissions into an entry of the same object): a PUT of the vault would replace every policy, and
        drop those another operator of the cluster added."""
        have: dict[str, set[str]] = {}
        for policy in vault.properties.access_policies or []:
            have.setdefault(policy.object_id, set()).update(p.lower() for p in policy.permissions.secrets or [])
        missing = [p for p in policies if not set(p["permissions"]["secrets"]) <= have.get(p["objectId"], set())]
        if not missing:
            return
        self.clients.keyvault.vaults.update_access_policy(
            self.azure.resource_group, vault.name, "add", {"properties": {"accessPolicies": missing}}
        )
        say(f"    key vault {vault.name}: access policies added for {len(missing)} principal(s)")

    def _ensure_group_placement(self, group: NodeGroup) -> dict:
        """The group's proximity placement group and (InfiniBand) availability set ids."""
        cluster = self.config.cluster_name
        name = resources.group_resource_name(cluster, group.name)
        result: dict = {}
        zone = {"zones": [self.azure.zone]} if self.azure.zone else {}
        if self._wants_placement_group(group):
            body = {
                "location": self.azure.location,
                "tags": tags.node_tags(cluster, "compute", group.name),
                "properties": {"proximityPlacementGroupType": "Standard", "intent": {"vmSizes": group.types}},
                **zone,
            }
            found, created = self._find_or_create(
                self.clients.compute.proximity_placement_groups, name, body, group=self.nodes_group
            )
            if created:
                say(f"    proximity placement group {name} created")
            result["placement_group"] = found.id
        if uses_infiniband(group, self.infos[group.instance_type]):
            body = resources.availability_set_body(
                location=self.azure.location,
                node_tags=tags.node_tags(cluster, "compute", group.name),
                placement_group_id=result.get("placement_group"),
            )
            found, created = self._find_or_create(
                self.clients.compute.availability_sets, name, body, group=self.nodes_group
            )
            if created:
                say(f"    availability set {name} created (one InfiniBand fabric for the group)")
            result["availability_set"] = found.id
        return result

    def _find_or_create(self, api, name: str, body: dict, poll: bool = False, group: str | None = None) -> tuple:
        """(resource, created): `name` in `group` (default azure.resource_group), else created from `body`
        (with begin_create_or_update and its poller's result when `poll`)."""
        rg = group or self.azure.resource_group
        found = get_or_none(api.get, rg, name)
        if found is not None:
            return found, False
        if poll:
            return api.begin_create_or_update(rg, name, body).result(), True
        return api.create_or_update(rg, name, body), True

    def _owned(self, resource_tags: dict | None, what: str) -> None:
        if (resource_tags or {}).get(tags.CLUSTER) != self.config.cluster_name:
            raise ClusterbakeError(
                f"{what} in {self.azure.resource_group} exists but is not tagged "
                f"{tags.CLUSTER}={self.config.cluster_name}; rename the cluster or delete it"
            )

    def _join_source(self, node: NodeSpec, context: dict) -> dict | None:
        if node.role == "head":
            return None  # the head is configured by Ansible
        return {
            "cloud": "azure",
            "vault_url": context["vault_url"],
            "secret_name": resources.secret_name(node.nodegroup),
            "client_id": context["identity"]["client_id"],
        }

    def _create_group(
        self, nodegroup: str, nodes: list[NodeSpec], addresses: dict[str, str], placement: dict, context: dict
    ) -> None:
        """Create the group's missing VMs together; all or nothing: a failure deletes what this call created."""
        cluster = self.config.cluster_name
        rg = self._group_of(nodegroup)
        group = self._group(nodegroup)
        size = self._instance_type(nodes[0])
        zone_text = f" zone {self.azure.zone}" if self.azure.zone else ""
        say(f"    creating {len(nodes)} x {size} ({nodegroup}) in {self.azure.location}{zone_text}")
        network = self.clients.network.network_interfaces
        compute = self.clients.compute.virtual_machines
        nic_pollers = {}
        hardware = node_hardware(self.infos, group.types if group else [size])
        for node in nodes:
            node_tags = tags.node_tags(cluster, node.role, node.nodegroup, node.name)
            body = resources.nic_body(
                location=self.azure.location,
                subnet_id=self.subnet.id,
                address=addresses[node.name],
                nsg_id=context["nsg_id"],
                asg_ids=context["asg_ids"][node.role],
                node_tags=node_tags,
                accelerated_networking=hardware["accelerated_networking"],
            )
            nic_pollers[node.name] = network.begin_create_or_update(rg, resources.nic_name(cluster, node.name), body)
        errors: dict[str, str] = {}
        nics = {}
        for name, poller in nic_pollers.items():
            try:
                nics[name] = poller.result().id
            except Exception as exc:  # collected: the group is rolled back below
                errors[name] = message(exc)
        vm_pollers = {}
        for node in nodes:
            if node.name not in nics or errors:
                continue
            body = resources.vm_body(
                location=self.azure.location,
                zone=self.azure.zone,
                size=size,
                image=context["image"],
                computer_name=node.name,
                admin_user=self.azure.admin_user,
                public_key=context["public_key"],
                custom_data=user_data(
                    cluster=cluster,
                    hostname=node.name,
                    ssh_user=self.azure.admin_user,
                    authorized_keys=[context["public_key"]],
                    join=self._join_source(node, context),
                ),
                nic_id=nics[node.name],
                identity_ids=self._identity_ids(node, context),
                node_tags=tags.node_tags(cluster, node.role, node.nodegroup, node.name),
                spot=bool(group and group.spot),
                placement_group_id=placement.get("placement_group"),
                availability_set_id=placement.get("availability_set"),
                premium_disk=hardware["premium_disk"],
                security_type=self.azure.security_type,
            )
            try:
                vm_pollers[node.name] = compute.begin_create_or_update(rg, resources.vm_name(cluster, node.name), body)
            except Exception as exc:  # collected: the group is rolled back below
                errors[node.name] = message(exc)
        for name, poller in vm_pollers.items():
            try:
                poller.result()
            except Exception as exc:
                errors[name] = message(exc)
        if not errors:
            return
        say(f"    {nodegroup}: {len(errors)} of {len(nodes)} VMs failed; deleting the group's new VMs")
        deleting = [compute.begin_delete(rg, resources.vm_name(cluster, n)) for n in vm_pollers]
        for poller in deleting:
            poller.result()
        for name in nics:  # NICs of VMs that were never created (a VM's own goes with it)
            get_or_none(lambda n=name: network.begin_delete(rg, resources.nic_name(cluster, n)).result())
        first = sorted(errors.items())[0]
        raise ClusterbakeError(
            f"node group {nodegroup}: Azure could not create {len(nodes)} x {size} in {self.azure.location}"
            f"{zone_text} ({first[0]}: {first[1]}); none of the group's new VMs was kept. Try another zone "
            "(azure.zone), another size, fewer nodes, or later"
        )

    def _start_stopped(self, existing: dict[str, dict]) -> None:
        if not existing:
            return
        vms = self.cluster_vms(power=True)
        stopped = [vm for name, vm in vms.items() if name in existing and vm.get("power") in ("deallocated", "stopped")]
        if not stopped:
            return
        say(f"    starting {len(stopped)} stopped VM(s)")
        pollers = [self.clients.compute.virtual_machines.begin_start(vm["group"], vm["name"]) for vm in stopped]
        for poller in pollers:
            poller.result()

    def _write_state(
        self, image: str, addresses: dict[str, str], vault_url: str, identity: dict, head_identity: dict | None
    ) -> None:
        vms = self.cluster_vms()
        nodes: dict[str, dict] = {name: {"address": address} for name, address in addresses.items()}
        for name, vm in vms.items():
            if name in nodes:
                nodes[name] = {"vm_id": vm["id"], "address": vm.get("address") or addresses[name]}
        self.cluster.write_state(
            {
                "cluster": self.config.cluster_name,
                "provider": "azure",
                "image": image,
                "subscription_id": self.azure.subscription_id,
                "location": self.azure.location,
                "zone": self.azure.zone,
                "resource_group": self.azure.resource_group,
                "nodes_resource_group": self.nodes_group,
                "key_vault": vault_url,
                "identity": identity,
                "head_identity": head_identity,
                "nodes": dict(sorted(nodes.items())),
            }
        )

    def _check_bundle(self, group: str, bundle: str) -> None:
        join_secrets.pack(group, bundle)

    @azure_errors
    def _bundle_publisher(self) -> Publish:
        """A group's bundle in the vault (join_secrets.py), when it changed. Running VMs take it at their
        next boot (no refresh on a live node yet)."""
        vault = get_or_none(self.clients.keyvault.vaults.get, self.azure.resource_group, self.vault_name)
        if vault is None:
            raise ClusterbakeError(f"key vault {self.vault_name} is missing; run `clusterbake cluster up`")
        client = self.clients.secrets(vault.properties.vault_uri)
        secret_tags = tags.cluster_tags(self.config.cluster_name)

        def publish(group: str, bundle: str) -> tuple[list[str], bool]:
            return join_secrets.publish(client, group, bundle, secret_tags, vault.properties.vault_uri), False

        return publish

    @azure_errors
    def start_node(self, name: str) -> None:
        self.node(name)
        vm = self.cluster_vms(power=True).get(name)
        if vm is None:
            raise self._missing(name)
        if vm.get("power") not in ("running", "starting"):
            self.clients.compute.virtual_machines.begin_start(vm["group"], vm["name"]).result()

    @azure_errors
    def stop_node(self, name: str) -> None:
        self.node(name)
        vm = self.cluster_vms(power=True).get(name)
        if vm is None or vm.get("power") == "deallocated":
            return
        self.tell_slurm_down(name, "stopped by clusterbake node stop")
        # Deallocate: a stopped (powered off) VM still bills its compute.
        self.clients.compute.virtual_machines.begin_deallocate(vm["group"], vm["name"]).result()

    @azure_errors
    def destroy(self) -> list[str]:
        """Delete every resource tagged clusterbake-cluster=<cluster> (teardown.destroy_cluster)."""
        return teardown.destroy_cluster(self)

    def _tagged(self, rg: str) -> list:
        """The cluster's tagged resources in `rg` (none when the group does not exist)."""
        api = self.clients.resources
        if get_or_none(api.resource_groups.get, rg) is None:
            return []
        return list(api.resources.list_by_resource_group(rg, filter=tags.tag_filter(self.config.cluster_name)))

    # --- queries --------------------------------------------------------------------------

    @azure_errors
    def cost(self) -> CostEstimate:
        """Each VM Azure bills compute for, at its priority's price now (billing.py, prices.py)."""
        location = self.azure.location
        return billing.estimate(self.cluster_vms(power=True), lambda size, spot: prices.vm_price(location, size, spot))

    # --- `cluster up --dry-run` (dry_run.py) ---------------------------------------------------

    machine_kind = "VM"
    cost_not_included = tuple(billing.NOT_INCLUDED)

    def machine_price(self, instance_type: str, market: str) -> Price:
        return prices.vm_price(self.azure.location, instance_type, market == "spot")

    def _planned_group_resources(self) -> list[tuple[str, str, str, str]]:
        """(kind, resource group, ARM type, name) of what provision() makes besides the VMs and NICs."""
        cluster, rg, nodes = self.config.cluster_name, self.azure.resource_group, self.nodes_group
        network, compute = "Microsoft.Network", "Microsoft.Compute"
        identities = "Microsoft.ManagedIdentity/userAssignedIdentities"
        planned = [
            ("application security group", rg, f"{network}/applicationSecurityGroups", resources.cluster_name(cluster)),
            ("network security group", rg, f"{network}/networkSecurityGroups", resources.cluster_name(cluster)),
            ("managed identity (nodes)", rg, identities, resources.identity_name(cluster)),
            ("Key Vault", rg, "Microsoft.KeyVault/vaults", self.vault_name),
        ]
        if self.config.login_nodes is not None:
            name = common.resource_name(cluster, LOGIN_GROUP)
            planned.append(
                ("application security group (login nodes)", rg, f"{network}/applicationSecurityGroups", name)
            )
        if self.powered:
            planned.append(("managed identity (head)", rg, identities, power.head_identity_name(cluster)))
        accounts = {(s.account, "file shares") for s in storage.shares(self.config) if s.owned}
        accounts |= {(c.account, "blob containers") for c in blobs.containers(self.config) if c.owned}
        for account, purpose in sorted(accounts):
            planned.append((f"storage account ({purpose})", rg, "Microsoft.Storage/storageAccounts", account))
        for fs in amlfs.file_systems(self.config):
            if fs.name:
                planned.append(("Managed Lustre file system", rg, "Microsoft.StorageCache/amlFilesystems", fs.name))
        for group in self.config.node_groups:
            name = resources.group_resource_name(cluster, group.name)
            if self._wants_placement_group(group):
                planned.append(("proximity placement group", nodes, f"{compute}/proximityPlacementGroups", name))
            if uses_infiniband(group, self.infos[group.instance_type]):
                planned.append(("availability set (InfiniBand)", nodes, f"{compute}/availabilitySets", name))
        return planned

    @azure_errors
    def cluster_resources(self) -> list[PlannedResource]:
        """The resource groups and what provision() makes in them, each there already or to create (read-only)."""
        groups = list(dict.fromkeys([self.azure.resource_group, self.nodes_group]))
        result, present = [], {}
        for group in groups:
            exists = self.clients.resources.resource_groups.check_existence(group)
            result.append(PlannedResource("resource group", group, EXISTS if exists else CREATE))
            listed = self.clients.resources.resources.list_by_resource_group(group) if exists else []
            present[group.lower()] = {(r.type.lower(), r.name.lower()) for r in listed}
        for kind, group, arm_type, name in self._planned_group_resources():
            found = (arm_type.lower(), name.lower()) in present.get(group.lower(), set())
            result.append(PlannedResource(kind, name, EXISTS if found else CREATE))
        return result

    def billing_leftovers(self) -> BillingCheck:
        """Read-only, after destroy(): what of the cluster is left in its resource group and bills."""
        return billing.leftovers(
            self.clients.resources,
            self.clients.compute,
            [self.nodes_group, self.azure.resource_group],
            self.config.cluster_name,
        )

    @azure_errors
    def inventory(self) -> dict:
        """Every planned node at its planned address, with `clusterbake_running` from the VM's instance
        view; VMs tagged clusterbake-cluster (CLUSTERBAKE_CLUSTER or the config's name). A cluster
        without any VM (not provisioned) has no hosts."""
        cluster = os.environ.get("CLUSTERBAKE_CLUSTER") or self.config.cluster_name
        if cluster != self.config.cluster_name:
            self.config = self.config.model_copy(update={"cluster_name": cluster})
        vms = self.cluster_vms(power=True)
        extra = {**self._connection_vars(), "node_join_self_join": True}
        if any(entry.type == "nfs" for entry in self.config.effective_storage()):
            extra["clusterbake_subnet_cidr"] = self.subnet.prefix
        endpoints = {}
        if storage.shares(self.config):
            endpoints |= storage.endpoints(self.clients.storage, self.config)
        if blobs.containers(self.config):
            endpoints |= blobs.endpoints(self.clients.storage, self.config)
            # blobfuse2 reads the containers with the nodes' identity (role blobfuse2's azstorage appid).
            identity = self._identity()
            if identity is not None:
                extra["blobfuse2_identity_client_id"] = identity["client_id"]
        if amlfs.file_systems(self.config):
            endpoints |= amlfs.endpoints(self.clients.storagecache, self.config)
        if endpoints:
            extra["clusterbake_storage_endpoints"] = endpoints
        if self.powered:
            settings = power_settings.settings(self)
            if settings is not None:
                extra |= {"slurm_power_provider": "azure", "slurm_power_azure": settings}
        if not vms:
            return build_inventory(self.config, [], {}, extra_vars=extra)
        addresses = self.addresses(discover.machines_of(vms))
        nodes = self.planned()
        hostvars = {}
        for node in nodes:
            vm = vms.get(node.name)
            group = self._group(node.nodegroup)
            placement = None
            if group is not None and self._wants_placement_group(group):
                placement = resources.group_resource_name(self.config.cluster_name, group.name)
            hostvars[node.name] = {
                "clusterbake_vm_id": vm["id"] if vm else None,
                "clusterbake_vm_name": vm["name"] if vm else resources.vm_name(self.config.cluster_name, node.name),
                "clusterbake_instance_type": self._instance_type(node),
                "clusterbake_zone": (vm or {}).get("zone") or self.azure.zone,
                "clusterbake_location": self.azure.location,
                "clusterbake_placement_group": placement,
                "clusterbake_availability_set": ((vm or {}).get("availability_set") or "").rsplit("/", 1)[-1] or None,
                "clusterbake_power_state": (vm or {}).get("power", "absent"),
                "clusterbake_running": bool(vm and vm.get("power") == "running"),
            }
            expected = infiniband_expectation(self._instance_type(node)) if "ib" in node.features else None
            if expected:  # the ports and rate the size has (role node_health drains a node short of them)
                hostvars[node.name]["node_health_infiniband"] = expected
        if fabrics := self._fabric_paths(nodes):
            extra["clusterbake_topology"] = switches(fabrics, [n.name for n in nodes if n.role == "compute"])
        return build_inventory(self.config, nodes, addresses, extra_vars=extra, extra_hostvars=hostvars)

    def _fabric_paths(self, nodes: list[NodeSpec]) -> dict[str, list[str]]:
        """Where compute nodes hang, as Azure documents it for its HPC sizes: VMs reach each other over
        InfiniBand only within one availability set (or scale set placement group) ("Enable InfiniBand",
        Azure HPC docs), and each InfiniBand group has one (placement). Each such group's nodes, elastic
        ones too (their set is fixed before they launch), under a leaf switch named after its set; the
        others unplaced (clusterbake.topology)."""
        paths = {}
        for node in nodes:
            group = self._group(node.nodegroup) if node.role == "compute" else None
            if group is not None and uses_infiniband(group, self.infos.get(group.instance_type)):
                paths[node.name] = [resources.group_resource_name(self.config.cluster_name, group.name)]
        return paths

    def _connection_extra(self) -> dict:
        return {"clusterbake_azure_location": self.azure.location, "fabric_socket_ifname": self.azure.network_interface}

    def _pin_host_keys(self, node: str, machine: Machine) -> None:
        """The node's host keys from its serial console log (boot diagnostics, managed storage: a
        short-lived SAS URI from retrieveBootDiagnosticsData, the blob read with it)."""
        rg, vm_name = machine.record["group"], machine.label

        def console() -> str:
            import requests  # azure-core's transport; proxy and CA settings from the environment as ARM's

            data = self.clients.compute.virtual_machines.retrieve_boot_diagnostics_data(
                rg, vm_name, sas_uri_expiration_time_in_minutes=5
            )
            answer = requests.get(data.serial_console_log_blob_uri, timeout=60)
            if answer.status_code == 404:  # nothing written yet
                return ""
            answer.raise_for_status()
            return answer.text

        common.pin_from_console(
            self.cluster,
            node,
            machine.address,
            console,
            f"`az vm boot-diagnostics get-boot-log -g {rg} -n {vm_name}`",
        )
