"""Local nodes' optional way out (local.outbound): NAT on the host for the cluster's subnet.

Off (the default), nodes have no default route: they reach each other and the host's bridge
address only. On, each node routes through the host's bridge address, and the host masquerades
the cluster's subnet onto its own uplink: an nftables table of the cluster's own
(`clusterbake_out_<cluster>`, nat postrouting and a forward accept for the bridge) and IPv4
forwarding, which the host had off before the first such cluster and has off again after the
last one goes (the prior value is kept in /run, host-wide like the setting, gone with a reboot
that resets it). A host whose firewall
drops forwarded traffic elsewhere (Docker's iptables FORWARD policy) needs its own accept rule.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

from clusterbake.errors import ClusterbakeError

FORWARDING = Path("/proc/sys/net/ipv4/ip_forward")
FORWARDING_BEFORE = Path("/run/clusterbake/ip_forward.before")
TABLE_PREFIX = "clusterbake_out_"


def table_name(cluster: str) -> str:
    return TABLE_PREFIX + cluster.replace("-", "_")


def _nft(*args: str, stdin: str | None = None, check: bool = True) -> subprocess.CompletedProcess:
    result = subprocess.run(["nft", *args], input=stdin, capture_output=True, text=True)
    if check and result.returncode != 0:
        raise ClusterbakeError(f"nft {' '.join(args)} failed: {result.stderr.strip()}")
    return result


def tables() -> list[str]:
    """The outbound tables of every cluster on this host."""
    listed = _nft("list", "tables", "ip", check=False).stdout.split()
    return [word for word in listed if word.startswith(TABLE_PREFIX)]


def ensure(cluster: str, subnet: str, bridge: str, record: Path = FORWARDING_BEFORE) -> bool:
    """The cluster's NAT table and forwarding on; True when anything changed."""
    changed = False
    if FORWARDING.read_text().strip() != "1":
        if not record.exists():
            record.parent.mkdir(mode=0o755, exist_ok=True)
            record.write_text(FORWARDING.read_text())
        FORWARDING.write_text("1\n")
        changed = True
    table = table_name(cluster)
    if table not in tables():
        # One transaction: the table appears whole or not at all.
        _nft(
            "-f",
            "-",
            stdin=(
                f"table ip {table} {{\n"
                f"  chain postrouting {{ type nat hook postrouting priority srcnat; policy accept;\n"
                f'    ip saddr {subnet} oifname != "{bridge}" masquerade\n  }}\n'
                f"  chain forward {{ type filter hook forward priority filter; policy accept;\n"
                f'    iifname "{bridge}" ip saddr {subnet} accept\n'
                f'    oifname "{bridge}" ct state established,related accept\n  }}\n'
                "}\n"
            ),
        )
        changed = True
    return changed


def remove(cluster: str, record: Path = FORWARDING_BEFORE) -> bool:
    """The cluster's table gone; forwarding back to what the host had once no cluster's table is left."""
    removed = False
    if table_name(cluster) in tables():
        _nft("delete", "table", "ip", table_name(cluster))
        removed = True
    if record.exists() and not tables():
        FORWARDING.write_text(record.read_text())
        record.unlink()
    return removed
