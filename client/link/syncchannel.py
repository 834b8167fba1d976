"""One request and its reply over a plain blocking Unix socket: how a verb asks the daemon on this machine
when it runs already (cli.ask), without asyncio, whose import alone costs `tfrun ps` some 35 ms.

It speaks tfrun/protocol/'s frames and handshake, with its message classes and checks, as `Channel` does:
a hello of another protocol, or an `Error` for a reply, raises RemoteError; a reply of a type the request
does not name, ProtocolError. One reply a request, or a few of one kind (`each`: `ps --json`'s parts);
nothing followed (logs), nothing uploaded, nothing that starts a daemon or crosses SSH. Those are
client/library/api.py's.
"""

from __future__ import annotations

import socket
import typing
from collections.abc import Callable
from typing import Any, TypeVar

from tfrun.constants import MAX_HEADER_BYTES
from tfrun.private import check_peer
from tfrun.protocol.channel import RemoteError, check_reply, checked_hello, client_hello
from tfrun.protocol.fields import bytes_field
from tfrun.protocol.wire import ConnectionClosed, Error, Message, ProtocolError, Request, decode_header, encode

M = TypeVar("M", bound=Message)


class SyncChannel:
    """A connection to a daemon after the handshake, for requests answered by one reply each."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.frames = sock.makefile("rb")

    @classmethod
    def connect(cls, path: str) -> SyncChannel:
        """A channel to the daemon listening at `path`; FileNotFoundError or ConnectionRefusedError if none is,
        NotPrivate if another user's process listens there (before a byte is sent)."""
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            sock.connect(path)
            check_peer(sock, path)
            channel = cls(sock)
            channel.hello()
        except BaseException:
            sock.close()
            raise
        return channel

    def close(self) -> None:
        self.frames.close()
        self.sock.close()

    def hello(self) -> None:
        """Exchange hellos, as `Channel.open` does."""
        mine = client_hello()
        self.sock.sendall(encode(mine))
        cls, fields = self._next("the other end closed the connection before answering the hello")
        checked_hello(mine, cls(**fields))

    def ask(self, request: Request[M]) -> M:
        """Send one request and return its one reply, checked against the replies it names."""
        self.sock.sendall(encode(request))
        return self._reply(request)

    def each(self, request: Request[M], take: Callable[[M], bool]) -> None:
        """Send a request answered in parts: `take` gets each reply as it comes and says whether more follow."""
        self.sock.sendall(encode(request))
        while take(self._reply(request)):
            pass

    def _reply(self, request: Request[M]) -> M:
        """The next reply to `request`, checked against the replies it names."""
        cls, fields = self._next("tfrund closed the connection without answering")
        check_reply(request, cls)
        return typing.cast(M, cls(**fields))

    def _next(self, closed: str) -> tuple[type[Message], dict[str, Any]]:
        """The next frame's message class and checked fields; an `Error` raises RemoteError. `closed` says
        what a hang-up before the frame means."""
        line = self.frames.readline(MAX_HEADER_BYTES + 1)
        if not line:
            raise ConnectionClosed(closed)
        if len(line) > MAX_HEADER_BYTES:
            raise ProtocolError(f"frame header longer than {MAX_HEADER_BYTES} bytes")
        if not line.endswith(b"\n"):
            raise ConnectionClosed("connection closed in the middle of a frame")
        cls, fields, size = decode_header(line)
        if cls is Error:
            error = Error(**fields)
            raise RemoteError(error.code, error.message)
        name = bytes_field(cls)
        if name:
            fields[name] = self.frames.read(size)
            if len(fields[name]) < size:
                raise ConnectionClosed("connection closed in the middle of a payload")
        return cls, fields
