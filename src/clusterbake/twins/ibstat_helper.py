#!/usr/bin/python3
"""The Azure twin's stand-in for `ibstat` (infiniband-diags) inside its nodes.

A twin node has no HCA: this machine has no InfiniBand. The Azure twin binds each node's
`/usr/sbin/ibstat` to this program and writes, before every boot and whenever it changes, the
ports Azure's hardware gives the VM's size (/var/lib/clusterbake-twin/infiniband.json: the
twin's catalogue, twins/azure/infiniband.py) with their state (Active/LinkUp; a test may take a
link down through the twin's control socket). It prints them as ibstat does (CA blocks, one
Port block each), so role node_health's InfiniBand check reads them on a twin node as it reads
DOCA-OFED's ibstat on an ND VM. A VM of a size without RdmaEnabled has no port: like ibstat
without an HCA it says so and exits 1. What it cannot show: the fabric itself (no RDMA, no
partition keys, no subnet manager), see docs/twin.md.
"""

from __future__ import annotations

import json
import sys

PORTS = "/var/lib/clusterbake-twin/infiniband.json"


def render(ports: list[dict]) -> str:
    """ibstat's text for the ports: one CA block per HCA, its Port blocks."""
    lines: list[str] = []
    by_ca: dict[str, list[dict]] = {}
    for port in ports:
        by_ca.setdefault(port["ca"], []).append(port)
    for number, (ca, ca_ports) in enumerate(by_ca.items()):
        guid = f"0x{0x0C42A10300000000 + number * 2:016x}"
        lines += [
            f"CA '{ca}'",
            "\tCA type: MT4129",
            f"\tNumber of ports: {len(ca_ports)}",
            "\tFirmware version: 28.39.2048",
            "\tHardware version: 0",
            f"\tNode GUID: {guid}",
            f"\tSystem image GUID: {guid}",
        ]
        for port in ca_ports:
            lines += [
                f"\tPort {port['port']}:",
                f"\t\tState: {port['state']}",
                f"\t\tPhysical state: {port['physical_state']}",
                f"\t\tRate: {port['rate']}",
                f"\t\tBase lid: {port.get('lid', 0)}",
                "\t\tLMC: 0",
                "\t\tSM lid: 1",
                "\t\tCapability mask: 0xa751e848",
                f"\t\tPort GUID: {guid}",
                "\t\tLink layer: InfiniBand",
            ]
    return "\n".join(lines) + "\n"


def main(argv: list[str]) -> int:
    try:
        with open(PORTS) as source:
            ports = json.load(source)
    except FileNotFoundError:
        ports = []
    except (OSError, ValueError) as exc:
        print(f"ibstat (the Azure twin's stand-in): {PORTS}: {exc}", file=sys.stderr)
        return 2
    wanted = argv[1] if len(argv) > 1 and not argv[1].startswith("-") else None
    if wanted:
        ports = [p for p in ports if p["ca"] == wanted]
    if not ports:
        what = f"no HCA {wanted}" if wanted else "no InfiniBand device: the VM's size has no RdmaEnabled"
        print(f"ibstat (the Azure twin's stand-in): {what}", file=sys.stderr)
        return 1
    sys.stdout.write(render(ports))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
