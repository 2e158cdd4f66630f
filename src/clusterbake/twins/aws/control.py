"""`clusterbake twin up|status|down aws`: the EC2 twin's host side (the lifecycle is
twins/control.py's): its VPC's range, the metadata address, the daemon's region and zone,
and the environment that points boto3 at moto."""

from __future__ import annotations

from pathlib import Path

from clusterbake.state import StateDir
from clusterbake.twins.aws.daemon import SERVICE_NETNS
from clusterbake.twins.aws.nodes import METADATA_ADDRESS, TWIN_NETWORK, Nodes
from clusterbake.twins.control import TwinControl

VPC_CIDR = "10.90.0.0/16"
SUBNET_CIDR = "10.90.0.0/24"
PORT = 4566
REGION = "us-east-1"
ZONE = "us-east-1a"
PROFILE = "clusterbake-twin"


class Ec2TwinControl(TwinControl):
    cloud = "aws"
    title = "EC2 twin"
    network_cidr = VPC_CIDR
    subnet_cidr = SUBNET_CIDR
    port = PORT
    # The training environment and the AWS boot path.
    image_features = ["train", "aws"]
    twin_network = TWIN_NETWORK
    service_netns = SERVICE_NETNS
    service_addresses = (METADATA_ADDRESS,)
    daemon_module = "clusterbake.twins.aws.daemon"
    # Nothing secret is printed: the administrator key is in a 0600 credentials file.
    secret_env = ()
    foreign_env = ("AWS_",)

    def daemon_arguments(self, directory: Path) -> list[str]:
        return ["--region", REGION, "--zone", ZONE, "--vpc-cidr", VPC_CIDR]

    def daemon_environment(self, directory: Path, env: dict[str, str]) -> dict[str, str]:
        # EC2's capacity and faults, as tests set them (PUT /capacity, PUT /faults on the control
        # socket): moto_ext's switches.
        return {
            **env,
            "MOTO_CAPACITY_FILE": str(directory / "capacity.json"),
            "MOTO_FAULTS_FILE": str(directory / "faults.json"),
            # EC2's vCPU quotas: the twin account's applied values unless this file sets others.
            "MOTO_QUOTAS_FILE": str(directory / "quotas.json"),
            # Where instances hang (DescribeInstanceTopology): the twin's default layout unless this file sets one.
            "MOTO_TOPOLOGY_FILE": str(directory / "topology.json"),
        }

    def environment(self, state: StateDir, info: dict) -> dict[str, str]:
        return {
            "AWS_ENDPOINT_URL": info["endpoint"],
            "AWS_SHARED_CREDENTIALS_FILE": str(self.twin_dir(state) / "credentials"),
            "AWS_PROFILE": PROFILE,
            "AWS_DEFAULT_REGION": info["region"],
        }

    def summary(self, info: dict) -> str:
        return (
            f"VPC {info['vpc_id']}, subnet {info['subnet_id']} ({info['subnet_cidr']}, "
            f"{info['availability_zone']}), AMI {', '.join(info['amis'].values())}"
        )

    def remove_nodes(self, directory: Path) -> list[str]:
        return Nodes(directory, VPC_CIDR, lambda m: None).remove_all()


CONTROL = Ec2TwinControl()
IMAGE_FEATURES = CONTROL.image_features
SECRET_ENV = CONTROL.secret_env
twin_dir, read_info, node_image = CONTROL.twin_dir, CONTROL.read_info, CONTROL.node_image
up, request, status, down = CONTROL.up, CONTROL.request, CONTROL.status, CONTROL.down
