"""The aws provider: EC2 instances in an existing VPC and subnet, found again by their tags."""

from __future__ import annotations

import os
import shutil
from functools import cached_property
from pathlib import Path

import hostlist

from clusterbake import remote
from clusterbake.config import ClusterConfig, NodeGroup
from clusterbake.dry_run import CREATE, EXISTS, PlannedResource
from clusterbake.errors import ClusterbakeError, ConfigError
from clusterbake.images.store import aws_image_source, find_aws_image
from clusterbake.inventory import build_inventory
from clusterbake.plan import LOGIN_GROUP, NodeSpec, plan_nodes
from clusterbake.progress import say
from clusterbake.providers import common
from clusterbake.providers.aws import (
    billing,
    checks,
    discover,
    iam,
    placement,
    prices,
    quotas,
    resources,
    storage,
    subnet_reservations,
    tags,
)
from clusterbake.providers.aws import secrets as join_secrets
from clusterbake.providers.aws.api import (
    CAPACITY_ERRORS,
    aws_error_translation,
    aws_errors,
    call,
    client,
    ec2_client,
    paginate,
)
from clusterbake.providers.aws.catalogue import Catalogue, InstanceTypeInfo
from clusterbake.providers.aws.launch import BATCH, GroupLaunch, NodeLaunch, launch_groups, wait_for_state
from clusterbake.providers.base import BillingCheck, CostEstimate, Price
from clusterbake.providers.cloud import CloudProvider, Machine, Publish
from clusterbake.providers.userdata import NAME_PLACEHOLDER, user_data, user_data_template
from clusterbake.state import StateDir
from clusterbake.topology import TopologyError, switches

# `cluster down`: terminate, then look again (a node the head launched meanwhile), this many times.
DESTROY_ROUNDS = 3
# What a `destroy` lists one by one; above that, a count.
LIST_LIMIT = 20


class AwsProvider(CloudProvider):
    # A failed group's launches are rolled back by launch.py.
    ready_hint = "check aws.ssh_cidrs / aws.bastion and the instances' system logs (EC2 console output)"
    sdk_errors = staticmethod(aws_error_translation)
    subnet_field = "aws.subnet_id"

    def __init__(self, config: ClusterConfig, state: StateDir, client=None):
        if config.aws is None:
            raise ConfigError("aws: required with provider aws")
        super().__init__(config, state)
        self.aws = config.aws
        self.login_user, self.bastion = self.aws.ssh_user, self.aws.bastion
        self._client = client
        self._zone: str | None = None
        self._subnet: dict | None = None
        self._infos: dict[str, InstanceTypeInfo] | None = None
        self._reservations: dict[str, dict] | None = None
        self._clients: dict[str, object] = {}
        self._kms_key_arn: str | None = None

    @property
    def client(self):
        if self._client is None:
            self._client = ec2_client(self.aws.region)
        return self._client

    def api(self, service: str):
        """A client of another AWS service (IAM, Secrets Manager, EFS, FSx, ...) in the cluster's region."""
        if service not in self._clients:
            self._clients[service] = client(service, self.aws.region)
        return self._clients[service]

    @property
    def kms_key_arn(self) -> str | None:
        if self.aws.kms_key_id and self._kms_key_arn is None:
            self._kms_key_arn = iam.resolve_kms_key(self.api("kms"), self.aws.kms_key_id)
        return self._kms_key_arn

    @property
    def checkpoint_copies(self) -> tuple[str, str] | None:
        """(bucket, prefix) of checkpoints.copy_to when it is s3://bucket/prefix: jobs write there
        with sessions of the jobs role, each narrowed to its user's prefix (iam.jobs_policy)."""
        copy_to = self.config.checkpoints.copy_to or ""
        if not copy_to.startswith("s3://"):
            return None
        bucket, _, prefix = copy_to.removeprefix("s3://").partition("/")
        return bucket, prefix.strip("/")

    @cached_property
    def jobs_role_arn(self) -> str:
        account = self.api("sts").get_caller_identity()["Account"]
        return iam.role_arn(iam.jobs_role_name(self.config.cluster_name), self.aws.region, account)

    @cached_property
    def catalogue(self) -> Catalogue:
        return Catalogue(self.client)

    @property
    def subnet_cidr(self) -> str:
        return self.subnet["CidrBlock"]

    def machines(self, power: bool = False) -> dict[str, Machine]:
        """The cluster's live instances by node name (EC2 says their state without another call)."""
        return discover.machines_of(discover.by_name(discover.cluster_instances(self.client, self.config.cluster_name)))

    @property
    def subnet(self) -> dict:
        """aws.subnet_id as DescribeSubnets has it (asked once)."""
        if self._subnet is None:
            self._subnet = checks.describe_subnet(self.client, self.config)
        return self._subnet

    def _addresses_in_use(self) -> set[str]:
        """Private addresses of every network interface in the subnet (other clusters', anyone's), and those
        other clusters (or anyone) reserved explicitly."""
        interfaces = paginate(
            self.client,
            "describe_network_interfaces",
            "NetworkInterfaces",
            Filters=[{"Name": "subnet-id", "Values": [self.aws.subnet_id]}],
        )
        return {
            address["PrivateIpAddress"]
            for interface in interfaces
            for address in interface.get("PrivateIpAddresses", [])
            if address.get("PrivateIpAddress")
        } | subnet_reservations.held_by_others(self.client, self.aws.subnet_id, self.config.cluster_name)

    # --- lifecycle -------------------------------------------------------------------

    def find_image(self) -> str:
        """The AMI: aws.ami_id, else the one the image store recorded (images/aws-latest.json)."""
        return find_aws_image(self.config, self.state)

    @aws_errors
    def validate(self) -> None:
        """Subnet, key pair, instance types (region, the subnet's AZ, EFA, spot), room in the subnet for
        every planned node: read-only calls."""
        self._subnet = checks.describe_subnet(self.client, self.config)
        self._zone = self._subnet["AvailabilityZone"]
        checks.check_key_pair(self.client, self.config)
        checks.check_secret_store_reachable(self.client, self.config, self._subnet)
        self._infos = checks.check_instance_types(self.client, self.config, self.catalogue, self._zone)
        if self.config.storage:
            storage.check_storage(self.api("efs"), self.api("fsx"), self.api("s3"), self.config.storage)
        checks.check_checkpoint_bucket(self.api("s3"), self.config)
        checks.check_existing_placement_groups(self.client, self.config)
        self._reservations = checks.check_capacity_reservations(self.client, self.config, self._zone)
        live = discover.cluster_instances(self.client, self.config.cluster_name, quotas.COUNTED_STATES)
        running = {discover.name_of(i) for i in live}
        blocks = {group.name for group in self.config.node_groups if self._capacity_block(group)}
        for what in quotas.check(self.api("service-quotas"), self.client, self.config, self._infos, running, blocks):
            say(f"    quota not checked: {what}")
        _ = self.kms_key_arn  # an unknown aws.kms_key_id is a config error, found before anything is created
        self.addresses()  # a subnet too small for the planned nodes is a config error

    @property
    def zone(self) -> str:
        if self._zone is None:
            self._zone = self.subnet["AvailabilityZone"]
        return self._zone

    @property
    def reservations(self) -> dict[str, dict]:
        """Each node group's capacity reservation (DescribeCapacityReservations), by group name."""
        if self._reservations is None:
            self._reservations = checks.check_capacity_reservations(self.client, self.config, self.zone)
        return self._reservations

    def _capacity_block(self, group: NodeGroup | None) -> bool:
        reservation = self.reservations.get(group.name) if group else None
        return bool(reservation and reservation.get("ReservationType") == "capacity-block")

    @property
    def infos(self) -> dict[str, InstanceTypeInfo]:
        if self._infos is None:
            self.validate()
        return self._infos

    @aws_errors
    def provision(self, image: Path | str | None) -> None:
        ami_id = str(image) if image else find_aws_image(self.config, self.state)
        self.check_image(ami_id)

        self.cluster.ensure_secrets()
        cluster = self.config.cluster_name
        group_id, created = resources.ensure_security_group(self.client, cluster, self.aws.vpc_id, self.aws.ssh_cidrs)
        say(f"    security group {resources.security_group_name(cluster)} ({group_id}){' created' if created else ''}")
        login_group_id = None
        if self.config.login_nodes is not None:
            login_group_id, created = resources.ensure_security_group(
                self.client, cluster, self.aws.vpc_id, self.config.login_nodes.ssh_cidrs, login=True
            )
            name = resources.security_group_name(cluster, resources.LOGIN_GROUP_SUFFIX)
            say(f"    security group {name} ({login_group_id}, the login nodes'){' created' if created else ''}")
        profile, _, profile_created = iam.ensure_node_role(
            self.api("iam"),
            self.api("sts"),
            cluster,
            self.aws.region,
            kms_key_arn=self.kms_key_arn,
            jobs_role=self.checkpoint_copies is not None,
        )
        say(f"    instance profile {profile}{' created' if profile_created else ''}")
        if any(group.spot for group in self.config.node_groups) and iam.ensure_spot_role(self.api("iam")):
            say(f"    service-linked role {iam.SPOT_ROLE} created (the account's first Spot launches need it)")
        if self.checkpoint_copies:
            _, jobs_created = iam.ensure_jobs_role(
                self.api("iam"), self.api("sts"), cluster, self.aws.region, *self.checkpoint_copies
            )
            say(f"    role {iam.jobs_role_name(cluster)} (jobs' checkpoint copies){' created' if jobs_created else ''}")
        endpoints = storage.ensure_file_systems(
            self.api("efs"), self.api("fsx"), cluster, self.config.storage or [], self.aws.subnet_id, group_id
        )
        for name, endpoint in sorted(endpoints.items()):
            say(f"    {endpoint['type']} {endpoint['file_system_id']} for storage {name}")
        for nodegroup in self.self_joining_groups():
            join_secrets.ensure_secret(
                self.api("secretsmanager"), cluster, nodegroup, self.kms_key_arn, kms=self.api("kms")
            )
        security_groups = self._role_security_groups(group_id, login_group_id)
        templates = self._ensure_templates(ami_id, security_groups, profile, iam.head_role_name(cluster))
        # The head's role launches and terminates elastic nodes (its power program): from the
        # compute groups' templates only, passing the node role only.
        head_profile, _, head_created = iam.ensure_head_role(
            self.api("iam"),
            self.api("sts"),
            cluster,
            self.aws.region,
            iam.HeadLaunches(
                subnet_id=self.aws.subnet_id,
                security_group_id=group_id,
                image_id=ami_id,
                launch_template_ids=[templates[g.name][0] for g in self.config.node_groups],
                instance_types=[t for g in self.config.node_groups for t in g.types],
                key_name=self.aws.key_name,
                volume_keys=iam.volume_keys(self.client, self.api("kms"), ami_id),
            ),
        )
        say(f"    instance profile {head_profile}{' created' if head_created else ''}")

        existing = discover.by_name(discover.cluster_instances(self.client, cluster))
        # Every planned node's address is decided (and kept) now, elastic ones included.
        addresses = self.addresses(discover.machines_of(existing), in_use=self._addresses_in_use())
        # Kept from EC2's own choices for other interfaces until the cluster goes (realcloud review A4).
        for change in subnet_reservations.ensure(self.client, self.aws.subnet_id, cluster, addresses.values()):
            say(f"    planned addresses: {change}")
        if "head" in existing:
            self._ensure_head_profile(existing["head"], head_profile)
        static = [n for n in self.nodes if not n.elastic]
        # Elastic nodes are Slurm's to power up and down: never started here.
        self._start_stopped({n.name: existing[n.name] for n in static if n.name in existing})
        planned = {n.name for n in self.nodes}
        extra = sorted(set(existing) - planned)
        if extra:
            say(f"    warning: instances not in the config: {', '.join(extra)} (`cluster down` removes them)")
        missing = [n for n in static if n.name not in existing]
        elastic = len(self.nodes) - len(static)
        if missing:
            self._launch(missing, templates, security_groups, addresses)
        else:
            say(f"    all {len(static)} nodes exist")
        if elastic:
            say(f"    {elastic} elastic node(s) powered up by Slurm for jobs")
        self._forget_replaced_hosts()
        self._write_state(ami_id, security_groups, templates, endpoints, addresses)

    def _ensure_head_profile(self, head: dict, profile: str) -> None:
        """A head launched before the head role existed (with the node profile) gets the head's profile."""
        found = call(
            self.client.describe_iam_instance_profile_associations,
            Filters=[{"Name": "instance-id", "Values": [head["InstanceId"]]}],
        )["IamInstanceProfileAssociations"]
        current = [a for a in found if a.get("State") in ("associating", "associated")]
        if current and current[0].get("IamInstanceProfile", {}).get("Arn", "").endswith(f"/{profile}"):
            return
        # The head's profile may be seconds old: EC2 refuses it until IAM has spread it (realcloud A11).
        if current:
            iam.call_while_profile_not_ready(
                self.client.replace_iam_instance_profile_association,
                AssociationId=current[0]["AssociationId"],
                IamInstanceProfile={"Name": profile},
            )
        else:
            iam.call_while_profile_not_ready(
                self.client.associate_iam_instance_profile,
                InstanceId=head["InstanceId"],
                IamInstanceProfile={"Name": profile},
            )
        say(f"    head {head['InstanceId']}: instance profile now {profile}")

    def _ensure_templates(
        self, ami_id: str, security_groups: dict[str, list[str]], profile: str, head_profile: str
    ) -> dict[str, tuple[str, str]]:
        """A launch template per node group, the head and the login nodes (the head with its own profile,
        the login nodes with their own security group besides the cluster's): name -> (id, version)."""
        cluster = self.config.cluster_name
        sections: list[tuple[str, str, str, NodeGroup | None]] = [
            ("head", "head", self.config.head.instance_type, None)
        ]
        if self.config.login_nodes is not None:
            sections.append(("login", LOGIN_GROUP, self.config.login_nodes.instance_type, None))
        sections += [("compute", g.name, g.instance_type, g) for g in self.config.node_groups]
        templates = {}
        for role, nodegroup, instance_type, group in sections:
            pg_name = self._placement_group(group)
            own = bool(group and pg_name and not group.existing_placement_group)
            if own and placement.ensure(self.client, pg_name, cluster):
                say(f"    placement group {pg_name} created")
            data = resources.template_data(
                ami_id=ami_id,
                info=self.infos[instance_type],
                subnet_id=self.aws.subnet_id,
                group_ids=security_groups[role],
                node_tags=tags.node_tags(cluster, role, nodegroup),
                efa=bool(group and group.efa),
                placement_group=pg_name,
                spot=bool(group and group.spot),
                capacity_reservation_id=group.capacity_reservation_id if group else None,
                capacity_block=self._capacity_block(group),
                key_name=self.aws.key_name,
                instance_profile=head_profile if role == "head" else profile,
            )
            name = resources.template_name(cluster, nodegroup)
            template_id, version, what = resources.ensure_launch_template(self.client, name, data, cluster)
            if what != "unchanged":
                say(f"    launch template {name} {what} (version {version})")
            templates[nodegroup] = (template_id, version)
        return templates

    def _join_source(self, node: NodeSpec) -> dict[str, str] | None:
        """Where a compute or login node reads its bundle: its group's secret, with the endpoint this
        controller uses."""
        if node.role == "head":
            return None  # the head is configured by Ansible
        return {
            "cloud": "aws",
            "region": self.aws.region,
            "secret_id": join_secrets.secret_name(self.config.cluster_name, node.nodegroup),
            "endpoint_url": self.api("secretsmanager").meta.endpoint_url,
        }

    def _launch(
        self,
        missing: list[NodeSpec],
        templates: dict[str, tuple[str, str]],
        security_groups: dict[str, list[str]],
        addresses: dict[str, str],
    ) -> None:
        """Launch the missing nodes, each at its planned address (a replaced node gets its own back)."""
        public_key = self.cluster.ssh_key.with_suffix(".pub").read_text().strip()
        batches: dict[str, GroupLaunch] = {}
        for node in missing:
            batch = batches.setdefault(
                node.nodegroup, GroupLaunch(node.nodegroup, self._instance_type(node), self.zone)
            )
            template_id, version = templates[node.nodegroup]
            group = self._group(node.nodegroup)
            interfaces = resources.network_interfaces(
                self.infos[self._instance_type(node)],
                bool(group and group.efa),
                self.aws.subnet_id,
                security_groups[node.role],
            )
            interfaces[0]["PrivateIpAddress"] = addresses[node.name]
            batch.nodes.append(
                NodeLaunch(
                    name=node.name,
                    template_id=template_id,
                    template_version=version,
                    user_data=user_data(
                        cluster=self.config.cluster_name,
                        hostname=node.name,
                        ssh_user=self.aws.ssh_user,
                        authorized_keys=[public_key],
                        join=self._join_source(node),
                    ),
                    tags=tags.node_tags(self.config.cluster_name, node.role, node.nodegroup, node.name),
                    network_interfaces=interfaces,
                )
            )
        launch_groups(self.client, list(batches.values()))

    def _start_stopped(self, existing: dict[str, dict]) -> None:
        stopped = [i["InstanceId"] for i in existing.values() if i["State"]["Name"] in ("stopped", "stopping")]
        if not stopped:
            return
        say(f"    starting {len(stopped)} stopped instance(s)")
        wait_for_state(self.client, stopped, "stopped")
        for start in range(0, len(stopped), BATCH):
            call(self.client.start_instances, InstanceIds=stopped[start : start + BATCH])
        wait_for_state(self.client, stopped, "running")

    def _write_state(
        self,
        ami_id: str,
        security_groups: dict[str, list[str]],
        templates: dict[str, tuple[str, str]],
        endpoints: dict[str, dict],
        addresses: dict[str, str],
    ) -> None:
        instances = discover.by_name(discover.cluster_instances(self.client, self.config.cluster_name), warn=False)
        # Every planned node keeps its address, with or without an instance: a replaced or
        # powered-up node gets it back, so /etc/hosts and slurm.conf never change for it.
        nodes: dict[str, dict] = {name: {"address": address} for name, address in addresses.items()}
        for name, instance in instances.items():
            if name in nodes:
                nodes[name] = {
                    "instance_id": instance["InstanceId"],
                    "address": instance.get("PrivateIpAddress") or addresses[name],
                }
        self.cluster.write_state(
            {
                "cluster": self.config.cluster_name,
                "provider": "aws",
                "image": ami_id,
                "region": self.aws.region,
                "availability_zone": self.zone,
                "security_group": security_groups["head"][0],
                **({"login_security_group": security_groups["login"][1]} if len(security_groups["login"]) > 1 else {}),
                "instance_profile": iam.node_role_name(self.config.cluster_name),
                "launch_templates": {name: {"id": i, "version": v} for name, (i, v) in templates.items()},
                "storage": endpoints,
                "nodes": dict(sorted(nodes.items())),
            }
        )

    def _check_bundle(self, group: str, bundle: str) -> None:
        join_secrets.check_size(group, bundle)

    @aws_errors
    def _bundle_publisher(self) -> Publish:
        """A group's bundle as its Secrets Manager secret; a replaced one is fetched at once by the
        group's running nodes (clusterbake-node-boot fetch)."""
        cluster = self.config.cluster_name
        sm = self.api("secretsmanager")

        def publish(group: str, bundle: str) -> tuple[list[str], bool]:
            had_value = join_secrets.has_value(sm, cluster, group)
            if not join_secrets.publish(sm, cluster, group, bundle):
                return [], False
            say(f"    join bundle of {group} published ({join_secrets.secret_name(cluster, group)})")
            return [f"{group}: join bundle published"], had_value

        return publish

    @aws_errors
    def start_node(self, name: str) -> None:
        self.node(name)
        instance = self._instance(name)
        if instance is None:
            self._replace(name)
            return
        if instance["State"]["Name"] in ("pending", "running"):
            return
        self._start_stopped({name: instance})

    @aws_errors
    def use_image(self, image: Path | str) -> bool:
        """The AMI new instances launch from: `provision` moves every launch template to it (a new
        version each), as `cluster up` would. The head's power program launches elastic nodes from
        the version the configure play gave it: ops image_update runs that play after."""
        state = self.cluster.read_state()
        if str(image) == state.get("image"):
            return False
        say(f"    cluster image: {state.get('image')} -> {image} (launch templates move to it)")
        self.provision(str(image))
        return True

    @aws_errors
    def replace_node(self, name: str, image: Path | str | None = None) -> None:
        """Terminate the node's instance and launch a new one from its group's launch template, at its
        planned address. Another AMI first becomes the cluster's: `provision` moves every launch
        template to it (new versions), as `cluster up` would. An elastic node without an instance
        only gets the new template: the head's power program launches it (after `cluster up` or an
        ops playbook re-rendered its template version)."""
        node = self.node(name)
        if node.role != "compute":
            raise ConfigError(f"node {name}: only compute nodes are replaced (the head keeps Slurm's state)")
        if not self.cluster.read_state().get("launch_templates"):
            raise ClusterbakeError(f"cluster {self.config.cluster_name} was never provisioned; run `cluster up`")
        if image is not None:
            self.use_image(image)
        instance = self._instance(name)
        if instance is not None:
            say(f"    {name}: terminating {instance['InstanceId']}")
            call(self.client.terminate_instances, InstanceIds=[instance["InstanceId"]])
            wait_for_state(self.client, [instance["InstanceId"]], "terminated")
        elif node.elastic:
            say(f"    {name}: powered down; launched from the new template when Slurm powers it up")
            return
        self._replace(name, reason=None)

    def _replace(self, name: str, reason: str | None = "instance gone: replaced by clusterbake node start") -> None:
        """A node whose instance is gone: launch a new one from the group's launch template.

        It gets the node's address back and joins by itself (its bundle is in the secret
        store): nothing else in the cluster changes, and nothing runs Ansible.
        """
        state = self.cluster.read_state()
        if not state.get("launch_templates") or not state.get("security_group"):
            raise ClusterbakeError(
                f"node {name} has no instance and the cluster was never provisioned; run `cluster up`"
            )
        node = self.node(name)
        template = state["launch_templates"][node.nodegroup]
        templates = {node.nodegroup: (template["id"], template["version"])}
        say(f"    node {name}: no instance, launching a replacement")
        existing = discover.by_name(discover.cluster_instances(self.client, self.config.cluster_name), warn=False)
        if reason and self._launched_by_the_head(name, existing.get(name)):
            return
        # An elastic node's state is Slurm's (powered down, or being powered up); a node replaced on
        # purpose (reason None) was drained by whoever replaced it.
        if not node.elastic and reason:
            self.tell_slurm_down(name, reason)
        addresses = self.addresses(discover.machines_of(existing))
        try:
            self._launch([node], templates, self._recorded_security_groups(state), addresses)
        except ClusterbakeError:
            # The head's loop may have launched it between that look and this launch, which EC2 then
            # refuses (InvalidIPAddress.InUse: the address is its instance's).
            if reason and self._launched_by_the_head(name, self._instance(name)):
                return
            raise
        self._forget_replaced_hosts()
        self._write_state(
            state["image"],
            self._recorded_security_groups(state),
            templates | self._recorded_templates(state),
            state.get("storage", {}),
            addresses,
        )

    @staticmethod
    def _launched_by_the_head(name: str, instance: dict | None) -> bool:
        """Whether the node's instance is live already: the head's reconcile loop
        (recovery.replace_lost_nodes) replaced it too."""
        if (instance or {}).get("State", {}).get("Name") not in ("pending", "running"):
            return False
        say(f"    node {name}: the head has launched its replacement already")
        return True

    @staticmethod
    def _role_security_groups(cluster_group: str, login_group: str | None) -> dict[str, list[str]]:
        """Each role's security groups: the cluster's, and on the login nodes their own besides it."""
        login = [cluster_group, *([login_group] if login_group else [])]
        return {"head": [cluster_group], "compute": [cluster_group], "login": login}

    @classmethod
    def _recorded_security_groups(cls, state: dict) -> dict[str, list[str]]:
        """Each role's security groups, as state.json has them."""
        return cls._role_security_groups(state["security_group"], state.get("login_security_group"))

    @staticmethod
    def _recorded_templates(state: dict) -> dict[str, tuple[str, str]]:
        return {name: (t["id"], t["version"]) for name, t in state.get("launch_templates", {}).items()}

    @aws_errors
    def stop_node(self, name: str) -> None:
        self.node(name)
        instance = self._instance(name)
        if instance is None or instance["State"]["Name"] in ("stopped",):
            return
        if instance.get("InstanceLifecycle") == "spot":
            # EC2 stops only Spot instances of persistent requests; a group's are one-time. Refused
            # before Slurm hears of it, so the node stays in service.
            raise ClusterbakeError(
                f"node {name}: {instance['InstanceId']} is a Spot instance, which EC2 cannot stop (a one-time "
                f"Spot request's); `clusterbake node replace {name}` gives it a new instance, or drain it in "
                f"Slurm (scontrol update NodeName={name} State=DRAIN Reason=...) to take it out of service"
            )
        self.tell_slurm_down(name, "stopped by clusterbake node stop")
        call(self.client.stop_instances, InstanceIds=[instance["InstanceId"]])
        wait_for_state(self.client, [instance["InstanceId"]], "stopped")

    def _instance(self, name: str) -> dict | None:
        return discover.by_name(discover.cluster_instances(self.client, self.config.cluster_name)).get(name)

    @aws_errors
    def destroy(self) -> list[str]:
        """Terminate every tagged instance (and wait), then the templates, placement groups, group."""
        cluster = self.config.cluster_name
        removed: list[str] = []
        # The head's power program launches nodes (lost static ones, elastic ones for jobs): its role
        # loses that first, or a node it launches while the cluster goes outlives the cluster.
        if iam.revoke_head_policy(self.api("iam"), cluster):
            say("    the head may launch nothing more (its role's policy removed)")
        described: list[str] = []
        for _ in range(DESTROY_ROUNDS):  # again for any the head launched before its policy went
            instances = discover.cluster_instances(self.client, cluster, states=discover.NOT_GONE)
            if not instances:
                break
            ids = [i["InstanceId"] for i in instances]
            say(f"    terminating {len(ids)} instance(s)")
            for start in range(0, len(ids), BATCH):
                call(self.client.terminate_instances, InstanceIds=ids[start : start + BATCH])
            wait_for_state(self.client, ids, "terminated")
            described += sorted(f"instance {discover.name_of(i) or '?'} ({i['InstanceId']})" for i in instances)
        removed += described if len(described) <= LIST_LIMIT else [f"{len(described)} instances"]
        own = resources.cluster_security_group(resources.find_security_groups(self.client, cluster), cluster)
        # File systems first: their mount targets hold on to the security group.
        removed += storage.delete_file_systems(
            self.api("efs"),
            self.api("fsx"),
            cluster,
            self.config.storage or [],
            security_group_id=own["GroupId"] if own else None,
        )
        for template in resources.find_launch_templates(self.client, cluster):
            resources.delete_launch_template(self.client, template["LaunchTemplateId"])
            removed.append(f"launch template {template['LaunchTemplateName']}")
        for name in placement.find(self.client, cluster):
            placement.delete(self.client, name)
            removed.append(f"placement group {name}")
        removed += subnet_reservations.delete_all(self.client, self.aws.subnet_id, cluster)
        for group in resources.find_security_groups(self.client, cluster):
            resources.delete_security_group(self.client, group["GroupId"])
            removed.append(f"security group {group['GroupName']} ({group['GroupId']})")
        nodegroups = ["head", LOGIN_GROUP, *(g.name for g in self.config.node_groups)]
        removed += join_secrets.delete_all(self.api("secretsmanager"), cluster, nodegroups)
        removed += iam.delete_node_role(self.api("iam"), cluster)
        removed += iam.delete_head_role(self.api("iam"), cluster)
        removed += iam.delete_jobs_role(self.api("iam"), cluster)
        if self.cluster.root.exists():
            shutil.rmtree(self.cluster.root)
            removed.append(f"state {self.cluster.root}")
        return removed

    # --- queries ---------------------------------------------------------------------

    @aws_errors
    def inventory(self) -> dict:
        """Every planned node at its planned address, with `clusterbake_running` (Ansible connects to
        the head only); instances tagged clusterbake:cluster (CLUSTERBAKE_CLUSTER or the config's
        name). A cluster without any instance (not provisioned) has no hosts."""
        cluster = os.environ.get("CLUSTERBAKE_CLUSTER") or self.config.cluster_name
        instances = discover.cluster_instances(self.client, cluster)
        types = {value for _, value in common.instance_type_fields(self.config)}
        infos = self.catalogue.get(types | {i["InstanceType"] for i in instances})
        endpoints = storage.describe_endpoints(
            self.api("efs"), self.api("fsx"), cluster, self.config.storage or [], self.aws.region, self.aws.subnet_id
        )
        extra = {
            **self._connection_vars(),
            "clusterbake_storage_endpoints": endpoints,
            # Compute nodes fetch their bundle themselves (role cloud_boot): Ansible only keeps it.
            "node_join_self_join": True,
        }
        if blocks := self._capacity_block_reservations():
            extra["clusterbake_slurm_reservations"] = blocks
        if any(entry.type == "nfs" for entry in self.config.effective_storage()):
            # The head's NFS exports admit the cluster's subnet (the security group admits only the cluster).
            extra["clusterbake_subnet_cidr"] = self.subnet["CidrBlock"]
        if not instances:
            return aws_inventory(self.config, [], infos, extra)
        named = discover.by_name(instances, warn=False)
        addresses = self.addresses(discover.machines_of(named))
        # topology.conf from where EC2 says the compute nodes hang; those it has no answer for (other types,
        # not running) under `unplaced` (clusterbake.topology).
        compute = self.config.compute_node_names()
        # A group of a type EC2 places (p5, trn2 ...): topology.conf from the first `cluster up`, every node
        # under `unplaced` until its instance runs; the head's reconcile loop places them as they start
        # (role slurm_power, network.py), without the restart of slurmctld that adding TopologyPlugin takes.
        expected = any(discover.topology_levels(t) for g in self.config.node_groups for t in g.types)
        paths = discover.network_paths(self.client, named, compute)
        try:
            if topology := switches(paths, compute, expected=expected):
                extra["clusterbake_topology"] = topology
        except TopologyError as error:  # not a tree: Slurm would refuse it; place jobs without it
            say(f"    warning: EC2's instance topology makes no tree ({error}): no topology.conf")
        if any(g.elastic for g in self.config.node_groups) or self.config.recovery.replace_lost_nodes:
            extra |= {"slurm_power_provider": "aws", "slurm_power_aws": self._power_vars(addresses, infos)}
        planned = {n.name: self._planned_host_vars(n) for n in self.nodes if n.name not in named}
        return aws_inventory(self.config, instances, infos, extra, addresses=addresses, planned_vars=planned)

    def _capacity_block_reservations(self) -> list[dict]:
        """A Slurm maintenance reservation on each Capacity Block group's nodes from the time EC2 starts
        terminating the block's instances (role slurm, slurm_reservations): no job is started there that
        would still run then."""
        blocks = []
        for name, reservation in checks.describe_reservations(self.client, self.config).items():
            if reservation.get("ReservationType") != "capacity-block" or not reservation.get("EndDate"):
                continue
            nodes = [n.name for n in self.nodes if n.nodegroup == name]
            start = reservation["EndDate"].timestamp() - checks.CAPACITY_BLOCK_END_NOTICE
            blocks.append(
                {
                    "name": f"clusterbake-block-end-{name}",
                    "nodes": hostlist.collect_hostlist(nodes),
                    "start_epoch": int(start),
                    "reason": f"Capacity Block {reservation['CapacityReservationId']} ends at {reservation['EndDate']}",
                }
            )
        return blocks

    def _placement_group(self, group: NodeGroup | None) -> str | None:
        """The cluster placement group a node group launches into: an existing one it names, or its own."""
        if group is None or not group.wants_placement_group:
            return None
        return group.existing_placement_group or resources.placement_group_name(self.config.cluster_name, group.name)

    def _planned_host_vars(self, node: NodeSpec) -> dict:
        """The aws hostvars of a node without an instance (not launched, or powered down)."""
        placement = self._placement_group(self._group(node.nodegroup))
        return {
            "clusterbake_instance_id": None,
            "clusterbake_instance_type": self._instance_type(node),
            "clusterbake_availability_zone": self.zone,
            "clusterbake_placement_group": placement,
        }

    def _power_vars(self, addresses: dict[str, str], infos: dict[str, InstanceTypeInfo]) -> dict:
        """What the head's power program needs to launch elastic nodes and replace lost static
        ones (role slurm_power, power.json).

        Per group: its launch template (the latest version: `cluster up` makes the one it
        launches from the latest), its instance types in order, the network interfaces of
        each type (resources.network_interfaces; the program puts the node's address on the
        first), the user data with userdata.NAME_PLACEHOLDER for the node's name, and each
        node's address (static nodes only with recovery.replace_lost_nodes). The endpoint is
        the one this controller uses (the twin's too).
        """
        cluster = self.config.cluster_name
        templates = {
            t["LaunchTemplateName"]: (t["LaunchTemplateId"], str(t["LatestVersionNumber"]))
            for t in resources.find_launch_templates(self.client, cluster)
        }
        own = resources.cluster_security_group(resources.find_security_groups(self.client, cluster), cluster)
        group_id = own["GroupId"] if own else None
        public_key = self.cluster.ssh_key.with_suffix(".pub")
        keys = [public_key.read_text().strip()] if public_key.exists() else []
        power_groups = {}
        for group in self.config.node_groups:
            replaceable = self.config.recovery.replace_lost_nodes
            members = [n for n in self.nodes if n.nodegroup == group.name and (n.elastic or replaceable)]
            template = templates.get(resources.template_name(cluster, group.name))
            if not members or template is None or group_id is None:
                continue
            power_groups[group.name] = {
                "launch_template": {"id": template[0], "version": template[1]},
                "instance_types": group.types,
                "network_interfaces": {
                    t: resources.network_interfaces(infos[t], group.efa, self.aws.subnet_id, [group_id])
                    for t in group.types
                },
                "user_data": user_data_template(
                    cluster=cluster,
                    ssh_user=self.aws.ssh_user,
                    authorized_keys=keys,
                    join=self._join_source(members[0]),
                ),
                "tags": tags.node_tags(cluster, "compute", group.name),
                "addresses": {n.name: addresses[n.name] for n in members},
            }
        return {
            "cluster": cluster,
            "region": self.aws.region,
            "endpoint_url": self.client.meta.endpoint_url,
            "name_placeholder": NAME_PLACEHOLDER,
            # The codes on which the head's program tries the next type: the controller's list.
            "capacity_errors": sorted(CAPACITY_ERRORS),
            "groups": power_groups,
        }

    def _connection_extra(self) -> dict:
        return {
            "clusterbake_aws_region": self.aws.region,
            "fabric_socket_ifname": self.aws.network_interface,
            # Where the job templates' checkpoint copies go (checkpoints.copy_to: s3://): the endpoint
            # this controller uses (the twin's too), and the role and STS endpoint of the jobs' sessions.
            "clusterbake_s3_endpoint_url": self.api("s3").meta.endpoint_url,
            **(
                {
                    "clusterbake_jobs_role_arn": self.jobs_role_arn,
                    "clusterbake_jobs_session_policy": iam.jobs_policy(
                        self.aws.region, *self.checkpoint_copies, user=iam.JOBS_USER_PLACEHOLDER
                    ),
                    "clusterbake_sts_endpoint_url": self.api("sts").meta.endpoint_url,
                }
                if self.checkpoint_copies
                else {}
            ),
        }

    def _pin_host_keys(self, node: str, machine: Machine) -> None:
        """The node's host keys from EC2's console output (Nitro instances' at once with Latest=True)."""

        def console() -> str:
            answer = call(self.client.get_console_output, InstanceId=machine.id, Latest=True)
            return answer.get("Output") or ""  # botocore decodes its base64

        common.pin_from_console(
            self.cluster, node, machine.address, console, f"`aws ec2 get-console-output --instance-id {machine.id}`"
        )

    def _forget_replaced_hosts(self) -> list[str]:
        """Drop the known_hosts lines of nodes whose instance is not the one state.json records.

        A replaced instance keeps its node name (and may get its address back) but has new host
        keys; without this, SSH (ours and Ansible's) refuses it as a changed host key.
        """
        recorded = self.cluster.read_state().get("nodes", {})
        current = discover.by_name(discover.cluster_instances(self.client, self.config.cluster_name), warn=False)
        replaced = sorted(
            name
            for name, instance in current.items()
            if recorded.get(name, {}).get("instance_id") not in (None, instance["InstanceId"])
        )
        if not replaced:
            return []
        hosts = set(replaced)
        for name in replaced:
            hosts |= {recorded[name].get("address"), current[name].get("PrivateIpAddress")} - {None}
        if remote.forget_hosts(self.cluster.known_hosts, hosts):
            say(f"    forgot the host keys of replaced node(s) {', '.join(replaced)}")
        return replaced

    # --- cost guard (billing.py, prices.py) ------------------------------------------

    def _pricing(self):
        """The Price List Query API's client: its endpoints are in two regions only."""
        if "pricing" not in self._clients:
            self._clients["pricing"] = prices.pricing_client(self.aws.region)
        return self._clients["pricing"]

    @aws_errors
    def cost(self) -> CostEstimate:
        """Each running instance of the cluster at its market's price now (unknown where AWS says nothing)."""
        instances = discover.cluster_instances(self.client, self.config.cluster_name)
        return billing.estimate(
            instances,
            on_demand=lambda instance_type: prices.on_demand(self._pricing(), self.aws.region, instance_type),
            spot=lambda instance_type, zone: prices.spot(self.client, zone, instance_type),
        )

    # --- `cluster up --dry-run` (dry_run.py) ---------------------------------------------------

    machine_kind = "instance"
    cost_not_included = tuple(billing.NOT_INCLUDED)

    def check_image(self, image: Path | str) -> None:
        checks.check_image(self.client, self.config, str(image), self.infos, aws_image_source(self.config, self.state))

    def _market(self, group: NodeGroup | None) -> str:
        return "capacity-block" if self._capacity_block(group) else super()._market(group)

    def machine_price(self, instance_type: str, market: str) -> Price:
        if market == "capacity-block":
            return Price(0.0, "a Capacity Block: paid when it was reserved, not by the hour")
        if market == "spot":
            return prices.spot(self.client, self.zone, instance_type)
        return prices.on_demand(self._pricing(), self.aws.region, instance_type)

    @aws_errors
    def cluster_resources(self) -> list[PlannedResource]:
        """What provision() makes besides the instances, and whether each is there already (read-only)."""
        cluster = self.config.cluster_name
        groups = self.config.node_groups
        iam_client = self.api("iam")
        templates = {t["LaunchTemplateName"] for t in resources.find_launch_templates(self.client, cluster)}
        placement_groups = set(placement.find(self.client, cluster))
        secrets = {s["Name"] for s in join_secrets.find(self.api("secretsmanager"), cluster)}
        planned = [("security group", resources.security_group_name(cluster),
                    bool(resources.find_security_groups(self.client, cluster)))]  # fmt: skip
        roles = [iam.node_role_name(cluster), iam.head_role_name(cluster)]
        roles += [iam.jobs_role_name(cluster)] if self.checkpoint_copies else []
        for name in roles:
            planned.append(("IAM role and instance profile", name, "role" in iam.find(iam_client, cluster, name)))
        if any(group.spot for group in groups):
            planned.append(("service-linked role (the account's)", iam.SPOT_ROLE, iam.spot_role_exists(iam_client)))
        planned += storage.planned(self.api("efs"), self.api("fsx"), cluster, self.config.storage or [])
        for nodegroup in self.self_joining_groups():
            name = join_secrets.secret_name(cluster, nodegroup)
            planned.append(("Secrets Manager secret", name, name in secrets))
        for nodegroup in ["head", *self.self_joining_groups()]:
            name = resources.template_name(cluster, nodegroup)
            planned.append(("launch template", name, name in templates))
        for group in groups:
            name = self._placement_group(group)
            if name and not group.existing_placement_group:
                planned.append(("placement group", name, name in placement_groups))
        made = subnet_reservations.made(self.client, self.aws.subnet_id, cluster)
        planned.append(("subnet CIDR reservations", f"the planned addresses in {self.aws.subnet_id}", made))
        return [PlannedResource(kind, name, EXISTS if found else CREATE) for kind, name, found in planned]

    def billing_leftovers(self) -> BillingCheck:
        """Read-only, after destroy(): instances, EBS volumes, file systems and secrets of the cluster left."""
        return billing.leftovers(
            self.client,
            self.api("efs"),
            self.api("fsx"),
            self.api("secretsmanager"),
            self.config.cluster_name,
            self.config.storage or [],
        )


def aws_inventory(
    config: ClusterConfig,
    instances: list[dict],
    infos: dict[str, InstanceTypeInfo],
    extra: dict,
    addresses: dict[str, str] | None = None,
    planned_vars: dict[str, dict] | None = None,
) -> dict:
    """The shared inventory shape (inventory.build_inventory) of the planned nodes.

    With `addresses` (the provider's planned ones) every planned node is a host, at its
    address, with `clusterbake_running` and the aws hostvars of its instance (tag
    clusterbake:name), or `planned_vars` when it has none (not launched, or an elastic node
    powered down); without, the nodes that have an instance, at the instance's address.
    `efa` holds the hosts with EFA interfaces (efa: true on an EFA type), `gpu` the hosts
    whose type has GPUs, `nvswitch` those of an NVSwitch type (clusterbake.gpu_systems),
    which run the fabric manager.
    """
    named = discover.by_name(instances, warn=False)
    if addresses is None:
        addresses = {name: i["PrivateIpAddress"] for name, i in named.items() if i.get("PrivateIpAddress")}
    nodes, hostvars = [], {}
    for planned in plan_nodes(config, shapes=infos):
        if planned.name not in addresses:
            continue
        nodes.append(planned)
        instance = named.get(planned.name)
        if instance is not None:
            hostvars[planned.name] = discover.host_vars(instance)
        else:
            hostvars[planned.name] = dict((planned_vars or {}).get(planned.name, {}))
        hostvars[planned.name]["clusterbake_running"] = bool(instance and instance["State"]["Name"] == "running")
        group = next((g for g in config.node_groups if g.name == planned.nodegroup), None)
        if "efa" in planned.features and group is not None:
            # Every EFA interface the launch template attaches (one per EFA card); the fewest of the group's
            # types when it has several. The health check drains a node short of them (hardware review 17).
            counts = [infos[t].efa_interfaces for t in group.types if t in infos]
            if counts:
                hostvars[planned.name]["node_health_efa_devices"] = min(counts)
    return build_inventory(config, nodes, addresses, extra_vars=extra, extra_hostvars=hostvars)
