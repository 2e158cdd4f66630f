"""The metadata service's hop limit over a real routed network (network namespaces, root).

EC2 sends the IMDSv2 token response with the instance's HttpPutResponseHopLimit as its
IP TTL: with the default of 1, a client one routing hop behind the instance (a
container behind a bridge or NAT on it) never receives a token. Here: the service in
namespace `srv`, a router namespace, and a client namespace behind the router.
"""

from __future__ import annotations

import subprocess
import threading

import pytest

from clusterbake.twins.aws.daemon import in_netns
from clusterbake.twins.aws.imds import MetadataServer, listen

pytestmark = pytest.mark.integration
NETNS = {"srv": "cbtest-imds-srv", "rtr": "cbtest-imds-rtr", "cli": "cbtest-imds-cli"}
CLIENT = """
import sys, urllib.request
request = urllib.request.Request("http://10.199.1.1/latest/api/token", method="PUT",
                                 headers={"X-aws-ec2-metadata-token-ttl-seconds": "60"})
try:
    print(urllib.request.urlopen(request, timeout=float(sys.argv[1])).status)
except OSError as exc:
    print("no answer:", exc)
"""


def ip(*args: str) -> None:
    subprocess.run(["ip", *args], check=True, capture_output=True)


@pytest.fixture
def routed():
    for name in NETNS.values():
        subprocess.run(["ip", "netns", "del", name], capture_output=True)
        ip("netns", "add", name)
    srv, rtr, cli = NETNS["srv"], NETNS["rtr"], NETNS["cli"]
    ip("link", "add", "cbt-s0", "netns", srv, "type", "veth", "peer", "name", "cbt-r0", "netns", rtr)
    ip("link", "add", "cbt-c0", "netns", cli, "type", "veth", "peer", "name", "cbt-r1", "netns", rtr)
    for netns, link, address in (
        (srv, "cbt-s0", "10.199.1.1/24"),
        (rtr, "cbt-r0", "10.199.1.2/24"),
        (rtr, "cbt-r1", "10.199.2.1/24"),
        (cli, "cbt-c0", "10.199.2.2/24"),
    ):
        ip("-n", netns, "addr", "add", address, "dev", link)
        ip("-n", netns, "link", "set", link, "up")
        ip("-n", netns, "link", "set", "lo", "up")
    ip("-n", srv, "route", "add", "10.199.2.0/24", "via", "10.199.1.2")
    ip("-n", cli, "route", "add", "default", "via", "10.199.2.1")
    subprocess.run(["ip", "netns", "exec", rtr, "sysctl", "-qw", "net.ipv4.ip_forward=1"], check=True)
    yield
    for name in NETNS.values():
        subprocess.run(["ip", "netns", "del", name], capture_output=True)


def serve(hop_limit: int) -> MetadataServer:
    sock = in_netns(NETNS["srv"], lambda: listen("10.199.1.1", 80))
    found = {"instance_id": "i-0123456789abcdef0", "http_tokens": "required", "hop_limit": hop_limit}
    server = MetadataServer(sock, lambda address: found, lambda *a: {}, lambda message: None)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


def ask(netns: str, timeout: float = 3.0) -> str:
    result = subprocess.run(
        ["ip", "netns", "exec", NETNS[netns], "python3", "-c", CLIENT, str(timeout)],
        capture_output=True,
        text=True,
        timeout=30,
    )
    return result.stdout.strip()


@pytest.mark.parametrize("hop_limit, behind_router", [(1, "no answer"), (2, "200")])
def test_token_answers_travel_only_as_far_as_the_hop_limit(routed, hop_limit, behind_router):
    server = serve(hop_limit)
    try:
        assert ask("rtr") == "200"  # on the same link as the service: no routing hop
        assert ask("cli").startswith(behind_router)
    finally:
        server.shutdown()
        server.server_close()
