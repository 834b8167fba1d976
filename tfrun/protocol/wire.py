"""Messages and frames: the base classes, the handshake's messages, and reading and writing frames.

Every message class registers its wire tag with `@tagged("...")` when its module is imported; a peer's
frame naming a tag no imported module registered is refused like any malformed frame."""

from __future__ import annotations

import dataclasses
import json
import typing
from dataclasses import dataclass
from typing import Annotated, Any, ClassVar, Generic, Optional, Protocol, TypeVar, Union

from tfrun.constants import (
    MAX_HEADER_BYTES,
    MAX_HELLO_PROOF,
    MAX_PAYLOAD_BYTES,
)
from tfrun.protocol.fields import UTF8, BadValue, Limit, Text, bytes_field, checked_kwargs
from tfrun.shorten import shorten

# Bump on any change a peer of the previous version would misread. Both sides refuse a mismatch.
# 5: GetGpuUse, GetMetrics' cursor/after/upto/buckets, ListJobs' before/states/match: a daemon of 4 would
# refuse the first and answer the others as if unasked. 4: GetDaemonKey and a hello's proof, CheckService, no_room.
PROTOCOL_VERSION = 5


class ProtocolError(Exception):
    """A frame that cannot be read as a message of this protocol."""


class ConnectionClosed(ProtocolError):
    """The other end hung up before its answer was whole: a daemon that died, a dropped SSH link. Unlike a
    garbled frame, it may be gone for a moment only, so a client that can resume tries again."""


class Message:
    """Base of every message; subclasses are dataclasses registered under their TYPE."""

    TYPE: ClassVar[str] = ""


R = TypeVar("R", bound=Message, covariant=True)


class Request(Message, Generic[R]):
    """A message from client to daemon that names what it is answered with: `class Wait(Request[JobReply])`.
    `REPLIES` holds the reply classes (several for a streamed answer, as `ReadLog`'s), read from that base
    class once, so that `Channel.ask` checks every reply in one place (besides an `Error`, which any request
    may get)."""

    REPLIES: ClassVar[tuple[type[Message], ...]] = ()

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        for base in getattr(cls, "__orig_bases__", ()):
            if typing.get_origin(base) is Request:
                (reply,) = typing.get_args(base)
                cls.REPLIES = typing.get_args(reply) if typing.get_origin(reply) is Union else (reply,)


_REGISTRY: dict[str, type[Message]] = {}


M = TypeVar("M", bound=type[Message])


T = TypeVar("T", bound=Message)


def tagged(tag: str) -> typing.Callable[[M], M]:
    """Register a message class under its wire tag."""

    def register(cls: M) -> M:
        cls.TYPE = tag
        _REGISTRY[tag] = cls
        return cls

    return register


@tagged("hello")
@dataclass
class Hello(Message):
    """First frame each way. `role` is "client" or "daemon"; `version` is the package version. A client that
    must be sure who answers (the SSH fast path: tfrun/protocol/proof.py) sends a `challenge`; the daemon's
    hello then carries its `proof`. Both are hex, and absent otherwise."""

    protocol: int
    version: Text
    role: Text
    challenge: Annotated[str, UTF8, Limit(chars=MAX_HELLO_PROOF)] = ""
    proof: Annotated[str, UTF8, Limit(chars=MAX_HELLO_PROOF)] = ""


@tagged("error")
@dataclass
class Error(Message):
    code: str
    message: str


@tagged("ok")
@dataclass
class Ok(Message):
    message: str = ""


def encode(msg: Message) -> bytes:
    """The frame for `msg`: its JSON header line, then its raw bytes if it carries any."""
    body: dict[str, Any] = {"type": msg.TYPE}
    payload = b""
    for f in dataclasses.fields(msg):  # type: ignore[arg-type]
        value = getattr(msg, f.name)
        if isinstance(value, bytes):
            payload = value
            body["size"] = len(value)
        else:
            body[f.name] = plain(value)
    header = json.dumps(body, separators=(",", ":")).encode("ascii") + b"\n"
    return header + payload


def plain(value: Any) -> Any:
    """`value` (a record, a list of them, anything JSON takes) as JSON types, for frames and for files.
    Not dataclasses.asdict: that deep-copies, and a manifest holds thousands of records."""
    if isinstance(value, list):
        return [plain(v) for v in value]
    names = _FIELD_NAMES.get(type(value))
    if names is None and dataclasses.is_dataclass(value) and not isinstance(value, type):
        names = _FIELD_NAMES[type(value)] = tuple(f.name for f in dataclasses.fields(value))
    if names is not None:
        return {name: plain(getattr(value, name)) for name in names}
    return value


_FIELD_NAMES: dict[type, tuple[str, ...]] = {}


def decode_header(line: bytes) -> tuple[type[Message], dict[str, Any], int]:
    """Parse a header line into (class, checked constructor arguments, payload size still to read)."""
    try:
        raw = json.loads(line)
    except (UnicodeDecodeError, ValueError) as exc:
        raise ProtocolError(f"frame is not JSON: {exc}") from None
    except RecursionError:  # nested deeper than any message of this protocol
        raise ProtocolError("frame is nested too deeply") from None
    if not isinstance(raw, dict) or not isinstance(raw.get("type"), str):
        raise ProtocolError("frame has no message type")
    cls = _REGISTRY.get(raw["type"])
    if cls is None:
        raise ProtocolError(f"unknown message type {shorten(raw['type'], 64)!r}")
    size = 0
    if bytes_field(cls):
        size = raw.get("size", 0)
        if not isinstance(size, int) or isinstance(size, bool) or not 0 <= size <= MAX_PAYLOAD_BYTES:
            raise ProtocolError("payload size out of range")
    try:
        return cls, checked_kwargs(cls, raw), size
    except BadValue as exc:
        raise ProtocolError(f"{cls.TYPE}{exc.where}: {exc.message}") from None


class Reader(Protocol):
    """What both asyncio's StreamReader and asyncssh's SSHReader offer."""

    async def readuntil(self, separator: Any) -> Any: ...

    async def readexactly(self, n: int) -> Any: ...


class Writer(Protocol):
    def write(self, data: bytes) -> None: ...

    async def drain(self) -> None: ...

    def close(self) -> None: ...


async def read_message(reader: Reader) -> Optional[Message]:
    """The next message, or None when the peer closed cleanly between frames."""
    line = await read_header(reader)
    return None if line is None else await read_rest(reader, *decode_header(line))


async def read_header(reader: Reader) -> Optional[bytes]:
    """The next frame's header line, not yet decoded, or None when the peer closed cleanly between frames.
    Apart from `read_message` so that the daemon may decode a big header off its event loop."""
    import asyncio  # here, not above: a client asking over a plain socket (client/link/syncchannel.py) never loads it

    try:
        line: bytes = await reader.readuntil(b"\n")
    except asyncio.IncompleteReadError as exc:
        if exc.partial:
            raise ConnectionClosed("connection closed in the middle of a frame") from None
        return None
    except asyncio.LimitOverrunError:
        raise ProtocolError(f"frame header longer than {MAX_HEADER_BYTES} bytes") from None
    except ValueError as exc:  # StreamReader's way of saying the limit was overrun
        raise ProtocolError(f"bad frame: {exc}") from None
    if len(line) > MAX_HEADER_BYTES:
        raise ProtocolError(f"frame header longer than {MAX_HEADER_BYTES} bytes")
    return line


async def read_rest(reader: Reader, cls: type[Message], fields: dict[str, Any], size: int) -> Message:
    """The message whose header `decode_header` read: its payload of `size` bytes read, if it has one."""
    import asyncio

    name = bytes_field(cls)
    if name:
        try:
            fields[name] = await reader.readexactly(size) if size else b""
        except asyncio.IncompleteReadError:
            raise ConnectionClosed("connection closed in the middle of a payload") from None
    return cls(**fields)


async def write_message(writer: Writer, msg: Message) -> None:
    writer.write(encode(msg))
    await writer.drain()
