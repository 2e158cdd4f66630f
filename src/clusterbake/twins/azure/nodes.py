"""VMs of the Azure twin as real local nodes (the machinery: src/clusterbake/twins/nodes.py).

What Azure's hardware and network give a VM, nothing of the product: a root disk (an
overlay on the image, kept while the VM is stopped or deallocated, removed with the VM),
one interface `eth0` (the name Azure's Linux images give the primary NIC) with the NIC's
private IP and MAC on the twin's bridge, on-link routes to the virtual network, to IMDS
(169.254.169.254) and to Azure's DNS (168.63.129.16), the VM's `vmId` as its machine UUID
and its `computerName` as the hostname it boots with (what Azure's provisioning agent sets).

What DHCP and the platform's certificates give a VM, the twin writes into the node's
disk before each boot: `/etc/resolv.conf` naming 168.63.129.16 with the virtual
network's DNS suffix (Azure's DHCP), and the twin's CA among the node's trusted CAs, so
the Key Vault and blob names the twin's DNS answers verify as they do against Microsoft's
public certificates (see docs/twin.md: what the twin cannot show). Besides the twins'
mount helper, the nodes get blobfuse2's stand-in (twins/blobfuse2_helper.py) at
/usr/bin/blobfuse2 and /usr/bin/fusermount3, and ibstat's (twins/ibstat_helper.py) at
/usr/sbin/ibstat, which shows the InfiniBand ports of the VM's size (infiniband.py).
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

from clusterbake.twins.azure import infiniband
from clusterbake.twins.nodes import NodeSpec, TwinNodes

TWIN_NETWORK = "twin-azure"  # the bridge cb-twin-azure, namespaces cb-twin-azure-<vmId>
MACHINE_PREFIX = f"cb-{TWIN_NETWORK}-"
IFNAME = "eth0"
METADATA_ADDRESS = "169.254.169.254"
DNS_ADDRESS = "168.63.129.16"
DNS_SUFFIX = "clusterbake-twin.internal.cloudapp.net"
LABEL = "The Azure twin"
CA_NAME = "clusterbake-azure-twin"
BLOBFUSE2_HELPER = Path(__file__).resolve().parents[1] / "blobfuse2_helper.py"
IBSTAT_HELPER = Path(__file__).resolve().parents[1] / "ibstat_helper.py"


def ca_hash(ca_file: Path) -> str | None:
    """OpenSSL's subject hash of the CA (the name of its link in /etc/ssl/certs), if openssl is here."""
    if shutil.which("openssl") is None:
        return None
    result = subprocess.run(["openssl", "x509", "-hash", "-noout", "-in", str(ca_file)], capture_output=True, text=True)
    return result.stdout.strip() or None


class AzureNodes(TwinNodes):
    # blobfuse2 and its fusermount3 (FUSE cannot run here): twins/blobfuse2_helper.py, see docs/twin.md.
    # ibstat: InfiniBand ports of the VM's size (no HCA here).
    extra_helpers = {
        "/usr/bin/blobfuse2": BLOBFUSE2_HELPER,
        "/usr/bin/fusermount3": BLOBFUSE2_HELPER,
        "/usr/sbin/ibstat": IBSTAT_HELPER,
    }

    def __init__(self, root: Path, vnet_cidr: str, ca_file: Path | None, log):
        routes = (vnet_cidr, f"{METADATA_ADDRESS}/32", f"{DNS_ADDRESS}/32")
        super().__init__(root, TWIN_NETWORK, IFNAME, routes, log, label=LABEL, prepare=self._prepare)
        self.ca_file = ca_file
        self._ca_hash = ca_hash(ca_file) if ca_file else None

    def _prepare(self, spec: NodeSpec, root: Path) -> None:
        """Azure's DHCP (DNS server and suffix), the provisioning agent's hostname (computerName, at
        every boot, as cloud-init does on Azure; the image's boot service has the last word), the
        platform's trusted CAs and the VM's InfiniBand ports, on the node's disk."""
        (root / "etc" / "hostname").write_text(spec.hostname + "\n")
        infiniband.write(root, spec.hardware.get("infiniband", []))
        resolv = root / "etc" / "resolv.conf"
        if resolv.is_symlink() or resolv.is_dir():
            resolv.unlink()
        resolv.write_text(f"# Azure DHCP (the Azure twin)\nnameserver {DNS_ADDRESS}\nsearch {DNS_SUFFIX}\n")
        if self.ca_file is None:
            return
        pem = self.ca_file.read_text()
        local = root / "usr" / "local" / "share" / "ca-certificates" / f"{CA_NAME}.crt"
        local.parent.mkdir(parents=True, exist_ok=True)
        if not local.exists() or local.read_text() != pem:
            local.write_text(pem)
        certs = root / "etc" / "ssl" / "certs"
        certs.mkdir(parents=True, exist_ok=True)
        (certs / f"{CA_NAME}.pem").unlink(missing_ok=True)
        (certs / f"{CA_NAME}.pem").symlink_to(f"/usr/local/share/ca-certificates/{CA_NAME}.crt")
        if self._ca_hash:
            link = certs / f"{self._ca_hash}.0"
            if link.is_symlink() or link.exists():
                link.unlink()
            link.symlink_to(f"{CA_NAME}.pem")
        bundle = certs / "ca-certificates.crt"
        current = bundle.read_text() if bundle.exists() else ""
        if pem.strip() not in current:
            bundle.write_text(current + ("" if current.endswith("\n") or not current else "\n") + pem)
