"""The Azure twin's DNS at 168.63.129.16:53 (Azure's virtual public IP for DNS), for its nodes only.

Azure-provided name resolution answers a VM's queries at 168.63.129.16: the VMs of its
virtual network by name (`<computer name>` in the network's `internal.cloudapp.net`
suffix) and the public names, among them each Key Vault's `<vault>.vault.azure.net`. The
twin answers exactly these: its VMs' names with their private IPs, and the vaults of its
subscription with the address of its Key Vault listener (the nodes have no other way
out). Any other name: NXDOMAIN. A (IPv4) records only; other types of a known name get an
empty answer, as for a name with no such record.
"""

from __future__ import annotations

import socket
import struct
import threading
from collections.abc import Callable

A, CLASS_IN = 1, 1
NOERROR, FORMERR, NXDOMAIN = 0, 1, 3
TTL = 10

# resolve(name, lower case, no trailing dot) -> an IPv4 address or None
Resolve = Callable[[str], str | None]


def _question(packet: bytes) -> tuple[str, int, int, int]:
    """(name, qtype, qclass, offset after the question) of a query's first question."""
    labels, offset = [], 12
    while True:
        length = packet[offset]
        offset += 1
        if length == 0:
            break
        if length & 0xC0:
            raise ValueError("compressed name in a question")
        labels.append(packet[offset : offset + length].decode("ascii", "replace"))
        offset += length
    qtype, qclass = struct.unpack("!HH", packet[offset : offset + 4])
    return ".".join(labels).lower(), qtype, qclass, offset + 4


def answer(packet: bytes, resolve: Resolve) -> bytes | None:
    """The response to one query (None: not a query worth answering)."""
    if len(packet) < 12:
        return None
    ident, flags, qdcount = struct.unpack("!HHH", packet[:6])
    if flags & 0x8000:  # a response, not a query
        return None
    recursion = flags & 0x0100
    try:
        if qdcount != 1:
            raise ValueError("one question expected")
        name, qtype, qclass, end = _question(packet)
    except (ValueError, IndexError, struct.error):
        return struct.pack("!HHHHHH", ident, 0x8000 | recursion | 0x0080 | FORMERR, 0, 0, 0, 0)
    address = resolve(name)
    question = packet[12:end]
    header_flags = 0x8000 | 0x0400 | recursion | 0x0080  # response, authoritative, RD copied, RA
    if address is None:
        return struct.pack("!HHHHHH", ident, header_flags | NXDOMAIN, 1, 0, 0, 0) + question
    records = b""
    count = 0
    if qtype == A and qclass == CLASS_IN:
        records = struct.pack("!HHHIH", 0xC00C, A, CLASS_IN, TTL, 4) + socket.inet_aton(address)
        count = 1
    return struct.pack("!HHHHHH", ident, header_flags | NOERROR, 1, count, 0, 0) + question + records


class DnsServer:
    """Answers on an already bound UDP socket (created in the twin's service namespace)."""

    def __init__(self, sock: socket.socket, resolve: Resolve, log: Callable[[str], None]):
        self.sock, self.resolve, self.log = sock, resolve, log

    def serve_forever(self) -> None:
        while True:
            try:
                packet, source = self.sock.recvfrom(4096)
            except OSError:
                return
            try:
                reply = answer(packet, self.resolve)
            except Exception as exc:  # a bad packet must not stop the service
                self.log(f"dns: {source[0]}: {exc!r}")
                continue
            if reply is not None:
                self.sock.sendto(reply, source)

    def start(self) -> None:
        threading.Thread(target=self.serve_forever, name="dns", daemon=True).start()


def listen_udp(address: str, port: int = 53) -> socket.socket:
    sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((address, port))
    return sock
