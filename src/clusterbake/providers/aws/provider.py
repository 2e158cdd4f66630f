"""The aws provider: EC2 instances in an existing VPC and subnet, found again by their tags."""

from __future__ import annotations

import os
import shlex
import shutil
import subprocess
import time
from functools import cached_property
from pathlib import Path

from clusterbake.config import ClusterConfig, NodeGroup
from clusterbake.errors import ClusterbakeError, ConfigError
from clusterbake.inventory import build_inventory
from clusterbake.progress import say
from clusterbake.providers.aws import ami, checks, discover, placement, resources, tags
from clusterbake.providers.aws.ami import find_ami
from clusterbake.providers.aws.api import aws_errors, call, ec2_client
from clusterbake.providers.aws.catalogue import Catalogue, InstanceTypeInfo
from clusterbake.providers.aws.launch import BATCH, GroupLaunch, NodeLaunch, launch_groups, wait_for_state
from clusterbake.providers.aws.userdata import cloud_config
from clusterbake.providers.base import NodeStatus, Provider
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

    @property
    def client(self):
        if self._client is None:
            self._client = ec2_client(self.aws.region)
        return self._client

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
        templates = self._ensure_templates(ami_id, group_id)

        existing = discover.by_name(discover.cluster_instances(self.client, cluster))
        self._start_stopped(existing)
        planned = {n.name for n in self.nodes}
        extra = sorted(set(existing) - planned)
        if extra:
            say(f"    warning: instances not in the config: {', '.join(extra)} (`cluster down` removes them)")
        batches = self._launch_plan([n for n in self.nodes if n.name not in existing], templates)
        if batches:
            launch_groups(self.client, batches)
        else:
            say(f"    all {len(self.nodes)} nodes exist")
        self._write_state(ami_id, group_id, templates)

    def _ensure_templates(self, ami_id: str, group_id: str) -> dict[str, tuple[str, str]]:
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
            )
            name = resources.template_name(cluster, nodegroup)
            template_id, version, what = resources.ensure_launch_template(self.client, name, data, cluster)
            if what != "unchanged":
                say(f"    launch template {name} {what} (version {version})")
            templates[nodegroup] = (template_id, version)
        return templates

    def _launch_plan(self, missing: list[NodeSpec], templates: dict[str, tuple[str, str]]) -> list[GroupLaunch]:
        public_key = self.cluster.ssh_key.with_suffix(".pub").read_text().strip()
        batches: dict[str, GroupLaunch] = {}
        for node in missing:
            batch = batches.setdefault(
                node.nodegroup, GroupLaunch(node.nodegroup, self._instance_type(node), self.zone)
            )
            template_id, version = templates[node.nodegroup]
            batch.nodes.append(
                NodeLaunch(
                    name=node.name,
                    template_id=template_id,
                    template_version=version,
                    user_data=cloud_config(node.name, [public_key]),
                    tags=tags.node_tags(self.config.cluster_name, node.role, node.nodegroup, node.name),
                )
            )
        return list(batches.values())

    def _start_stopped(self, existing: dict[str, dict]) -> None:
        stopped = [i["InstanceId"] for i in existing.values() if i["State"]["Name"] in ("stopped", "stopping")]
        if not stopped:
            return
        say(f"    starting {len(stopped)} stopped instance(s)")
        wait_for_state(self.client, stopped, "stopped")
        for start in range(0, len(stopped), BATCH):
            call(self.client.start_instances, InstanceIds=stopped[start : start + BATCH])
        wait_for_state(self.client, stopped, "running")

    def _write_state(self, ami_id: str, group_id: str, templates: dict[str, tuple[str, str]]) -> None:
        instances = discover.by_name(discover.cluster_instances(self.client, self.config.cluster_name), warn=False)
        self.cluster.write_state(
            {
                "cluster": self.config.cluster_name,
                "provider": "aws",
                "image": ami_id,
                "region": self.aws.region,
                "availability_zone": self.zone,
                "security_group": group_id,
                "launch_templates": {name: {"id": i, "version": v} for name, (i, v) in templates.items()},
                "nodes": {
                    name: {"instance_id": inst["InstanceId"], "address": inst.get("PrivateIpAddress")}
                    for name, inst in sorted(instances.items())
                },
            }
        )

    @aws_errors
    def wait_ready(self, timeout: float = SSH_READY_TIMEOUT) -> None:
        """Every node answers SSH (cloud-init has installed the controller's key)."""
        existing = discover.by_name(discover.cluster_instances(self.client, self.config.cluster_name))
        pending = [n.name for n in self.nodes]
        deadline = time.monotonic() + timeout
        while pending and time.monotonic() < deadline:
            for name in list(pending):
                argv = self._ssh_to(existing[name].get("PrivateIpAddress", ""), ["true"])
                argv[1:1] = ["-o", "ConnectTimeout=5", "-o", "BatchMode=yes"]
                if subprocess.run(argv, capture_output=True, timeout=60).returncode == 0:
                    pending.remove(name)
            if pending:
                time.sleep(5)
        if pending:
            raise ClusterbakeError(
                f"nodes {', '.join(pending)} did not answer SSH within {timeout:.0f}s; "
                "check aws.ssh_cidrs / aws.bastion and the instances' system logs (EC2 console output)"
            )

    @aws_errors
    def start_node(self, name: str) -> None:
        self.node(name)
        instance = self._instance(name)
        if instance is None:
            raise ClusterbakeError(f"node {name} has no instance; `clusterbake cluster up` launches it")
        if instance["State"]["Name"] in ("pending", "running"):
            return
        self._start_stopped({name: instance})

    @aws_errors
    def stop_node(self, name: str) -> None:
        self.node(name)
        instance = self._instance(name)
        if instance is None or instance["State"]["Name"] in ("stopped",):
            return
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
        for template in resources.find_launch_templates(self.client, cluster):
            resources.delete_launch_template(self.client, template["LaunchTemplateId"])
            removed.append(f"launch template {template['LaunchTemplateName']}")
        for name in placement.find(self.client, cluster):
            placement.delete(self.client, name)
            removed.append(f"placement group {name}")
        for group in resources.find_security_groups(self.client, cluster):
            resources.delete_security_group(self.client, group["GroupId"])
            removed.append(f"security group {group['GroupName']} ({group['GroupId']})")
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
        return aws_inventory(self.config, running, infos, self._connection_vars())

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
    def ssh_argv(self, node: str, command: list[str], tty: bool = False) -> list[str]:
        """ssh to the node's private IP as aws.ssh_user; the command runs as root (sudo), as on local."""
        self.node(node)
        instance = self._instance(node)
        if instance is None or not instance.get("PrivateIpAddress"):
            raise ClusterbakeError(f"node {node} has no running instance; `clusterbake cluster up` launches it")
        return self._ssh_to(instance["PrivateIpAddress"], command, tty)

    def _ssh_to(self, address: str, command: list[str], tty: bool = False) -> list[str]:
        # ssh joins the words with spaces for the remote shell; sh -c gets that same string.
        remote = ["sudo", "-n", "sh", "-c", shlex.quote(" ".join(command))] if command else ["sudo", "-i"]
        return [
            "ssh",
            *(["-t"] if tty else ["-T"]),
            "-i",
            str(self.cluster.ssh_key),
            *self._ssh_options(),
            f"{self.aws.ssh_user}@{address}",
            "--",
            *remote,
        ]


def node_spec(config: ClusterConfig, planned: NodeSpec, info: InstanceTypeInfo) -> NodeSpec:
    """A host's NodeSpec: names from the plan, the Slurm spec from its instance type."""
    group = next((g for g in config.node_groups if g.name == planned.nodegroup), None)
    if planned.role == "head" or group is None:
        return NodeSpec(planned.name, planned.role, planned.nodegroup, info.slurm_spec(features=[info.name]))
    efa = group.efa and info.efa_supported
    switches = list(dict.fromkeys([*group.features, *(["efa"] if efa else []), *(["gpu"] if info.gpus else [])]))
    slurm = info.slurm_spec(gres=list(group.gres) or None, features=[group.name, *switches, info.name])
    return NodeSpec(planned.name, "compute", group.name, slurm, tuple(switches))


def aws_inventory(
    config: ClusterConfig, instances: list[dict], infos: dict[str, InstanceTypeInfo], extra: dict
) -> dict:
    """The shared inventory shape (inventory.build_inventory) from running instances.

    Hosts are the config's planned nodes that have a running instance named for them
    (tag clusterbake:name); `efa` holds the hosts with EFA interfaces (efa: true on an
    EFA type), `gpu` the hosts whose type has GPUs.
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
