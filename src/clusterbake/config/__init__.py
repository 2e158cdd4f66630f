"""The cluster config file: a typed schema with every default in one place, this package (one module
per part: base, image, nodes, storage, cluster, clouds; here the whole config, loading and errors).

A config is loaded once, validated completely, and only then does anything get
created. Errors name the file, the field path and what to do about it.
"""

from __future__ import annotations

import re
from glob import glob
from pathlib import Path
from typing import Literal

import hostlist
import yaml
from pydantic import (
    Field,
    ValidationError,
    model_validator,
)

from clusterbake.config.base import DEFAULT_CONFIG, NAME_PATTERN, Name, Strict  # noqa: F401
from clusterbake.config.clouds import (  # noqa: F401
    AZURE_NAME_PATTERN,
    AZURE_RESERVED_USERS,
    GUID_PATTERN,
    RESOURCE_GROUP_PATTERN,
    AwsConfig,
    AzureConfig,
    LocalConfig,
    bastion_field,
    check_cidrs,
    login_user_field,
    network_interface_field,
    ssh_cidrs_field,
)
from clusterbake.config.cluster import (  # noqa: F401
    _WITHOUT_CGROUP,
    ACCOUNT_NAME_PATTERN,
    DB_PASSWORD_PATTERN,
    DCGM_LEVEL2_MIN_TIMEOUT,
    DEFAULT_ACCOUNT,
    DEFAULT_FATAL_XIDS,
    FIRST_USER_UID,
    MONITORING_PORTS,
    NO_CONTROL,
    RESERVED_USER_NAMES,
    RESUME_TIMEOUT_ACCELERATED,
    RESUME_TIMEOUT_DEFAULT,
    SLURM_PLUGIN_DEFAULTS,
    SLURM_WITHOUT_CGROUP_V2,
    Account,
    AccountingConfig,
    AccountingDatabase,
    CheckpointsConfig,
    DirectoryConfig,
    HealthConfig,
    MonitoringConfig,
    PowerConfig,
    RecoveryConfig,
    RestApiConfig,
    SlurmConfig,
    User,
    _plugin_default_text,
)
from clusterbake.config.image import (  # noqa: F401
    AWS_IMAGE_FEATURES,
    AZURE_IMAGE_FEATURES,
    AZURE_SOURCE_IMAGES,
    DEFAULT_IMAGE_BASE,
    AwsImageBuild,
    AzureImageBuild,
    ImageConfig,
    TrainingConfig,
    build_features_field,
    build_vm_field,
)
from clusterbake.config.nodes import (  # noqa: F401
    AWS_INSTANCE_TYPE_PATTERN,
    AZURE_VM_SIZE_PATTERN,
    HEAD_NAME,
    INSTANCE_TYPE_PATTERN,
    LOCAL_SIZING_KEYS,
    LOGIN_GROUP,
    MAX_GROUP_NODES,
    MAX_PLACEHOLDER_GPUS,
    PROVIDER_ONLY_KEYS,
    SLURM_TIME_PATTERN,
    HeadConfig,
    LoginNodes,
    NodeGroup,
    NodeSize,
    Partition,
)
from clusterbake.config.storage import (  # noqa: F401
    AMLFS_CREATE_KEYS,
    AMLFS_SKUS,
    BLOB_CONTAINER_PATTERN,
    DEFAULT_STORAGE_TYPE,
    FILE_SYSTEM_ID_PATTERN,
    FSX_SCRATCH_CAPACITIES,
    STORAGE_TAGS,
    STORAGE_TYPES,
    SUBNET_ID_PATTERN,
    WEEKDAYS,
    AmlfsStorage,
    AzureBlobStorage,
    AzureFilesStorage,
    EfsStorage,
    FsxLustreStorage,
    HostDirStorage,
    NfsStorage,
    StorageBase,
    StorageMount,
    _storage_type,
    is_container_name,
    zone_as_text,
)
from clusterbake.errors import ConfigError
from clusterbake.topology import TopologyError, check_paths


class ClusterConfig(Strict):
    cluster_name: Name = Field(description="Names the cluster's nodes, network devices, state and cloud tags.")
    provider: Literal["local", "aws", "azure"] = Field(
        "local", description="local (nspawn nodes on this host), aws or azure."
    )
    image: ImageConfig = Field(default_factory=ImageConfig, description="What goes into the node image.")
    head: HeadConfig = Field(
        default_factory=HeadConfig,
        description="The head node (slurmctld, slurmdbd; users' login too unless login_nodes are set).",
    )
    login_nodes: LoginNodes | None = Field(
        None,
        description="Login nodes (login-1, ...), the only nodes users SSH to: the head then admits only the "
        "administrators (users with sudo) and the cloud's login user. Sized like the head.",
    )
    node_groups: list[NodeGroup] = Field(min_length=1, description="Compute nodes, named <group>-<n>.")
    partitions: list[Partition] = Field(
        default_factory=list, description="Slurm partitions; default: one per node group, the first the default."
    )
    storage: list[StorageMount] | None = Field(
        None,
        description="Shared file systems on every node; default: /shared (local: a host directory, aws: NFS "
        "from the head). /home is always shared: local a host directory, aws NFS from the head unless listed here.",
    )
    users: list[User] = Field(default_factory=list, description="Cluster users, same UID/GID on every node.")
    directory: DirectoryConfig | None = Field(
        None,
        description="Users from an LDAP directory through SSSD on every node, besides `users` (docs/users.md).",
    )
    slurm: SlurmConfig = Field(default_factory=SlurmConfig, description="Per-environment Slurm plugin choices.")
    power: PowerConfig = Field(default_factory=PowerConfig, description="Power saving of elastic node groups.")
    health: HealthConfig = Field(default_factory=HealthConfig, description="Health checks of the compute nodes.")
    recovery: RecoveryConfig = Field(
        default_factory=RecoveryConfig, description="Lost nodes and requeued jobs (the reconcile loop)."
    )
    checkpoints: CheckpointsConfig = Field(
        default_factory=CheckpointsConfig, description="Durable copies of the jobs' checkpoints."
    )
    accounting: AccountingConfig = Field(
        default_factory=AccountingConfig, description="Slurm accounting (slurmdbd, sacct, fair share)."
    )
    training: TrainingConfig = Field(
        default_factory=TrainingConfig, description="The training environment of the `train` nodes: what a team adds."
    )
    rest_api: RestApiConfig = Field(
        default_factory=RestApiConfig, description="Slurm's REST API (slurmrestd with JWT) on the head."
    )
    monitoring: MonitoringConfig = Field(
        default_factory=MonitoringConfig, description="Prometheus and its exporters; `clusterbake report`."
    )
    max_cost_per_hour: float | None = Field(
        None,
        gt=0,
        description="USD per hour: `cluster up` refuses a plan whose machines would cost more with every elastic "
        "node up, or that cannot be priced in full, before anything is made (`--max-cost-per-hour` overrides it; "
        "`cluster up --dry-run` shows the estimate). Storage and data transfer are not in it.",
    )
    local: LocalConfig = Field(default_factory=LocalConfig, description="Settings of the local provider.")
    aws: AwsConfig | None = Field(None, description="Settings of the aws provider (required with provider aws).")
    azure: AzureConfig | None = Field(
        None, description="Settings of the azure provider (required with provider azure)."
    )

    @model_validator(mode="before")
    @classmethod
    def _default_image_base(cls, data):
        """image.base defaults per provider (DEFAULT_IMAGE_BASE)."""
        if not isinstance(data, dict) or not isinstance(provider := data.get("provider"), str):
            return data
        image = data.get("image", {})
        if provider in DEFAULT_IMAGE_BASE and isinstance(image, dict) and "base" not in image:
            data = {**data, "image": {**image, "base": DEFAULT_IMAGE_BASE[provider]}}
        return data

    @model_validator(mode="after")
    def _cross_references(self) -> ClusterConfig:
        _unique("node_groups", [g.name for g in self.node_groups])
        _unique("partitions", [p.name for p in self.partitions])
        _unique("storage", [s.mount_point for s in self.storage or []], what="mount_point")
        _unique("storage", [s.name for s in self.storage or []])
        _unique("users", [u.name for u in self.users])
        _unique("users", [u.uid for u in self.users], what="uid")
        login = self.aws.ssh_user if self.aws else self.azure.admin_user if self.azure else None
        for index, user in enumerate(self.users):
            if user.name == login:
                raise ValueError(
                    f"users.{index}.name: {login!r} is the cloud's login user (the controller's); choose another name"
                )
        if self.provider == "local" and self.login_nodes is not None and self.login_nodes.ssh_cidrs:
            raise ValueError(
                "login_nodes.ssh_cidrs: only for the clouds (local nodes are reached from this machine); remove it"
            )
        if self.head.count > 1 and self.provider != "local":
            raise ValueError(
                f"head.count: a backup controller is built on the local provider only so far (its StateSaveLocation "
                f"on {self.provider} needs shared storage both heads mount, not yet made); use count: 1"
            )
        groups = {g.name for g in self.node_groups}
        for reserved in ("head", "login"):
            if reserved in groups:
                raise ValueError(f"node_groups: '{reserved}' names the {reserved} nodes; rename the group")
        for index, partition in enumerate(self.partitions):
            for name in partition.node_groups:
                if name not in groups:
                    raise ValueError(
                        f"partitions.{index}.node_groups: '{name}' is not a node group "
                        f"(defined: {', '.join(sorted(groups))})"
                    )
        if sum(p.default for p in self.partitions) > 1:
            raise ValueError("partitions: more than one partition has default: true")
        for index, group in enumerate(self.node_groups):
            if group.spot and group.capacity_reservation_id:
                raise ValueError(
                    f"node_groups.{index}.capacity_reservation_id: capacity reservations are for on-demand "
                    "instances; remove it or set spot: false"
                )
            if group.capacity_reservation_id and len(group.types) > 1:
                raise ValueError(
                    f"node_groups.{index}.instance_types: a capacity reservation holds one instance type, so a "
                    "group with a capacity_reservation_id has no fallback types; give instance_type only"
                )
        self._check_storage()
        self._check_local_topology()
        copy_to = self.checkpoints.copy_to or ""
        if copy_to.startswith("s3://") and self.provider != "aws":
            raise ValueError(
                f"checkpoints.copy_to: s3:// needs provider aws (its node role); on {self.provider} give a directory "
                "where a bucket or container is mounted"
            )
        self._check_accounting()
        if self.provider == "aws":
            self._check_aws()
        elif self.provider == "azure":
            self._check_azure()
        elif self.image.base != "debian-12":
            raise ValueError(
                f"image.base: the local provider builds debian-12 images only (no Ubuntu mirror is reachable "
                f"from here), not {self.image.base}; remove image.base"
            )
        return self

    def node_size(self, role: str, nodegroup: str) -> NodeSize:
        """What sizes a planned node (role head, login or compute): the head's, the login nodes' or its group's."""
        if role == "compute":
            return next(g for g in self.node_groups if g.name == nodegroup)
        return self.login_nodes if role == "login" and self.login_nodes is not None else self.head

    def compute_node_names(self) -> list[str]:
        """Every compute node's name (static, then elastic, group by group), as the plan names them."""
        return [name for group in self.node_groups for name in group.node_names()]

    def local_topology_paths(self) -> dict[str, list[str]]:
        """local.topology by node: each compute node's switches from the top (hostlists expanded)."""
        return {
            node: list(path) for nodes, path in self.local.topology.items() for node in hostlist.expand_hostlist(nodes)
        }

    def _check_local_topology(self) -> None:
        if not self.local.topology:
            return
        if self.provider != "local":
            raise ValueError(
                f"local.topology: the local provider's stand-in network; {self.provider} nodes' topology comes "
                "from the cloud (remove it)"
            )
        known, seen = set(self.compute_node_names()), set()
        for nodes in self.local.topology:
            try:
                names = hostlist.expand_hostlist(nodes)
            except hostlist.BadHostlist as error:
                raise ValueError(f"local.topology: {nodes!r} is not a hostlist ({error})") from None
            for name in names:
                if name not in known:
                    raise ValueError(f"local.topology: {name} (of {nodes!r}) is not a compute node of node_groups")
                if name in seen:
                    raise ValueError(f"local.topology: {name} is placed twice")
                seen.add(name)
        try:
            check_paths(self.local_topology_paths(), "local.topology")
        except TopologyError as error:
            raise ValueError(str(error)) from None

    def _check_aws(self) -> None:
        if self.aws is None:
            raise ValueError("aws: required with provider aws (region, vpc_id, subnet_id, ssh_cidrs, ...)")
        self._check_cloud_sections(
            "aws",
            AWS_INSTANCE_TYPE_PATTERN,
            ("e.g. m7i.2xlarge", ", or instance_types: [...] in order of preference"),
            ("an EC2 instance type (e.g. m7i.2xlarge)", "instance type"),
        )

    def _check_azure(self) -> None:
        if self.azure is None:
            raise ValueError(
                "azure: required with provider azure (subscription_id, location, resource_group, "
                "subnet_id or vnet_name + subnet_name, ssh_cidrs, ...)"
            )
        if self.aws is not None:
            raise ValueError("aws: only for provider aws; remove it (this cluster is provider azure)")
        azure = self.azure
        if azure.subnet_id and (azure.vnet_name or azure.subnet_name or azure.vnet_resource_group):
            raise ValueError("azure.subnet_id: give subnet_id or vnet_name + subnet_name, not both")
        if not azure.subnet_id and not (azure.vnet_name and azure.subnet_name):
            missing = "subnet_name" if azure.vnet_name else "vnet_name"
            raise ValueError(
                f"azure.{missing}: required (the existing subnet: subnet_id, or vnet_name and subnet_name)"
            )
        self._check_cloud_sections(
            "azure",
            AZURE_VM_SIZE_PATTERN,
            ("a VM size, e.g. Standard_D4s_v5", ""),
            ("an Azure VM size (Standard_<name>, e.g. Standard_ND96isr_H100_v5)", "VM size"),
        )
        for index, group in enumerate(self.node_groups):
            if group.existing_placement_group:
                raise ValueError(
                    f"node_groups.{index}.placement_group: on azure true or false (the group's own proximity "
                    "placement group), not the name of an existing one"
                )
        for index, entry in enumerate(self.storage or []):
            if isinstance(entry, AmlfsStorage) and entry.mgs_address is None and not (entry.zone or azure.zone):
                raise ValueError(
                    f"storage.{index}.zone: Azure Managed Lustre file systems live in one availability zone; set "
                    "zone (or azure.zone) to 1, 2 or 3"
                )

    def _check_cloud_sections(self, provider: str, pattern: str, required: tuple[str, str], kind: tuple[str, str]):
        """The checks every cloud provider makes: an Ubuntu image.base, the Slurm plugins, and each
        section's (head, node_groups.N) instance_type (`pattern`) and no key of another provider
        (PROVIDER_ONLY_KEYS).

        required: the hint when instance_type is missing, and what node groups may give instead;
        kind: what instance_type must be (for the message), and what the sizes come from.
        """
        if not self.image.base.startswith("ubuntu-"):
            label = {"aws": "AWS", "azure": "Azure"}[provider]
            raise ValueError(
                f"image.base: {label} images are Ubuntu; remove image.base "
                f"(default {DEFAULT_IMAGE_BASE[provider]}) or set ubuntu-24.04 or ubuntu-22.04"
            )
        self._check_slurm_plugins()
        hint, alternative = required
        what, source = kind
        sections = [("head", self.head)] + ([("login_nodes", self.login_nodes)] if self.login_nodes else [])
        sections += [(f"node_groups.{i}", g) for i, g in enumerate(self.node_groups)]
        for field, section in sections:
            if not section.instance_type:
                instead = alternative if field.startswith("node_groups.") else ""
                raise ValueError(f"{field}.instance_type: required with provider {provider} ({hint}){instead}")
            if not re.fullmatch(pattern, section.instance_type):
                raise ValueError(f"{field}.instance_type: {section.instance_type} is not {what}")
            for index, value in enumerate(getattr(section, "instance_types", None) or []):
                if not re.fullmatch(pattern, value):
                    raise ValueError(f"{field}.instance_types.{index}: {value} is not {what}")
            for key, (providers, message) in PROVIDER_ONLY_KEYS.items():
                if key in section.model_fields_set and provider not in providers:
                    said = message.format(provider=provider, source=source, instance_type=section.instance_type)
                    raise ValueError(f"{field}.{key}: {said}")

    def _check_slurm_plugins(self) -> None:
        """No cgroup plugin where the image's Slurm cannot run one (SLURM_WITHOUT_CGROUP_V2)."""
        reason = SLURM_WITHOUT_CGROUP_V2.get(self.image.base)
        if reason is None:
            return
        defaults = SLURM_PLUGIN_DEFAULTS.get(self.image.base, SLURM_PLUGIN_DEFAULTS["cloud"])
        for key, value in self.slurm.model_dump().items():
            if value and any(plugin.strip().endswith("/cgroup") for plugin in value.split(",")):
                raise ValueError(
                    f"slurm.{key}: {value} needs Slurm's cgroup plugins, which cannot run on image.base "
                    f"{self.image.base}: {reason}; remove slurm.{key} (default there: {defaults[key]}) "
                    f"or set image.base: {DEFAULT_IMAGE_BASE['aws']}"
                )

    def _check_accounting(self) -> None:
        _unique("accounting.accounts", [a.name for a in self.accounting.accounts])
        accounts = [a.name for a in self.accounting.effective_accounts()]
        for index, user in enumerate(self.users):
            if user.account is not None and user.account not in accounts:
                raise ValueError(
                    f"users.{index}.account: '{user.account}' is not an account (accounting.accounts: "
                    f"{', '.join(accounts)}); add it there or remove users.{index}.account"
                )
        account = self.directory.default_account if self.directory else None
        if account is not None and account not in accounts:
            raise ValueError(
                f"directory.default_account: '{account}' is not an account (accounting.accounts: {', '.join(accounts)})"
            )

    def _check_storage(self) -> None:
        allowed = STORAGE_TYPES[self.provider]
        for index, mount in enumerate(self.storage or []):
            if mount.type not in allowed:
                raise ValueError(
                    f"storage.{index}.type: {mount.type} is not for provider {self.provider}; "
                    f"use {' or '.join(allowed)}"
                )
            if self.provider == "local" and mount.mount_point == "/home":
                raise ValueError(
                    f"storage.{index}.mount_point: /home is always a shared host directory on the local "
                    "provider; remove this entry"
                )

    def effective_storage(self) -> list[StorageMount]:
        """Shared file systems of every node, /home first (a cloud cluster always shares it)."""
        kind = DEFAULT_STORAGE_TYPE[self.provider]
        by_type = {"hostdir": HostDirStorage, "nfs": NfsStorage}
        mounts = (
            list(self.storage)
            if self.storage is not None
            else [by_type[kind](name="shared", mount_point="/shared", type=kind)]
        )
        if self.provider != "local" and not any(m.mount_point == "/home" for m in mounts):
            mounts.insert(0, by_type[kind](name="home", mount_point="/home", type=kind))
        return sorted(mounts, key=lambda m: m.mount_point != "/home")

    def effective_partitions(self) -> list[Partition]:
        """Partitions as configured, or one default partition per node group."""
        if self.partitions:
            parts = list(self.partitions)
            if not any(p.default for p in parts):
                parts[0] = parts[0].model_copy(update={"default": True})
            return parts
        return [Partition(name=g.name, node_groups=[g.name], default=i == 0) for i, g in enumerate(self.node_groups)]

    def slurm_plugins(self) -> dict[str, str]:
        """The configured plugin types, else the defaults of the provider and image base."""
        if self.provider == "local":
            defaults = SLURM_PLUGIN_DEFAULTS["local"]
        else:
            defaults = SLURM_PLUGIN_DEFAULTS.get(self.image.base, SLURM_PLUGIN_DEFAULTS["cloud"])
        chosen = self.slurm.model_dump()
        return {key: chosen[key] or value for key, value in defaults.items()}


def _unique(field: str, values: list, what: str = "name") -> None:
    seen = set()
    for value in values:
        if value in seen:
            raise ValueError(f"{field}: duplicate {what} '{value}'; each must be unique")
        seen.add(value)


def extra_ca_files(config: ClusterConfig) -> list[str]:
    files: list[str] = []
    for index, pattern in enumerate(config.image.extra_ca_certificates):
        matches = sorted(glob(pattern))
        if not matches:
            raise ConfigError(
                f"image.extra_ca_certificates.{index}: '{pattern}' matches no file on this machine; "
                "fix the path or remove the entry"
            )
        files += [str(Path(m).resolve()) for m in matches]
    return files


def _password_line(path: Path, field: str, what: str) -> str:
    """The one line of a password file on this machine that only its owner reads (input errors otherwise)."""
    if not path.is_file():
        raise ConfigError(f"{field}: {path} is not a file on this machine; write {what} there (0600)")
    if path.stat().st_mode & 0o077:
        raise ConfigError(f"{field}: {path} is readable by others; chmod 600 {path}")
    lines = path.read_text().splitlines()
    return lines[0] if len(lines) == 1 else ""


def _check_ca_file(path: str | None, field: str) -> None:
    if path is not None:
        ca = Path(path)
        if not ca.is_file() or "-----BEGIN CERTIFICATE-----" not in ca.read_text(errors="replace"):
            raise ConfigError(f"{field}: {ca} is not a PEM certificate file on this machine")


def check_directory_files(config: ClusterConfig) -> None:
    """directory's files on this machine: the bind password (one line, readable by no one else) and the CA."""
    directory = config.directory
    if directory is None:
        return
    if directory.bind_password_file is not None:
        path, field = Path(directory.bind_password_file), "directory.bind_password_file"
        line = _password_line(path, field, "bind_dn's password")
        if not line or re.search(r"[\x00-\x1f\x7f]", line):
            raise ConfigError(f"{field}: {path} must hold one line, the password")
    _check_ca_file(directory.ca_file, "directory.ca_file")


def check_accounting_files(config: ClusterConfig) -> None:
    """accounting.database's files on this machine: a password slurmdbd can use, readable by no one else, and
    the CA bundle. Read here, never printed; bad ones are input errors, found before anything is created."""
    database = config.accounting.database if config.accounting.enabled else None
    if database is None:
        return
    path, field = Path(database.password_file), "accounting.database.password_file"
    if not re.fullmatch(DB_PASSWORD_PATTERN, _password_line(path, field, "the database password")):
        raise ConfigError(
            f"{field}: {path} must hold one line, the password: 8 to 128 characters without '#' (slurmdbd.conf(5) "
            "does not allow it), blanks, quotes or backslashes; choose such a password for the database user"
        )
    _check_ca_file(database.ca_file, "accounting.database.ca_file")


def load_config(path: str | Path) -> ClusterConfig:
    """Read and validate a config file, raising ConfigError with a readable message."""
    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"{path}: no such config file; pass CONFIG=path or create {DEFAULT_CONFIG}")
    try:
        data = yaml.safe_load(path.read_text())
    except yaml.YAMLError as exc:
        raise ConfigError(f"{path}: not valid YAML: {exc}") from None
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: the top level must be a mapping with cluster_name, node_groups, ...")
    try:
        return ClusterConfig.model_validate(data)
    except ValidationError as exc:
        raise ConfigError(f"{path}: invalid config\n" + format_validation_error(exc)) from None


def _without_union_tags(loc: tuple) -> list:
    """storage.0.efs.retain -> storage.0.retain: the tag of a storage entry is its `type`, not a key."""
    parts = list(loc)
    return [p for i, p in enumerate(parts) if not (i == 2 and parts[0] == "storage" and p in STORAGE_TAGS)]


_HINTS = {
    "extra_forbidden": "unknown key; remove it or check its spelling",
    "missing": "required; add it",
}


def format_validation_error(exc: ValidationError) -> str:
    lines = []
    for error in exc.errors():
        location = ".".join(str(part) for part in _without_union_tags(error["loc"])) or "(top level)"
        message = _HINTS.get(error["type"], error["msg"].removeprefix("Value error, "))
        lines.append(f"  {location}: {message}")
    return "\n".join(lines)
