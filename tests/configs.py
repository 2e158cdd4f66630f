"""Config dicts the tests start from (before ClusterConfig.model_validate)."""

from __future__ import annotations


def aws_cluster(aws: dict | None = None, **top) -> dict:
    """The smallest valid AWS config: one p5 node with EFA; `aws` adds to its aws section, `top`
    replaces top-level keys."""
    return {
        "cluster_name": "demo",
        "provider": "aws",
        "image": {"base": "ubuntu-22.04"},
        "aws": {"region": "us-east-1", "vpc_id": "vpc-0123456789abcdef0", "subnet_id": "subnet-0123456789abcdef0"}
        | (aws or {}),
        "head": {"instance_type": "m7i.2xlarge"},
        "node_groups": [{"name": "gpu", "count": 1, "instance_type": "p5.48xlarge", "efa": True}],
    } | top
