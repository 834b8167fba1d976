"""A conversation as the client side holds it (the tfrun CLI, the Python API, tfrund's own status/stop
commands): the handshake, then requests out and replies in, each reply checked against what its request
names."""

from __future__ import annotations

import typing
from typing import Any, Optional, Union

from tfrun import __version__
from tfrun.constants import (
    MAX_HEADER_BYTES,
)
from tfrun.private import check_peer
from tfrun.protocol.fields import ErrorCode
from tfrun.protocol.wire import (
    PROTOCOL_VERSION,
    ConnectionClosed,
    Error,
    Hello,
    Message,
    ProtocolError,
    Reader,
    Request,
    T,
    Writer,
    read_message,
    write_message,
)


def client_hello() -> Hello:
    return Hello(protocol=PROTOCOL_VERSION, version=__version__, role="client")


def daemon_hello(proof: str = "") -> Hello:
    return Hello(protocol=PROTOCOL_VERSION, version=__version__, role="daemon", proof=proof)


def mismatch_message(client: Hello, daemon: Hello) -> str:
    """One sentence naming both ends' versions and the way out."""
    return (
        f"protocol mismatch: tfrun {client.version} speaks protocol {client.protocol}, "
        f"tfrund {daemon.version} speaks protocol {daemon.protocol}; install the same tfrun version on "
        "both sides (pip install -U tfrun), then restart the daemon with `tfrund stop`"
    )


class Unproven(ProtocolError):
    """What answered at a remembered path could not prove it is the user's daemon (tfrun/protocol/proof.py):
    another user's listener, or a daemon too old to prove. Nothing but the hello was sent to it."""


class RemoteError(Exception):
    """The daemon answered with an `Error`."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


def checked_hello(mine: Hello, reply: Message) -> Hello:
    """The daemon's hello, if `reply` is one of this protocol's: else ProtocolError, or RemoteError with code
    VERSION_MISMATCH saying which side to upgrade. For Channel and the CLI's plain-socket channel alike."""
    if not isinstance(reply, Hello):
        raise ProtocolError("the other end did not answer like a tfrund")
    if reply.protocol != PROTOCOL_VERSION:
        raise RemoteError(ErrorCode.VERSION_MISMATCH, mismatch_message(mine, reply))
    return reply


def check_proof(key: bytes, mine: Hello, reply: Optional[Message]) -> None:
    """Unproven unless `reply` is a hello proving the daemon holds `key` (the answer to `mine`'s challenge)."""
    from tfrun.protocol.proof import proves

    if not isinstance(reply, Hello) or not reply.proof or not proves(key, mine.challenge, reply.proof):
        raise Unproven("what answers there did not prove it is your tfrund")


def check_reply(request: Union[Request[Any], type[Request[Any]]], reply: type[Message]) -> None:
    """ProtocolError unless a message of class `reply` is one of the answers `request` names."""
    if not issubclass(reply, request.REPLIES):
        expected = " or ".join(repr(cls.TYPE) for cls in request.REPLIES)
        raise ProtocolError(f"expected {expected} in reply to {request.TYPE!r}, got {reply.TYPE!r}")


class Channel:
    """A connection to a daemon after the handshake: requests out, replies in."""

    def __init__(self, reader: Reader, writer: Writer, daemon: Hello) -> None:
        self.reader = reader
        self.writer = writer
        self.daemon = daemon
        self._closers: list[typing.Callable[[], object]] = []

    def on_close(self, closer: typing.Callable[[], object]) -> None:
        """Also call `closer` (e.g. to end the SSH connection under this channel) when it closes."""
        self._closers.append(closer)

    def close(self) -> None:
        self.writer.close()
        for closer in self._closers:
            closer()
        self._closers.clear()

    @classmethod
    async def open(cls, reader: Reader, writer: Writer, key: Optional[bytes] = None) -> Channel:
        """Exchange hellos; raise RemoteError with code VERSION_MISMATCH if the versions differ. With the
        daemon's `key`, the daemon must prove it holds it (`Unproven` otherwise, an Error answer included:
        an unproven answer is not believed)."""
        mine = client_hello()
        if key is not None:
            from tfrun.protocol.proof import new_challenge

            mine.challenge = new_challenge()
        await write_message(writer, mine)
        reply = await read_message(reader)
        if reply is None:
            raise ConnectionClosed("the other end closed the connection before answering the hello")
        if key is not None:
            check_proof(key, mine, reply)
        if isinstance(reply, Error):
            raise RemoteError(reply.code, reply.message)
        return cls(reader, writer, checked_hello(mine, reply))

    @classmethod
    async def connect_unix(cls, path: str) -> Channel:
        """A channel to whatever speaks the protocol on the Unix socket at `path` (a daemon, a keeper), once
        its peer is known to run as this user: another user's socket raises NotPrivate before the hello."""
        import asyncio

        reader, writer = await asyncio.open_unix_connection(path, limit=MAX_HEADER_BYTES + 1)
        try:
            check_peer(writer.get_extra_info("socket"), path)
            return await cls.open(reader, writer)
        except BaseException:
            writer.close()
            raise

    async def ask(self, request: Request[T]) -> T:
        """Send one request and return its one reply, checked as `reply_to` checks it."""
        await self.send(request)
        return await self.reply_to(request)

    async def send(self, request: Request[Any]) -> None:
        """Send a request without waiting for its answer: one streamed back (`ReadLog`, `ReadFile`), or
        one of several sent before their answers are read (`PutBlobs`)."""
        await write_message(self.writer, request)

    async def reply_to(self, request: Union[Request[T], type[Request[T]]]) -> T:
        """The next message, which must be one of the replies `request` (or its class) names: an `Error`
        raises RemoteError, any other message ProtocolError (not an assert: `python -O` drops those)."""
        reply = await self.receive()
        check_reply(request, type(reply))
        return typing.cast(T, reply)

    async def request(self, msg: Message) -> Message:
        """Send one message and return the next one, unchecked (tests that speak the protocol by hand)."""
        await write_message(self.writer, msg)
        return await self.receive()

    async def receive(self) -> Message:
        reply = await read_message(self.reader)
        if reply is None:
            raise ConnectionClosed("tfrund closed the connection without answering")
        if isinstance(reply, Error):
            raise RemoteError(reply.code, reply.message)
        return reply
