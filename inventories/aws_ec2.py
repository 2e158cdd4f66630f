#!/usr/bin/env python3
"""Ansible dynamic inventory of an AWS clusterbake cluster (running instances only).

    CLUSTERBAKE_CONFIG=examples/aws-p5.yaml ansible-inventory -i inventories/aws_ec2.py --graph
    CLUSTERBAKE_CONFIG=path/to/cluster.yaml inventories/aws_ec2.py --list

Instances are found by the tag clusterbake:cluster (CLUSTERBAKE_CLUSTER, else the
config's cluster_name) and named by their clusterbake:name tag. AWS credentials,
profile and endpoint come from the standard environment (AWS_PROFILE, ...).
Shape: docs/architecture.md (the same as inventories/local.py).
"""

import sys

from _bootstrap import run

if __name__ == "__main__":
    sys.exit(run("aws"))
