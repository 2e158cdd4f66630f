"""The azure provider: VMs in an existing virtual network and subnet, found again by their tags."""
