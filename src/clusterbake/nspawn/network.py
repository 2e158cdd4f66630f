"""Host networking for local nodes: one bridge per cluster, one netns + veth per node.

Only addresses inside the project's own bridge subnet are ever configured.
Every function is idempotent, so a half-finished `cluster up` can be re-run and
`destroy` can be re-run.
"""

from __future__ import annotations

import hashlib
import ipaddress
import json
import subprocess
from pathlib import Path

from clusterbake.errors import ClusterbakeError, ConfigError

NETNS_DIR = Path("/run/netns")
SYS_NET = Path("/sys/class/net")  # the host namespace's links (this process runs in it)


def _ip(*args: str, netns: str | None = None, check: bool = True) -> subprocess.CompletedProcess:
    argv = ["ip", *(["-n", netns] if netns else []), *args]
    result = subprocess.run(argv, capture_output=True, text=True)
    if check and result.returncode != 0:
        raise ClusterbakeError(f"{' '.join(argv)} failed: {result.stderr.strip()}")
    return result


def _short(prefix: str, key: str) -> str:
    """Linux device names are limited to 15 characters."""
    return prefix + hashlib.sha1(key.encode()).hexdigest()[: 15 - len(prefix)]


def bridge_name(cluster: str) -> str:
    name = f"cb-{cluster}"
    return name if len(name) <= 15 else _short("cb-", cluster)


def netns_name(cluster: str, node: str) -> str:
    return f"cb-{cluster}-{node}"


def veth_name(cluster: str, node: str) -> str:
    return _short("cbv", f"{cluster}/{node}")


def host_address(subnet: str) -> ipaddress.IPv4Interface:
    network = ipaddress.ip_network(subnet)
    return ipaddress.ip_interface(f"{next(network.hosts())}/{network.prefixlen}")


def link_exists(name: str) -> bool:
    return (SYS_NET / name).exists()


def check_subnet_free(subnet: str, bridge: str) -> None:
    """Refuse a subnet that overlaps a route the host already uses for something else."""
    network = ipaddress.ip_network(subnet)
    routes = json.loads(_ip("-j", "-4", "route", "show").stdout or "[]")
    for route in routes:
        destination = route.get("dst", "")
        if destination in ("default", "") or route.get("dev") == bridge:
            continue
        if "/" not in destination:
            destination += "/32"
        if network.overlaps(ipaddress.ip_network(destination, strict=False)):
            raise ConfigError(
                f"local.subnet: {subnet} overlaps the host route {destination} on {route.get('dev')}; "
                "choose another private subnet"
            )


def ensure_bridge(cluster: str, subnet: str) -> str:
    bridge = bridge_name(cluster)
    if not link_exists(bridge):
        check_subnet_free(subnet, bridge)
        _ip("link", "add", bridge, "type", "bridge")
    address = str(host_address(subnet))
    current = _ip("-j", "addr", "show", "dev", bridge).stdout
    if address.split("/")[0] not in current:
        _ip("addr", "add", address, "dev", bridge)
    _ip("link", "set", bridge, "up")
    return bridge


def ensure_node_network(
    cluster: str,
    node: str,
    address: str,
    subnet: str,
    *,
    ifname: str = "host0",
    routes: tuple[str, ...] = (),
    default_via: str | None = None,
) -> str:
    """Create the node's netns and veth pair; configure `ifname` inside with a fixed address.

    `routes` are destinations reached directly on that interface (on-link), such as a
    whole VPC's range or a metadata address held by a namespace on the same bridge.
    `default_via`: the host's bridge address when the cluster may reach beyond this machine
    (local.outbound: the host masquerades it, nspawn/outbound.py); None, no default route.
    """
    netns = netns_name(cluster, node)
    veth = veth_name(cluster, node)
    if not (NETNS_DIR / netns).exists():
        _ip("netns", "add", netns)
    if not link_exists(veth):
        _ip("link", "add", veth, "type", "veth", "peer", "name", ifname, "netns", netns)
    _ip("link", "set", veth, "master", bridge_name(cluster), "up")
    prefix = ipaddress.ip_network(subnet).prefixlen
    inside = _ip("-j", "addr", "show", "dev", ifname, netns=netns).stdout
    if f'"{address}"' not in inside:
        _ip("addr", "add", f"{address}/{prefix}", "dev", ifname, netns=netns)
    _ip("link", "set", "lo", "up", netns=netns)
    # No default route unless asked: nodes talk to each other and to the host's bridge
    # address only, never to anything beyond this machine.
    _ip("link", "set", ifname, "up", netns=netns)
    for destination in routes:
        _ip("route", "replace", destination, "dev", ifname, "scope", "link", netns=netns)
    set_default_route(netns, ifname, default_via)
    return netns


def set_default_route(netns: str, ifname: str, via: str | None) -> None:
    """The node's default route through `via`, or none (removed if it had one)."""
    current = json.loads(_ip("-j", "route", "show", "default", netns=netns).stdout or "[]")
    if via is None:
        if current:
            _ip("route", "del", "default", netns=netns)
    elif [(r.get("gateway"), r.get("dev")) for r in current] != [(via, ifname)]:
        _ip("route", "replace", "default", "via", via, "dev", ifname, netns=netns)


def set_mac(netns: str, ifname: str, mac: str) -> None:
    current = json.loads(_ip("-j", "link", "show", "dev", ifname, netns=netns).stdout or "[{}]")[0]
    if current.get("address") != mac:
        _ip("link", "set", ifname, "address", mac, netns=netns)


def remove_node_network(cluster: str, node: str) -> None:
    veth = veth_name(cluster, node)
    if link_exists(veth):
        _ip("link", "del", veth, check=False)
    if (NETNS_DIR / netns_name(cluster, node)).exists():
        _ip("netns", "del", netns_name(cluster, node))


def remove_node_networks(cluster: str, nodes: list[str]) -> None:
    """remove_node_network for many nodes in one `ip -batch` (one process instead of three per node)."""
    commands = [f"link del {veth_name(cluster, n)}" for n in nodes if (SYS_NET / veth_name(cluster, n)).exists()]
    commands += [f"netns del {netns_name(cluster, n)}" for n in nodes if (NETNS_DIR / netns_name(cluster, n)).exists()]
    if commands:
        script = "\n".join(commands) + "\n"
        subprocess.run(["ip", "-force", "-batch", "-"], input=script, capture_output=True, text=True)
    for node in nodes:  # what the batch could not do, one by one with its error
        remove_node_network(cluster, node)


def remove_bridge(cluster: str) -> None:
    bridge = bridge_name(cluster)
    if link_exists(bridge):
        _ip("link", "del", bridge)


def leftover_netns(cluster: str) -> list[str]:
    """Namespaces of this cluster that exist on the host (for destroy and its tests)."""
    if not NETNS_DIR.is_dir():
        return []
    prefix = f"cb-{cluster}-"
    return sorted(p.name for p in NETNS_DIR.iterdir() if p.name.startswith(prefix))
