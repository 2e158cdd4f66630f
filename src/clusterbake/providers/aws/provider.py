"""The aws provider: EC2 instances in an existing VPC and subnet, found again by their tags."""

from __future__ import annotations

import os
import shutil
from functools import cached_property
from pathlib import Path

from clusterbake import remote
from clusterbake.config import ClusterConfig, NodeGroup
from clusterbake.errors import ClusterbakeError, ConfigError
from clusterbake.inventory import build_inventory
from clusterbake.progress import say
from clusterbake.providers.aws import ami, checks, discover, iam, placement, resources, storage, tags
from clusterbake.providers.aws import secrets as join_secrets
from clusterbake.providers.aws.ami import find_ami
from clusterbake.providers.aws.api import aws_errors, call, client, ec2_client
from clusterbake.providers.aws.catalogue import Catalogue, InstanceTypeInfo
from clusterbake.providers.aws.launch import BATCH, GroupLaunch, NodeLaunch, launch_groups, wait_for_state
from clusterbake.providers.aws.userdata import user_data
from clusterbake.providers.base import NodeStatus, Provider
from clusterbake.remote import Endpoint
from clusterbake.state import StateDir
from clusterbake.topology import NodeSpec, plan_nodes

SSH_READY_TIMEOUT = 600.0
# What a `destroy` lists one by one; above that, a count.
LIST_LIMIT = 20


class AwsProvider(Provider):
    # Tags, not the local state file, say what exists: a failed first `cluster up`
    # rolls back its own launches (launch.py) and keeps the security group, placement
    # groups and launch templates for the next try; `cluster down` removes them.
    destroy_after_failed_first_provision = False

    def __init__(self, config: ClusterConfig, state: StateDir, client=None):
        if config.aws is None:
            raise ConfigError("aws: required with provider aws")
        super().__init__(config, state)
        self.aws = config.aws
        self._client = client
        self._zone: str | None = None
        self._infos: dict[str, InstanceTypeInfo] | None = None
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

    @cached_property
    def catalogue(self) -> Catalogue:
        return Catalogue(self.client)

    def _group(self, name: str) -> NodeGroup | None:
        return next((g for g in self.config.node_groups if g.name == name), None)

    def _instance_type(self, node: NodeSpec) -> str:
        group = self._group(node.nodegroup)
        return group.instance_type if group else self.config.head.instance_type

    # --- lifecycle -------------------------------------------------------------------

    def find_image(self) -> str:
        return find_ami(self.config, self.state)

    @aws_errors
    def validate(self) -> None:
        """Subnet, key pair, instance types (region, the subnet's AZ, EFA, spot): read-only calls."""
        self._zone = checks.subnet_zone(self.client, self.config)
        checks.check_key_pair(self.client, self.config)
        self._infos = checks.check_instance_types(self.client, self.config, self.catalogue, self._zone)
        if self.config.storage:
            storage.check_storage(self.api("efs"), self.api("fsx"), self.api("s3"), self.config.storage)
        _ = self.kms_key_arn  # an unknown aws.kms_key_id is a config error, found before anything is created

    @property
    def zone(self) -> str:
        if self._zone is None:
            self._zone = checks.subnet_zone(self.client, self.config)
        return self._zone

    @property
    def infos(self) -> dict[str, InstanceTypeInfo]:
        if self._infos is None:
            self.validate()
        return self._infos

    @aws_errors
    def provision(self, image: Path | str | None) -> None:
        ami_id = str(image) if image else ami.find_ami(self.config, self.state)
        source = "aws.ami_id" if self.aws.ami_id else str(ami.record_path(self.state))
        checks.check_image(self.client, self.config, ami_id, self.infos, source)

        self.cluster.ensure_secrets()
        cluster = self.config.cluster_name
        group_id, created = resources.ensure_security_group(self.client, cluster, self.aws.vpc_id, self.aws.ssh_cidrs)
        say(f"    security group {resources.security_group_name(cluster)} ({group_id}){' created' if created else ''}")
        profile, _, profile_created = iam.ensure_node_role(
            self.api("iam"), self.api("sts"), cluster, self.aws.region, kms_key_arn=self.kms_key_arn
        )
        say(f"    instance profile {profile}{' created' if profile_created else ''}")
        endpoints = storage.ensure_file_systems(
            self.api("efs"), self.api("fsx"), cluster, self.config.storage or [], self.aws.subnet_id, group_id
        )
        for name, endpoint in sorted(endpoints.items()):
            say(f"    {endpoint['type']} {endpoint['file_system_id']} for storage {name}")
        for group in self.config.node_groups:
            join_secrets.ensure_secret(self.api("secretsmanager"), cluster, group.name, self.aws.kms_key_id)
        templates = self._ensure_templates(ami_id, group_id, profile)

        existing = discover.by_name(discover.cluster_instances(self.client, cluster))
        self._start_stopped(existing)
        planned = {n.name for n in self.nodes}
        extra = sorted(set(existing) - planned)
        if extra:
            say(f"    warning: instances not in the config: {', '.join(extra)} (`cluster down` removes them)")
        missing = [n for n in self.nodes if n.name not in existing]
        if missing:
            self._launch(missing, templates, group_id)
        else:
            say(f"    all {len(self.nodes)} nodes exist")
        self._forget_replaced_hosts()
        self._write_state(ami_id, group_id, templates, endpoints)

    def _ensure_templates(self, ami_id: str, group_id: str, profile: str) -> dict[str, tuple[str, str]]:
        """A launch template per node group and the head: name -> (id, version)."""
        cluster = self.config.cluster_name
        sections: list[tuple[str, str, str, NodeGroup | None]] = [
            ("head", "head", self.config.head.instance_type, None)
        ]
        sections += [("compute", g.name, g.instance_type, g) for g in self.config.node_groups]
        templates = {}
        for role, nodegroup, instance_type, group in sections:
            pg_name = None
            if group and group.wants_placement_group:
                pg_name = resources.placement_group_name(cluster, nodegroup)
                if placement.ensure(self.client, pg_name, cluster):
                    say(f"    placement group {pg_name} created")
            data = resources.template_data(
                ami_id=ami_id,
                info=self.infos[instance_type],
                subnet_id=self.aws.subnet_id,
                group_id=group_id,
                node_tags=tags.node_tags(cluster, role, nodegroup),
                efa=bool(group and group.efa),
                placement_group=pg_name,
                spot=bool(group and group.spot),
                capacity_reservation_id=group.capacity_reservation_id if group else None,
                key_name=self.aws.key_name,
                instance_profile=profile,
            )
            name = resources.template_name(cluster, nodegroup)
            template_id, version, what = resources.ensure_launch_template(self.client, name, data, cluster)
            if what != "unchanged":
                say(f"    launch template {name} {what} (version {version})")
            templates[nodegroup] = (template_id, version)
        return templates

    def _join_source(self, node: NodeSpec) -> dict[str, str] | None:
        """Where a compute node reads its bundle: its group's secret, with the endpoint this controller uses."""
        if node.role != "compute":
            return None  # the head is configured by Ansible
        return {
            "cloud": "aws",
            "region": self.aws.region,
            "secret_id": join_secrets.secret_name(self.config.cluster_name, node.nodegroup),
            "endpoint_url": self.api("secretsmanager").meta.endpoint_url,
        }

    def _launch(self, missing: list[NodeSpec], templates: dict[str, tuple[str, str]], group_id: str) -> None:
        """Launch the missing nodes; a node that had an address before gets it back."""
        known = {name: node.get("address") for name, node in self.cluster.read_state().get("nodes", {}).items()}
        public_key = self.cluster.ssh_key.with_suffix(".pub").read_text().strip()
        batches: dict[str, GroupLaunch] = {}
        for node in missing:
            batch = batches.setdefault(
                node.nodegroup, GroupLaunch(node.nodegroup, self._instance_type(node), self.zone)
            )
            template_id, version = templates[node.nodegroup]
            interfaces = None
            if known.get(node.name):
                group = self._group(node.nodegroup)
                interfaces = resources.network_interfaces(
                    self.infos[self._instance_type(node)], bool(group and group.efa), self.aws.subnet_id, group_id
                )
                interfaces[0]["PrivateIpAddress"] = known[node.name]
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
        self, ami_id: str, group_id: str, templates: dict[str, tuple[str, str]], endpoints: dict[str, dict]
    ) -> None:
        instances = discover.by_name(discover.cluster_instances(self.client, self.config.cluster_name), warn=False)
        # A node keeps its address after its instance is gone: its replacement gets it back,
        # so /etc/hosts and slurm.conf never change for a replaced node.
        nodes = {
            name: {"address": node.get("address")}
            for name, node in self.cluster.read_state().get("nodes", {}).items()
            if name in {n.name for n in self.nodes}
        }
        for name, instance in instances.items():
            nodes[name] = {"instance_id": instance["InstanceId"], "address": instance.get("PrivateIpAddress")}
        self.cluster.write_state(
            {
                "cluster": self.config.cluster_name,
                "provider": "aws",
                "image": ami_id,
                "region": self.aws.region,
                "availability_zone": self.zone,
                "security_group": group_id,
                "instance_profile": iam.node_role_name(self.config.cluster_name),
                "launch_templates": {name: {"id": i, "version": v} for name, (i, v) in templates.items()},
                "storage": endpoints,
                "nodes": dict(sorted(nodes.items())),
            }
        )

    @aws_errors
    def after_configure(self) -> None:
        """Publish each node group's join bundle; running nodes of a group whose bundle changed fetch it now."""
        cluster = self.config.cluster_name
        sm = self.api("secretsmanager")
        refresh = []
        for group in self.config.node_groups:
            path = self.cluster.join_bundles / f"{group.name}.json"
            if not path.exists():
                continue
            had_value = join_secrets.has_value(sm, cluster, group.name)
            if join_secrets.publish(sm, cluster, group.name, path.read_text()):
                say(f"    join bundle of {group.name} published ({join_secrets.secret_name(cluster, group.name)})")
                if had_value:
                    refresh.append(group.name)
        if not refresh:
            return
        running = discover.by_name(discover.cluster_instances(self.client, cluster, states=("running",)), warn=False)
        names = [n.name for n in self.nodes if n.nodegroup in refresh and n.name in running]
        endpoints = {n: self._endpoint_to(n, running[n]["PrivateIpAddress"]) for n in names}
        results = remote.run_many(endpoints, "clusterbake-node-boot fetch", timeout=300, check=False)
        for name, result in sorted(results.items()):
            if isinstance(result, Exception) or result.returncode != 0:
                say(
                    f"    warning: {name} did not fetch its new bundle now ({_short(result)}); it will at its next boot"
                )
            else:
                say(f"    {name} fetched its new join bundle")

    @aws_errors
    def wait_ready(self, timeout: float = SSH_READY_TIMEOUT) -> None:
        """The head answers SSH (its boot service installed the controller's key).

        Only the head: Ansible configures the head alone, compute nodes fetch their join
        bundle themselves, and `cluster up` then waits for them in Slurm.
        """
        head = discover.by_name(discover.cluster_instances(self.client, self.config.cluster_name)).get("head", {})
        if not head.get("PrivateIpAddress"):
            raise ClusterbakeError("the head has no instance (or no address yet); `clusterbake cluster up` launches it")
        try:
            remote.wait_ready({"head": self._endpoint_to("head", head["PrivateIpAddress"])}, timeout)
        except remote.HostKeyError:
            raise
        except remote.RemoteError as exc:
            raise ClusterbakeError(
                f"{exc}\ncheck aws.ssh_cidrs / aws.bastion and the instances' system logs (EC2 console output)"
            ) from exc

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

    def _replace(self, name: str) -> None:
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
        self.tell_slurm_down(name, "instance gone: replaced by clusterbake node start")
        self._launch([node], templates, state["security_group"])
        self._forget_replaced_hosts()
        self._write_state(
            state["image"],
            state["security_group"],
            templates | self._recorded_templates(state),
            state.get("storage", {}),
        )

    @staticmethod
    def _recorded_templates(state: dict) -> dict[str, tuple[str, str]]:
        return {name: (t["id"], t["version"]) for name, t in state.get("launch_templates", {}).items()}

    @aws_errors
    def stop_node(self, name: str) -> None:
        self.node(name)
        instance = self._instance(name)
        if instance is None or instance["State"]["Name"] in ("stopped",):
            return
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
        instances = discover.cluster_instances(self.client, cluster, states=discover.NOT_GONE)
        if instances:
            ids = [i["InstanceId"] for i in instances]
            say(f"    terminating {len(ids)} instance(s)")
            for start in range(0, len(ids), BATCH):
                call(self.client.terminate_instances, InstanceIds=ids[start : start + BATCH])
            wait_for_state(self.client, ids, "terminated")
            described = sorted(f"instance {discover.name_of(i) or '?'} ({i['InstanceId']})" for i in instances)
            removed += described if len(described) <= LIST_LIMIT else [f"{len(described)} instances"]
        groups = resources.find_security_groups(self.client, cluster)
        # File systems first: their mount targets hold on to the security group.
        removed += storage.delete_file_systems(
            self.api("efs"),
            self.api("fsx"),
            cluster,
            self.config.storage or [],
            security_group_id=groups[0]["GroupId"] if groups else None,
        )
        for template in resources.find_launch_templates(self.client, cluster):
            resources.delete_launch_template(self.client, template["LaunchTemplateId"])
            removed.append(f"launch template {template['LaunchTemplateName']}")
        for name in placement.find(self.client, cluster):
            placement.delete(self.client, name)
            removed.append(f"placement group {name}")
        for group in resources.find_security_groups(self.client, cluster):
            resources.delete_security_group(self.client, group["GroupId"])
            removed.append(f"security group {group['GroupName']} ({group['GroupId']})")
        nodegroups = ["head", *(g.name for g in self.config.node_groups)]
        removed += join_secrets.delete_all(self.api("secretsmanager"), cluster, nodegroups)
        removed += iam.delete_node_role(self.api("iam"), cluster)
        if self.cluster.root.exists():
            shutil.rmtree(self.cluster.root)
            removed.append(f"state {self.cluster.root}")
        return removed

    # --- queries ---------------------------------------------------------------------

    @aws_errors
    def status(self) -> list[NodeStatus]:
        existing = discover.by_name(discover.cluster_instances(self.client, self.config.cluster_name))
        result = []
        for node in self.nodes:
            instance = existing.get(node.name)
            if instance is None:
                result.append(NodeStatus(node.name, node.role, node.nodegroup, None, "absent"))
                continue
            state = instance["State"]["Name"]
            shown = "running" if state in ("pending", "running") else "stopped"
            detail = f"{instance['InstanceId']} {instance['InstanceType']} {state}"
            result.append(
                NodeStatus(node.name, node.role, node.nodegroup, instance.get("PrivateIpAddress"), shown, detail)
            )
        return result

    @aws_errors
    def inventory(self) -> dict:
        """Running instances tagged clusterbake:cluster (CLUSTERBAKE_CLUSTER or the config's name)."""
        cluster = os.environ.get("CLUSTERBAKE_CLUSTER") or self.config.cluster_name
        running = discover.cluster_instances(self.client, cluster, states=("running",))
        infos = self.catalogue.get({i["InstanceType"] for i in running})
        endpoints = storage.describe_endpoints(
            self.api("efs"), self.api("fsx"), cluster, self.config.storage or [], self.aws.region, self.aws.subnet_id
        )
        extra = {
            **self._connection_vars(),
            "clusterbake_storage_endpoints": endpoints,
            # Compute nodes fetch their bundle themselves (role cloud_boot): Ansible only keeps it.
            "node_join_self_join": True,
        }
        if any(entry.type == "nfs" for entry in self.config.effective_storage()):
            # The head's NFS exports admit the cluster's subnet (the security group admits only the cluster).
            subnet = call(self.client.describe_subnets, SubnetIds=[self.aws.subnet_id])["Subnets"][0]
            extra["clusterbake_subnet_cidr"] = subnet["CidrBlock"]
        return aws_inventory(self.config, running, infos, extra)

    def _connection_vars(self) -> dict:
        return {
            "ansible_user": self.aws.ssh_user,
            "ansible_become": True,
            "ansible_ssh_private_key_file": str(self.cluster.ssh_key),
            "ansible_ssh_common_args": " ".join(self._ssh_options()),
            "munge_key_file": str(self.cluster.munge_key),
            "node_join_controller_dir": str(self.cluster.join_bundles),
            "clusterbake_aws_region": self.aws.region,
            "fabric_socket_ifname": self.aws.network_interface,
        }

    def _ssh_options(self) -> list[str]:
        # Host keys are new on every instance: trust on first use, pinned per cluster.
        options = [
            "-o",
            f"UserKnownHostsFile={self.cluster.known_hosts}",
            "-o",
            "StrictHostKeyChecking=accept-new",
            "-o",
            "IdentitiesOnly=yes",
            "-o",
            "LogLevel=ERROR",
        ]
        if self.aws.bastion:
            options += ["-o", f"ProxyJump={self.aws.bastion}"]
        return options

    @aws_errors
    def endpoint(self, node: str) -> Endpoint:
        """The node's private IP as aws.ssh_user; commands run as root (sudo), as on local."""
        self.node(node)
        instance = self._instance(node)
        if instance is None or not instance.get("PrivateIpAddress"):
            raise ClusterbakeError(f"node {node} has no running instance; `clusterbake cluster up` launches it")
        return self._endpoint_to(node, instance["PrivateIpAddress"])

    def _endpoint_to(self, node: str, address: str) -> Endpoint:
        # Host keys are new on every instance: trust on first use, pinned per cluster (as _ssh_options).
        return Endpoint(
            name=node,
            host=address,
            user=self.aws.ssh_user,
            key_file=self.cluster.ssh_key,
            known_hosts=self.cluster.known_hosts,
            host_key_policy="accept-new",
            sudo=True,
            gateway=self.aws.bastion,
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


def node_spec(config: ClusterConfig, planned: NodeSpec, info: InstanceTypeInfo) -> NodeSpec:
    """A host's NodeSpec: names from the plan, the Slurm spec from its instance type."""
    group = next((g for g in config.node_groups if g.name == planned.nodegroup), None)
    if planned.role == "head" or group is None:
        return NodeSpec(planned.name, planned.role, planned.nodegroup, info.slurm_spec(features=[info.name]))
    efa = group.efa and info.efa_supported
    switches = list(dict.fromkeys([*group.features, *(["efa"] if efa else []), *(["gpu"] if info.gpus else [])]))
    slurm = info.slurm_spec(gres=list(group.gres) or None, features=[group.name, *switches, info.name])
    # NVSwitch types (gpu_systems.py) also go in group `nvswitch`: their join runs the fabric
    # manager. An inventory group only; the instance type already names them in Slurm.
    groups = list(dict.fromkeys([*switches, *(["nvswitch"] if info.nvswitch else [])]))
    return NodeSpec(planned.name, "compute", group.name, slurm, tuple(groups))


def aws_inventory(
    config: ClusterConfig, instances: list[dict], infos: dict[str, InstanceTypeInfo], extra: dict
) -> dict:
    """The shared inventory shape (inventory.build_inventory) from running instances.

    Hosts are the config's planned nodes that have a running instance named for them
    (tag clusterbake:name); `efa` holds the hosts with EFA interfaces (efa: true on an
    EFA type), `gpu` the hosts whose type has GPUs, `nvswitch` those of an NVSwitch type
    (clusterbake.gpu_systems), which run the fabric manager.
    """
    named = discover.by_name(instances)
    nodes, addresses, hostvars = [], {}, {}
    for planned in plan_nodes(config):
        instance = named.get(planned.name)
        if instance is None or not instance.get("PrivateIpAddress"):
            continue
        nodes.append(node_spec(config, planned, infos[instance["InstanceType"]]))
        addresses[planned.name] = instance["PrivateIpAddress"]
        hostvars[planned.name] = discover.host_vars(instance)
    return build_inventory(config, nodes, addresses, extra_vars=extra, extra_hostvars=hostvars)


def _short(result) -> str:
    if isinstance(result, Exception):
        return str(result).splitlines()[0] if str(result) else type(result).__name__
    text = (result.stderr or b"").decode(errors="replace").strip().splitlines()
    return text[-1] if text else f"exit {result.returncode}"
