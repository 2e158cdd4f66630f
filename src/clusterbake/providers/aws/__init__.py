"""The aws provider: EC2 nodes in an existing VPC and subnet (see README.md)."""
