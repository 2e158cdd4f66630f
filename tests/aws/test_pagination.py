"""The inventory follows DescribeInstances' pages: 1,050 nodes, more than one page of 1,000.

moto 5.2.5 pages DescribeInstances by reservation (MaxResults counts reservations), so each
instance is launched in its own RunInstances call (as clusterbake does: one call per
node, each with its own name tag). moto answers MaxResults=1000 with the first
1,000 reservations and a NextToken, so an inventory that did not follow NextToken
would list 1,000 hosts, not 1,050. The test takes about 15 s, most of it moto
creating and serializing 1,050 instances. It has a moto server of its own, so that the
other tests' Describe calls do not wade through its instances.
"""

from __future__ import annotations

import yaml
from awstest import REGION, inventory

from clusterbake.providers.aws import tags
from clusterbake.providers.aws.discover import PAGE_SIZE

COUNT = 1049  # + the head: 1,050 instances


def test_inventory_of_more_than_one_page(own_moto, tmp_path):
    moto, ami_id = own_moto
    assert COUNT + 1 > PAGE_SIZE
    ec2 = moto.ec2()
    vpc = ec2.create_vpc(CidrBlock="10.40.0.0/16")["Vpc"]["VpcId"]
    subnet = ec2.create_subnet(VpcId=vpc, CidrBlock="10.40.0.0/20")["Subnet"]["SubnetId"]
    config = {
        "cluster_name": "big",
        "provider": "aws",
        "image": {"base": "ubuntu-22.04"},
        # The inventory reads the subnet's range (the head's NFS exports admit it).
        "aws": {"region": REGION, "vpc_id": vpc, "subnet_id": subnet},
        "head": {"instance_type": "m7i.large"},
        "node_groups": [{"name": "cpu", "count": COUNT, "instance_type": "c7i.large"}],
    }
    path = tmp_path / "big.yaml"
    path.write_text(yaml.safe_dump(config))
    nodes = [("head", "head", "head")] + [(f"cpu-{n}", "compute", "cpu") for n in range(1, COUNT + 1)]
    for name, role, group in nodes:
        ec2.run_instances(
            ImageId=ami_id,
            InstanceType="m7i.large" if role == "head" else "c7i.large",
            MinCount=1,
            MaxCount=1,
            TagSpecifications=[tags.spec("instance", tags.node_tags("big", role, group, name))],
        )
    inv = inventory(moto, tmp_path, path)
    assert inv["all"]["vars"]["clusterbake_subnet_cidr"] == "10.40.0.0/20"
    hostvars = inv["_meta"]["hostvars"]
    assert len(hostvars) == COUNT + 1
    assert len(inv["slurm_compute"]["hosts"]) == COUNT and inv["slurm_head"]["hosts"] == ["head"]
    assert hostvars[f"cpu-{COUNT}"]["clusterbake_slurm_node"]["cpus"] == 2
    assert len({h["ansible_host"] for h in hostvars.values()}) == COUNT + 1
