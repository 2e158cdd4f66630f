"""A NAT gateway route for the twin's subnet (and the aws tests'): how a private subnet of a real
account reaches Secrets Manager, which `cluster up` now checks before anything is made (realcloud
review C4). The twin's nodes reach its endpoint over its bridge whatever the routes say."""

from __future__ import annotations


def add_nat_route(ec2, vpc_id: str, subnet_id: str) -> str:
    """A NAT gateway in the subnet and a 0.0.0.0/0 route to it in the VPC's main route table; its id."""
    allocation = ec2.allocate_address(Domain="vpc")["AllocationId"]
    nat = ec2.create_nat_gateway(SubnetId=subnet_id, AllocationId=allocation)["NatGateway"]["NatGatewayId"]
    tables = ec2.describe_route_tables(
        Filters=[{"Name": "vpc-id", "Values": [vpc_id]}, {"Name": "association.main", "Values": ["true"]}]
    )["RouteTables"]
    ec2.create_route(RouteTableId=tables[0]["RouteTableId"], DestinationCidrBlock="0.0.0.0/0", NatGatewayId=nat)
    return nat
