"""The cluster-wide sections: users, accounting, Slurm, power saving, health, recovery, checkpoints, monitoring."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import (
    Field,
    field_validator,
    model_validator,
)

from clusterbake.config.base import Strict
from clusterbake.config.nodes import SLURM_TIME_PATTERN

RESERVED_USER_NAMES = frozenset(
    [
        "root",
        "daemon",
        "bin",
        "sys",
        "sync",
        "games",
        "man",
        "lp",
        "mail",
        "news",
        "uucp",
        "proxy",
        "www-data",
        "backup",
        "list",
        "irc",
        "gnats",
        "nobody",
        "_apt",
        "messagebus",
        "sshd",
        "systemd-network",
        "systemd-resolve",
        "systemd-timesync",
        "systemd-journal-remote",
        "polkitd",
        "syslog",
        "uuidd",
        "tcpdump",
        "tss",
        "landscape",
        "pollinate",
        "fwupd-refresh",
        "lxd",
        "usbmux",
        "dnsmasq",
        "statd",
        "_rpc",
        "slurm",
        "munge",
        "mysql",
        "prometheus",
        "nvidia-persistenced",
        "ubuntu",
        "azureuser",
        "admin",
        "debian",
    ]
)
# Cluster users' uids start here: below are the images' own accounts (the clouds' login user is 1000).
FIRST_USER_UID = 2000
# A line of a file the nodes get (passwd, authorized_keys, a .mount unit): no control character.
NO_CONTROL = r"^[^\x00-\x1f\x7f]*$"


class User(Strict):
    name: Annotated[str, Field(pattern=r"^[a-z_][a-z0-9_-]{0,31}$", description="Login name.")]
    uid: int = Field(ge=FIRST_USER_UID, le=60000, description="Same UID on every node (shared /home); 2000 and up.")
    gid: int | None = Field(None, ge=FIRST_USER_UID, le=60000, description="Defaults to the uid.")
    shell: str = Field("/bin/bash", pattern=r"^/[A-Za-z0-9._/+-]+$", description="Login shell.")
    sudo: bool = Field(
        False, description="Passwordless sudo on every node: a cluster administrator (and on local, host root)."
    )
    ssh_authorized_keys: list[Annotated[str, Field(pattern=NO_CONTROL, min_length=1)]] = Field(
        default_factory=list,
        description="Public keys for SSH to the login nodes (to the head when there are none; one line each).",
    )

    @field_validator("name")
    @classmethod
    def _not_reserved(cls, value: str) -> str:
        if value in RESERVED_USER_NAMES:
            raise ValueError(f"{value!r} is an account of the images or their daemons; choose another name")
        return value

    account: str | None = Field(
        None,
        description="Slurm account of the user's jobs (accounting.accounts); default: the first account.",
    )


# Slurm's database keeps names in lower case (sacctmgr(1)): account names are lower case already.
ACCOUNT_NAME_PATTERN = r"^[a-z][a-z0-9_-]{0,31}$"
# The account users belong to when accounting.accounts lists none.
DEFAULT_ACCOUNT = "general"
# slurmdbd.conf(5): "The '#' character is not permitted in a password"; no blanks or quotes either,
# so that the password is one plain token in slurmdbd.conf and SQL.
DB_PASSWORD_PATTERN = r"^[^\s#'\"\\]{8,128}$"


class Account(Strict):
    """A Slurm account (sacctmgr add account): a bank the users' jobs are charged to."""

    name: str = Field(pattern=ACCOUNT_NAME_PATTERN, description="Account name (lower case).")
    description: str = Field("", max_length=100, description="What the account is for.")
    fairshare: int = Field(
        1, ge=1, le=1000000, description="Its share of the cluster against the other accounts (sacctmgr Fairshare)."
    )
    # Limits of the account's association (Slurm enforces them: AccountingStorageEnforce has limits). Unset: none.
    grp_tres: str | None = Field(
        None,
        pattern=r"^[a-z]+(/[a-z0-9_:.-]+)?=\d+(,[a-z]+(/[a-z0-9_:.-]+)?=\d+)*$",
        description="GrpTRES: what the account's running jobs may hold at once, e.g. node=4,gres/gpu=32 (an "
        "elastic cluster's spend ceiling).",
    )
    max_jobs: int | None = Field(None, ge=0, description="MaxJobs: running jobs per user of the account.")
    max_submit_jobs: int | None = Field(
        None, ge=0, description="MaxSubmitJobs: jobs per user of the account running or waiting."
    )
    max_wall: str | None = Field(
        None, pattern=SLURM_TIME_PATTERN, description="MaxWall: the longest time limit a job of the account may have."
    )


class AccountingDatabase(Strict):
    """accounting.database: an existing MySQL or MariaDB server (Amazon RDS, Azure Database for MySQL) instead
    of MariaDB on the head. slurmdbd still runs on the head; clusterbake never creates or deletes this server."""

    host: str = Field(
        pattern=r"^[A-Za-z0-9]([A-Za-z0-9.-]{0,251}[A-Za-z0-9])?$",
        description="Endpoint of the server, e.g. mydb.abc123.us-east-1.rds.amazonaws.com or "
        "mydb.mysql.database.azure.com; the head must reach it.",
    )
    port: int = Field(3306, ge=1, le=65535, description="Its port.")
    name: str = Field(
        "slurm_acct_db", pattern=r"^[A-Za-z0-9_]{1,64}$", description="Database slurmdbd uses (StorageLoc)."
    )
    user: str = Field(
        "slurm",
        pattern=r"^[A-Za-z0-9_.@-]{1,80}$",
        description="Database user (StorageUser), allowed to create the database or all privileges on it.",
    )
    password_file: str = Field(
        description="File on this machine with the user's password (one line, no '#', blanks or quotes; keep it "
        "0600): never the password itself in this file."
    )
    ca_file: str | None = Field(
        None,
        description="PEM CA bundle on this machine to verify the server's TLS certificate (RDS: the region's bundle, "
        "Azure: DigiCert Global Root G2); default: no TLS.",
    )


class AccountingConfig(Strict):
    """Slurm accounting: slurmdbd on the head, every job in its database (sacct), users and accounts from this
    file (sacctmgr), fair-share scheduling."""

    enabled: bool = Field(
        True,
        description="slurmdbd on the head with MariaDB (or `database`), jobs recorded with their GPUs "
        "(AccountingStorageTRES=gres/gpu), fair-share priorities (what it costs at bring-up: "
        "`bench/bringup.py --without accounting`).",
    )
    database: AccountingDatabase | None = Field(
        None, description="An external MySQL/MariaDB server; default: MariaDB on the head (its disk keeps the data)."
    )
    accounts: list[Account] = Field(
        default_factory=list,
        description=f"Slurm accounts; default: one, {DEFAULT_ACCOUNT}. Accounts and users are added, never removed "
        "(their history stays).",
    )
    enforce_associations: bool = Field(
        True,
        description="AccountingStorageEnforce=associations,limits,qos,safe: only users in `users` (and root) can "
        "run jobs, every job counts against its account's fair share, and the accounts' limits (grp_tres, max_jobs, "
        "max_submit_jobs, max_wall) hold.",
    )
    fairshare_weight: int = Field(
        10000, ge=0, description="PriorityWeightFairshare: how much fair share weighs in a job's priority."
    )
    age_weight: int = Field(1000, ge=0, description="PriorityWeightAge: how much waiting time weighs.")
    decay_half_life: str = Field(
        "7-0",
        pattern=r"^(\d+-)?\d+(:\d{2}){0,2}$",
        description="PriorityDecayHalfLife: after this long past usage counts half (days-hours, or minutes).",
    )
    innodb_buffer_pool_mb: int | None = Field(
        None,
        ge=16,
        description="MariaDB on the head: innodb_buffer_pool_size in MiB. Default: 10% of the head's memory, from "
        "128 to 4096 (SchedMD: 5 to 50 percent of the memory).",
    )

    def effective_accounts(self) -> list[Account]:
        return list(self.accounts) or [Account(name=DEFAULT_ACCOUNT, description="every user by default")]


# Plugin choices that work in each environment, by provider ("cloud": every cloud provider)
# and, where an image base needs other ones, by image base. Slurm's cgroup plugins need a
# cgroup plugin for the host's cgroup version: the local provider's nspawn nodes on a cgroup
# v1 hybrid host cannot use them (PLATFORM.md); Ubuntu 24.04 boots cgroup v2 only and its
# Slurm 23.11 has cgroup/v2; Ubuntu 22.04 boots cgroup v2 only too, but its Slurm 21.08 has
# cgroup/v1 only (cgroup/v2 came with Slurm 22.05), so slurmd would not start with them.
_WITHOUT_CGROUP = {
    "proctrack_type": "proctrack/linuxproc",
    "task_plugin": "task/affinity",
    "jobacct_gather_type": "jobacct_gather/linux",
}
SLURM_PLUGIN_DEFAULTS = {
    "local": _WITHOUT_CGROUP,
    "cloud": {
        "proctrack_type": "proctrack/cgroup",
        "task_plugin": "task/cgroup,task/affinity",
        "jobacct_gather_type": "jobacct_gather/cgroup",
    },
    "ubuntu-22.04": _WITHOUT_CGROUP,
}
# Image bases whose Slurm cannot run the cgroup plugins at all, and why.
SLURM_WITHOUT_CGROUP_V2 = {
    "ubuntu-22.04": "Ubuntu 22.04 boots cgroup v2 only and its Slurm 21.08 has no cgroup/v2 plugin (Slurm 22.05 "
    "added it)",
}


def _plugin_default_text(key: str) -> str:
    cloud, without = SLURM_PLUGIN_DEFAULTS["cloud"][key], SLURM_PLUGIN_DEFAULTS["local"][key]
    return f"Default: aws {cloud} (ubuntu-24.04); {without} on local and on aws ubuntu-22.04."


class SlurmConfig(Strict):
    proctrack_type: str | None = Field(None, description=_plugin_default_text("proctrack_type"))
    task_plugin: str | None = Field(None, description=_plugin_default_text("task_plugin"))
    jobacct_gather_type: str | None = Field(None, description=_plugin_default_text("jobacct_gather_type"))


# ResumeTimeout defaults (power.resume_timeout): a GPU, EFA or InfiniBand node's boot takes minutes
# (hardware review item 14: 600 s killed slow p5 and ND v5 boots after billing them).
RESUME_TIMEOUT_DEFAULT = 600
RESUME_TIMEOUT_ACCELERATED = 1800


class PowerConfig(Strict):
    """Power saving of elastic node groups (Slurm's ResumeProgram/SuspendProgram and the reconcile loop)."""

    resume_timeout: int | None = Field(
        None,
        ge=30,
        description="Seconds a resumed node has to boot and register before Slurm marks it DOWN (and its jobs "
        f"are requeued). Default: {RESUME_TIMEOUT_ACCELERATED} when an elastic node has GPUs, EFA or InfiniBand "
        "(driver, fabric manager and HCA start-up take minutes; ParallelCluster and CycleCloud use 1800), else "
        f"{RESUME_TIMEOUT_DEFAULT}.",
    )

    def effective_resume_timeout(self, accelerated: bool) -> int:
        """resume_timeout, or its default for elastic nodes with (accelerated) or without GPUs and fabrics."""
        if self.resume_timeout is not None:
            return self.resume_timeout
        return RESUME_TIMEOUT_ACCELERATED if accelerated else RESUME_TIMEOUT_DEFAULT

    suspend_timeout: int = Field(120, ge=10, description="Seconds a node has to power down (SuspendTimeout).")
    failed_node_cooldown: int = Field(
        300, ge=0, description="Seconds a node stays DOWN after a failed resume before it returns to service."
    )
    capacity_cooldown: int = Field(
        600, ge=0, description="Seconds an instance type is skipped after a capacity error (clouds)."
    )
    orphan_grace: int = Field(
        120, ge=0, description="Seconds an instance may run behind a powered-down node before it is terminated."
    )


# NVIDIA Xid codes after which a GPU needs a reset or service (NVIDIA's Xid catalog,
# docs.nvidia.com/deploy/xid-errors, "Resolution Bucket" RESET_GPU / RESTART_BM / CONTACT_SUPPORT):
# GPU stopped processing (46: CRITICAL in NVIDIA's health validation Xid checks), double-bit ECC
# (48), row remapping and page retirement (63, 64), NVLink (74), fallen off the bus (79), high
# single-bit ECC rate (92), contained and uncontained ECC (94, 95), GSP timeouts (119, 120), reset
# required (154). After a GPU reset, `clusterbake-health --xids-cleared` on the node forgets them.
DEFAULT_FATAL_XIDS = (46, 48, 63, 64, 74, 79, 92, 94, 95, 119, 120, 154)


# `dcgmi diag -r 2` runs "approximately two minutes" (NVIDIA's dcgmi diag reference): its timeout at least.
DCGM_LEVEL2_MIN_TIMEOUT = 180


class HealthConfig(Strict):
    """Health checks of the compute nodes (role node_health): a failing check drains the node."""

    interval: int = Field(
        300,
        ge=0,
        le=86400,
        description="Seconds between checks of every compute node (Slurm's HealthCheckInterval; the node's own "
        "timer runs them too, since Slurm cannot reach a node whose munge is down); they also run when slurmd "
        "starts, before the node registers. 0: no health checks.",
    )
    disk_paths: list[str] = Field(
        default_factory=lambda: ["/", "/tmp"], description="File systems whose free space is checked."
    )
    disk_min_free_mb: int = Field(1024, ge=0, description="MiB each of disk_paths must have free.")
    memory_min_available_mb: int = Field(512, ge=0, description="MiB of MemAvailable a node must have.")
    max_restarts: int = Field(
        3, ge=1, description="munge or slurmd restarted by systemd this many times within restart_window: drained."
    )
    restart_window: int = Field(600, ge=60, description="Seconds over which daemon restarts are counted.")
    fatal_xids: list[int] = Field(
        default_factory=lambda: list(DEFAULT_FATAL_XIDS),
        description="GPU nodes: NVIDIA Xid codes in the kernel log since boot (or since `clusterbake-health "
        "--xids-cleared` after a GPU reset) that drain the node; NVSwitch nodes also drain on a fatal SXid.",
    )
    dcgm_diag_level: int = Field(
        1,
        ge=0,
        le=2,
        description="GPU jobs' prolog on nodes with DCGM: `dcgmi diag -r LEVEL` on the job's GPUs before the job; "
        "0: none. 1 takes seconds, 2 about two minutes (needs dcgm_diag_timeout >= "
        f"{DCGM_LEVEL2_MIN_TIMEOUT}); 3 (about 15 minutes, NVIDIA's dcgmi diag reference) is no prolog's.",
    )
    dcgm_diag_timeout: int = Field(
        90, ge=10, le=600, description="Seconds the prolog's DCGM diagnostic may take before it counts as failed."
    )

    @model_validator(mode="after")
    def _diagnostic_fits_its_timeout(self):
        # A level that cannot finish in time drains every GPU node at its first job, for a person to
        # resume (hardware review item 10).
        if self.dcgm_diag_level == 2 and self.dcgm_diag_timeout < DCGM_LEVEL2_MIN_TIMEOUT:
            raise ValueError(
                f"health.dcgm_diag_level 2 runs about two minutes (NVIDIA's dcgmi diag reference): set "
                f"health.dcgm_diag_timeout to at least {DCGM_LEVEL2_MIN_TIMEOUT}, or use level 1"
            )
        return self

    @field_validator("disk_paths")
    @classmethod
    def _absolute(cls, value: list[str]) -> list[str]:
        for path in value:
            if not path.startswith("/"):
                raise ValueError(f"'{path}' is not an absolute path")
        return value


class RecoveryConfig(Strict):
    """What happens after a node is lost (a dead machine, a reclaimed spot instance)."""

    requeue_delay: int = Field(
        120,
        ge=30,
        le=1200,
        description="Seconds a requeued job waits before it can start again (Slurm's AuthInfo cred_expire; it "
        "must also cover a job step's launch, prolog included).",
    )
    replace_lost_nodes: bool = Field(
        True,
        description="A static node whose machine is gone is set DOWN at once (its jobs requeued) and started "
        "again (clouds: replaced) by the head's reconcile loop.",
    )
    reconcile_interval: int = Field(30, ge=5, le=600, description="Seconds between the reconcile loop's passes.")


class CheckpointsConfig(Strict):
    """Durable copies of the job templates' checkpoints (scripts/jobs/checkpoint-copy)."""

    copy_to: str | None = Field(
        None,
        pattern=r"^(s3://[a-z0-9][a-z0-9.-]{1,61}[a-z0-9](/[^\s]*)?|/[^\s]*)$",
        description="Where each checkpoint is copied after it is written, and restored from when the checkpoint "
        "directory has none (shared storage lost): s3://bucket/prefix (aws: the node role may read and write "
        "there; the bucket must exist), or a directory on the nodes where a bucket or container is mounted "
        "(Mountpoint for S3, blobfuse2). Each job's copies go under <copy_to>/<job name>.",
    )


# Where the monitoring daemons listen (one place: the inventory hands them to the roles, and
# `clusterbake report` reaches Prometheus there through the head's SSH connection).
MONITORING_PORTS = {"prometheus": 9090, "node_exporter": 9100, "slurm_exporter": 9341, "dcgm_exporter": 9400}


# An LDAP DN: attribute=value pairs (no control characters; SSSD reads it from its file).
DN_PATTERN = r"^[A-Za-z][A-Za-z0-9-]*=[^\x00-\x1f\x7f]+$"


class DirectoryConfig(Strict):
    """Users from an LDAP directory (OpenLDAP, 389-ds, FreeIPA's or Active Directory's LDAP) through SSSD on
    every node, besides the config's own users."""

    uri: str = Field(
        pattern=r"^ldaps?://[A-Za-z0-9.-]+(:\d{1,5})?/?$",
        description="The directory server: ldaps://host[:port] (TLS), or ldap://host[:port] with start_tls.",
    )
    base_dn: str = Field(pattern=DN_PATTERN, description="Where users and groups are searched, e.g. dc=example,dc=org.")
    users_group: str = Field(
        pattern=r"^[A-Za-z0-9_.-]{1,64}$",
        description="The directory group whose members use the cluster: they log in (login nodes) and are "
        "registered for accounting in default_account; other directory users are refused.",
    )
    default_account: str | None = Field(
        None, description="Slurm account of the directory's users (accounting.accounts); default: the first account."
    )
    bind_dn: str | None = Field(
        None, pattern=DN_PATTERN, description="The DN SSSD binds as (a read-only service account); none: anonymous."
    )
    bind_password_file: str | None = Field(
        None,
        description="File on this machine with bind_dn's password (one line, 0600): it reaches the nodes in their "
        "join bundles only (the clouds' secret store), SSSD's config 0600 root.",
    )
    ca_file: str | None = Field(
        None, description="PEM file on this machine: the CA that signed the directory server's certificate."
    )
    start_tls: bool = Field(False, description="ldap:// with StartTLS (ldap_id_use_start_tls).")
    ldap_schema: Literal["rfc2307", "rfc2307bis", "ipa", "ad"] = Field(
        "rfc2307",
        description="The directory's schema (SSSD ldap_schema): rfc2307 (OpenLDAP's nis), rfc2307bis, ipa, ad.",
    )
    min_uid: int = Field(
        FIRST_USER_UID,
        ge=1000,
        description="Directory users below this uid are not cluster users (SSSD min_id): the images' own accounts.",
    )

    @model_validator(mode="after")
    def _secure(self) -> DirectoryConfig:
        if self.uri.startswith("ldap://") and not self.start_tls:
            raise ValueError("directory.uri: ldap:// sends the bind password in clear; use ldaps:// or start_tls: true")
        if (self.bind_dn is None) != (self.bind_password_file is None):
            raise ValueError("directory.bind_password_file: give bind_dn and bind_password_file together, or neither")
        return self


class RestApiConfig(Strict):
    """slurmrestd on the head: Slurm's REST API, with JSON Web Tokens (`clusterbake token USER`)."""

    enabled: bool = Field(
        False,
        description="slurmrestd on the head's cluster address (JWT only: AuthAltTypes=auth/jwt); reachable from "
        "the cluster's nodes (the login nodes), never from outside the cluster network.",
    )
    port: int = Field(6820, ge=1024, le=65535, description="Its TCP port.")


class MonitoringConfig(Strict):
    """Prometheus on the head, node exporter on every node, a Slurm exporter on the head and dcgm-exporter on
    GPU nodes; `clusterbake report` plots what they recorded."""

    enabled: bool = Field(
        True,
        description="Prometheus and the Slurm exporter on the head, node exporter on every node (what it costs at "
        "bring-up: `bench/bringup.py --without monitoring`).",
    )
    node_exporter: bool = Field(
        True, description="Node exporter on every node (CPU, memory, disks, network of each machine)."
    )
    dcgm_exporter: bool = Field(
        True, description="dcgm-exporter on GPU nodes with DCGM (the dcgm feature group; not placeholder GPUs)."
    )
    scrape_interval: int = Field(15, ge=5, le=300, description="Seconds between two scrapes of every target.")
    retention: str = Field(
        "15d",
        pattern=r"^\d+[smhdwy]$",
        description="How long Prometheus keeps its data on the head's disk (--storage.tsdb.retention.time).",
    )
