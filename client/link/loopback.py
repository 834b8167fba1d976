"""Who connected to a TCP port tfrun listens on: the uid of the peer of a loopback connection, from the kernel.

127.0.0.1 keeps the network out, not the other users of the same machine: any of them may connect to a port
`tfrun forward` (or `tensorboard`, `jupyter`) listens on, and ride the user's SSH connection to the box. TCP
has no SO_PEERCRED, but on Linux /proc/net/tcp and tcp6 list every socket of the network namespace with the
uid that made it: the peer's socket is the row whose local address is our connection's remote one and whose
remote address is our local one (a 4-tuple is one live connection). A row without an inode (a connection its
process closed, TIME_WAIT) names no one, and is no proof.
"""

from __future__ import annotations

import ipaddress
import os
import socket
import sys
from typing import Optional

_TCP_TABLES = ("/proc/net/tcp", "/proc/net/tcp6")
Endpoint = tuple[bytes, int]  # an IPv6 address (an IPv4 one mapped: ::ffff:a.b.c.d) and a port


def can_tell() -> bool:
    """Whether this system says who is at the other end of a TCP connection (Linux's /proc/net/tcp)."""
    return os.path.exists(_TCP_TABLES[0])


def peer_uid(sock: socket.socket) -> Optional[int]:
    """The uid of the process whose socket is the other end of `sock`, a connection over this machine's own
    addresses; None when the kernel lists no such socket (gone already, or another machine's)."""
    here, there = _endpoint(sock.getsockname()), _endpoint(sock.getpeername())
    for table in _TCP_TABLES:
        try:
            with open(table) as f:
                rows = f.readlines()[1:]
        except OSError:
            continue
        for row in rows:
            fields = row.split()
            if len(fields) > 9 and fields[9] != "0" and _parse(fields[1]) == there and _parse(fields[2]) == here:
                return int(fields[7])
    return None


def _endpoint(address: tuple[object, ...]) -> Endpoint:
    """A socket address (host, port[, ...]) as an Endpoint."""
    ip = ipaddress.ip_address(str(address[0]))
    if isinstance(ip, ipaddress.IPv4Address):
        ip = ipaddress.IPv6Address(b"\0" * 10 + b"\xff\xff" + ip.packed)
    return ip.packed, int(str(address[1]))


def _parse(text: str) -> Endpoint:
    """`0100007F:1F90` (IPv4) or 32 hex digits and a port (IPv6), as /proc/net/tcp writes them: the address
    in 32-bit words of the host's byte order."""
    address, _, port = text.partition(":")
    raw = bytes.fromhex(address)
    if sys.byteorder == "little":
        raw = b"".join(raw[i : i + 4][::-1] for i in range(0, len(raw), 4))
    if len(raw) == 4:
        raw = b"\0" * 10 + b"\xff\xff" + raw
    return raw, int(port, 16)
