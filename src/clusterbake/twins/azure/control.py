"""`clusterbake twin up|status|down azure`: the Azure twin's host side (the lifecycle is
twins/control.py's): its virtual network's range, IMDS and DNS (168.63.129.16), the daemon's
location and Key Vault proxy, and the environment that points the Azure SDK at the ARM fake
(its `endpoints.json` env: ARM's URL, the managed identity endpoint and its secret header,
the twin's CA, the Key Vault proxy). Its node image has feature groups `train` and `azure`:
the training environment and the cloud boot service reading Azure's IMDS and Key Vault."""

from __future__ import annotations

from pathlib import Path

from clusterbake.state import StateDir
from clusterbake.twins.azure.daemon import SERVICE_NETNS
from clusterbake.twins.azure.nodes import DNS_ADDRESS, METADATA_ADDRESS, TWIN_NETWORK, AzureNodes
from clusterbake.twins.control import TwinControl

VNET_CIDR = "10.91.0.0/16"  # distinct from the EC2 twin's 10.90.0.0/16 and the local provider's
SUBNET_CIDR = "10.91.0.0/24"
PORT = 8443  # ARM
PROXY_PORT = 8444  # the Key Vault CONNECT proxy (HTTPS_PROXY) for the host's clients
LOCATION = "eastus"


class AzureTwinControl(TwinControl):
    cloud = "azure"
    title = "Azure twin"
    network_cidr = VNET_CIDR
    subnet_cidr = SUBNET_CIDR
    port = PORT
    image_features = ["train", "azure"]
    twin_network = TWIN_NETWORK
    service_netns = SERVICE_NETNS
    service_addresses = (METADATA_ADDRESS, DNS_ADDRESS)
    daemon_module = "clusterbake.twins.azure.daemon"
    # The managed identity endpoint's secret.
    secret_env = ("IDENTITY_HEADER",)
    # Another cloud's or another ARM's settings.
    foreign_env = ("AZURE_", "IDENTITY_", "MSI_", "REQUESTS_CA_BUNDLE", "HTTPS_PROXY", "https_proxy")

    def daemon_arguments(self, directory: Path) -> list[str]:
        return ["--proxy-port", str(PROXY_PORT), "--location", LOCATION, "--vnet-cidr", VNET_CIDR]

    def environment(self, state: StateDir, info: dict) -> dict[str, str]:
        return dict(info["env"])

    def summary(self, info: dict) -> str:
        return (
            f"subscription {info['subscription_id']}, subnet {info['subnet_id']} ({info['subnet_cidr']}, "
            f"{info['location']}), image {', '.join(info['images'].values())}"
        )

    def remove_nodes(self, directory: Path) -> list[str]:
        return AzureNodes(directory, VNET_CIDR, None, lambda m: None).remove_all()


CONTROL = AzureTwinControl()
IMAGE_FEATURES = CONTROL.image_features
SECRET_ENV = CONTROL.secret_env
twin_dir, read_info, node_image = CONTROL.twin_dir, CONTROL.read_info, CONTROL.node_image
up, request, status, down = CONTROL.up, CONTROL.request, CONTROL.status, CONTROL.down
