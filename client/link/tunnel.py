"""Byte streams through the keeper's SSH connection: what a keeper does with a forward request (`tfrun forward`,
client/link/forward.py: the port asked for, a direct-tcpip channel to it, the answer, then the bytes both ways), and
the pump that copies one stream into another, for forwards and for the protocol's own connections. Apart from
client/link/forward.py, which starts keepers, so that the keeper and the forward imported each other neither way.
"""

from __future__ import annotations

import asyncio
import contextlib
from pathlib import Path
from typing import Any

from tfrun.numerals import is_digits

_HEADER_LIMIT = 16  # "65535\n" and some room: a forward request is a port and nothing else


def forward_path(keeper_socket: Path) -> Path:
    """Where a keeper serving `keeper_socket` takes forward requests."""
    return keeper_socket.with_suffix(".fwd")


async def serve_forward(conn: Any, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    """The keeper's side of one forward request: read the port, open the channel on `conn`, say how it went,
    then pump both ways until either side closes."""
    import asyncssh

    try:
        line = await reader.readline()
        text = line.decode(errors="replace").strip()
        if len(line) > _HEADER_LIMIT or not is_digits(text) or not 0 < int(text) < 65536:
            writer.write(b"error not a port\n")
            return
        try:
            remote_reader, remote_writer = await conn.open_connection("127.0.0.1", int(text))
        except asyncssh.ChannelOpenError as exc:
            word = "closed" if exc.code == asyncssh.OPEN_CONNECT_FAILED else "error"
            writer.write(f"{word} {' '.join(refusal(exc).split())}\n".encode())
            return
        writer.write(b"ok\n")
        await asyncio.gather(pump(reader, remote_writer), pump(remote_reader, writer))
    finally:
        writer.close()


def refusal(exc: Any) -> str:
    """What a refused direct-tcpip channel means, in the words a user acts on."""
    import asyncssh

    if exc.code == asyncssh.OPEN_ADMINISTRATIVELY_PROHIBITED:
        return "the box's sshd refuses port forwarding (AllowTcpForwarding no, or a restricted key)"
    return exc.reason or "the box refused the connection"


async def pump(source: Any, sink: Any) -> None:
    """Copy `source` to `sink` until its end, then end `sink`'s writing side (half-close, as TCP does)."""
    try:
        while data := await source.read(1 << 16):
            sink.write(data)
            await sink.drain()
    except (ConnectionError, OSError):
        pass  # the other side went away: closing below tells the rest
    finally:
        with contextlib.suppress(Exception):  # already closed: nothing left to tell it
            sink.write_eof()
