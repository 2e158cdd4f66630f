"""Azure Managed Lustre (AMLFS) file systems for the config's `amlfs` storage entries.

An entry with `mgs_address` names an existing file system: nothing is created, checked or
deleted; the nodes mount `<mgs_address>@tcp:/<fs_name>`. Any other entry is a file system
of the cluster (Microsoft.StorageCache/amlFilesystems, azure-mgmt-storagecache), as
Microsoft's "Create an Azure Managed Lustre file system" describes it:

- name `clusterbake-<cluster>-<entry>`, tagged clusterbake-cluster (and clusterbake-retain
  when the entry says retain: `cluster down` keeps it), in azure.resource_group;
- `sku`, `storageCapacityTiB` (the config checks the SKU's steps), `filesystemSubnet` (the
  entry's subnet_id or the cluster's subnet), one zone (the entry's or azure.zone), the
  weekly 30-minute `maintenanceWindow`; root squash off (`mode: None`): the head sets the
  mode of the file system's root as root, as it does on the other shared file systems;
- before anything is created (validate): Azure's own subnet check, `checkAmlFSSubnets`
  (the subnet's size and free addresses for this SKU and size), its refusal a ConfigError
  naming the entry; a warning for a file system that would go into the cluster's subnet
  (Microsoft's NSG guidance assumes a subnet of the file system's own: give subnet_id);
- creation takes Azure 10 minutes or more: `cluster up` starts every missing file system
  first (start()) and waits for them (wait()) just before the VMs, which mount them as
  they join; size, SKU, subnet and zone cannot change afterwards (a changed entry is
  reported, not applied).

What the nodes mount (endpoints()): the MGS address of `properties.clientInfo` and the file
system name (`lustrefs`), through role amlfs_client (LNet over TCP on eth0).

Who the servers reach (server_prefixes()): a file system's servers open connections to their
clients on TCP 988 and 1019-1023 (Microsoft's "Configure a network security group for Azure
Managed Lustre", outbound rule 108), so the cluster's NSG admits them from the address range of
each file system's subnet (resources.security_rules): a created one's subnet, an existing one's
found by its MGS address among the subscription's file systems.
"""

from __future__ import annotations

from dataclasses import dataclass

from clusterbake.config import AmlfsStorage, ClusterConfig
from clusterbake.errors import ClusterbakeError, ConfigError
from clusterbake.progress import say
from clusterbake.providers.azure import resources, tags
from clusterbake.providers.azure.api import get_or_none, message
from clusterbake.providers.azure.checks import Subnet


@dataclass(frozen=True)
class FileSystem:
    field: str  # storage.<i> (<name>): what errors name
    entry: AmlfsStorage
    name: str | None  # the cluster's file system; None for an existing one (mgs_address)


def file_systems(config: ClusterConfig) -> list[FileSystem]:
    found = []
    for index, entry in enumerate(config.storage or []):
        if isinstance(entry, AmlfsStorage):
            name = None if entry.mgs_address else resources.group_resource_name(config.cluster_name, entry.name)
            found.append(FileSystem(f"storage.{index} ({entry.name})", entry, name))
    return found


def subnet_of(config: ClusterConfig, fs: FileSystem, cluster_subnet_id: str) -> str:
    return fs.entry.subnet_id or cluster_subnet_id


def zone_of(config: ClusterConfig, fs: FileSystem) -> str:
    return fs.entry.zone or config.azure.zone


def body(config: ClusterConfig, fs: FileSystem, cluster_subnet_id: str) -> dict:
    entry = fs.entry
    body_tags = tags.cluster_tags(config.cluster_name)
    if entry.retain:
        body_tags[tags.RETAIN] = "true"
    return {
        "location": config.azure.location,
        "tags": body_tags,
        "sku": {"name": entry.sku},
        "zones": [zone_of(config, fs)],
        "properties": {
            "storageCapacityTiB": entry.storage_capacity_tib,
            "filesystemSubnet": subnet_of(config, fs, cluster_subnet_id),
            "maintenanceWindow": {"dayOfWeek": entry.maintenance_day, "timeOfDayUTC": entry.maintenance_time_utc},
            "rootSquashSettings": {"mode": "None"},
        },
    }


def check(storagecache, config: ClusterConfig, cluster_subnet_id: str) -> None:
    """Read-only: Azure's subnet check for each file system still to create."""
    from azure.core.exceptions import HttpResponseError

    rg = config.azure.resource_group
    for fs in file_systems(config):
        if fs.name is None or get_or_none(storagecache.aml_filesystems.get, rg, fs.name) is not None:
            continue
        field = f"{fs.field}.subnet_id" if fs.entry.subnet_id else config.azure.subnet_field
        if subnet_of(config, fs, cluster_subnet_id).lower() == cluster_subnet_id.lower():
            say(
                f"    warning: {fs.field}: the Managed Lustre file system goes into the cluster's subnet "
                f"({config.azure.subnet_field}), and the nodes' NSG admits Lustre's connections (TCP 988, 1019-1023) "
                "from that whole subnet; Microsoft's NSG guidance assumes a subnet of the file system's own: give "
                "the entry a subnet_id (it cannot move after creation)"
            )
        try:
            storagecache.check_aml_fs_subnets(
                {
                    "filesystemSubnet": subnet_of(config, fs, cluster_subnet_id),
                    "storageCapacityTiB": fs.entry.storage_capacity_tib,
                    "sku": {"name": fs.entry.sku},
                    "location": config.azure.location,
                }
            )
        except HttpResponseError as exc:
            raise ConfigError(
                f"{field}: Azure refuses the subnet for the Managed Lustre file system of {fs.field} "
                f"({fs.entry.storage_capacity_tib} TiB {fs.entry.sku}): {_subnet_error(exc)}; give the entry a "
                "subnet of its own (subnet_id) of the size Microsoft's prerequisites name"
            ) from None


def server_prefixes(network, storagecache, config: ClusterConfig, cluster_subnet: Subnet) -> list[str]:
    """The address ranges of the file systems' subnets, where their servers connect from (see the docstring)."""
    prefixes: list[str] = []
    existing: dict[str, str] | None = None  # MGS address -> subnet id of the subscription's file systems
    for fs in file_systems(config):
        if fs.name is not None:
            subnet_id = subnet_of(config, fs, cluster_subnet.id)
        else:
            if existing is None:
                existing = {
                    found.properties.client_info.mgs_address: found.properties.filesystem_subnet
                    for found in storagecache.aml_filesystems.list()
                    if found.properties is not None and found.properties.client_info is not None
                }
            subnet_id = existing.get(fs.entry.mgs_address)
            if subnet_id is None:
                say(
                    f"    warning: {fs.field}: no Managed Lustre file system of subscription "
                    f"{config.azure.subscription_id} has MGS address {fs.entry.mgs_address}, so the nodes' NSG does "
                    "not admit its servers' connections (TCP 988, 1019-1023): add an inbound rule for its subnet "
                    "to the NSG yourself"
                )
                continue
        for prefix in _prefixes_of(network, subnet_id, cluster_subnet):
            if prefix not in prefixes:
                prefixes.append(prefix)
    return prefixes


def _prefixes_of(network, subnet_id: str, cluster_subnet: Subnet) -> list[str]:
    if subnet_id.lower() == cluster_subnet.id.lower():
        return [cluster_subnet.prefix]
    parts = subnet_id.split("/")  # /subscriptions/S/resourceGroups/G/providers/Microsoft.Network/virtualNetworks/V/...
    subnet = network.subnets.get(parts[4], parts[8], parts[10])
    return list(subnet.address_prefixes or [subnet.address_prefix])


def _subnet_error(exc) -> str:
    model = getattr(exc, "model", None)
    subnet = getattr(model, "filesystem_subnet", None) if model is not None else None
    text = getattr(subnet, "message", None)
    if not text and exc.response is not None:
        try:
            text = (exc.response.json().get("filesystemSubnet") or {}).get("message")
        except ValueError:
            text = None
    return text or message(exc)


def start(storagecache, config: ClusterConfig, cluster_subnet_id: str) -> dict:
    """Start creating the cluster's missing file systems: name -> poller (wait() waits for them)."""
    rg = config.azure.resource_group
    pollers = {}
    for fs in file_systems(config):
        if fs.name is None:
            continue
        found = get_or_none(storagecache.aml_filesystems.get, rg, fs.name)
        if found is not None:
            _report_changes(found, fs, config, cluster_subnet_id)
            continue
        say(
            f"    creating Managed Lustre {fs.name} ({fs.entry.storage_capacity_tib} TiB {fs.entry.sku}, zone "
            f"{zone_of(config, fs)}; Azure takes 10 minutes or more)"
        )
        pollers[fs.name] = storagecache.aml_filesystems.begin_create_or_update(
            rg, fs.name, body(config, fs, cluster_subnet_id)
        )
    return pollers


def _report_changes(found, fs: FileSystem, config: ClusterConfig, cluster_subnet_id: str) -> None:
    if (found.tags or {}).get(tags.CLUSTER) != config.cluster_name:
        raise ClusterbakeError(
            f"{fs.field}: Managed Lustre {fs.name} exists in {config.azure.resource_group} but is not tagged "
            f"{tags.CLUSTER}={config.cluster_name}; rename the entry or the cluster"
        )
    props = found.properties
    have = (found.sku.name if found.sku else None, props.storage_capacity_ti_b, (props.filesystem_subnet or "").lower())
    want = (fs.entry.sku, fs.entry.storage_capacity_tib, subnet_of(config, fs, cluster_subnet_id).lower())
    if have != want:
        say(
            f"    warning: {fs.field}: Managed Lustre {fs.name} is {have[1]} TiB {have[0]}; SKU, size and subnet "
            "cannot change after creation (delete it with `cluster down` and create it again)"
        )


def wait(pollers: dict) -> None:
    errors = {}
    for name, poller in pollers.items():
        try:
            poller.result()
        except Exception as exc:  # collected: every file system gets its say
            errors[name] = message(exc)
    if errors:
        first = sorted(errors.items())[0]
        raise ClusterbakeError(f"Azure could not create Managed Lustre {first[0]}: {first[1]}")


def endpoints(storagecache, config: ClusterConfig) -> dict[str, dict]:
    """Per entry name, what the nodes mount: {mgs_address, fs_name, file_system}."""
    rg = config.azure.resource_group
    found = {}
    for fs in file_systems(config):
        address = fs.entry.mgs_address
        if fs.name is not None:
            current = get_or_none(storagecache.aml_filesystems.get, rg, fs.name)
            info = current.properties.client_info if current is not None and current.properties else None
            address = info.mgs_address if info is not None else None
        if address:
            found[fs.entry.name] = {"mgs_address": address, "fs_name": fs.entry.fs_name, "file_system": fs.name}
    return found
