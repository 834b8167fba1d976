"""What every handler gets and may raise, and the table of handlers by request type.

A handler is registered with `@handles(RequestType)`: its request parameter must be of that type (mypy checks
the pair), so the daemon's dispatch (runner/daemon.py) hands each handler the request it was written for."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable
from typing import TYPE_CHECKING, Any, Callable, TypeVar

from tfrun.protocol.fields import ErrorCode
from tfrun.protocol.wire import Message, write_message
from tfrun.runner.job import JobRow

if TYPE_CHECKING:
    from tfrun.runner.daemon import Daemon

R = TypeVar("R", bound=Message)
Handler = Callable[["Daemon", Any, "Connection"], Awaitable[None]]

HANDLERS: dict[type[Message], Handler] = {}  # filled by @handles as runner/handlers/ modules are imported


def handles(request: type[R]) -> Callable[[Callable[[Daemon, R, Connection], Awaitable[None]]], Handler]:
    """Register the decorated coroutine as the handler of `request`."""

    def register(handler: Callable[[Daemon, R, Connection], Awaitable[None]]) -> Handler:
        HANDLERS[request] = handler
        return handler

    return register


class Connection:
    """One client's connection, as a handler sees it: a way to reply, and a key for its partial uploads."""

    def __init__(self, writer: asyncio.StreamWriter, key: str) -> None:
        self.writer = writer
        self.key = key
        self.big = False  # whether it sent a big request (runner/daemon.py gives its memory back)

    async def send(self, msg: Message) -> None:
        await write_message(self.writer, msg)

    async def send_frame(self, frame: bytes) -> None:
        """Send a message already encoded (`wire.encode`): a big reply is encoded in a worker thread."""
        self.writer.write(frame)
        await self.writer.drain()


class RequestError(Exception):
    """A request that cannot be served; becomes an `Error` reply, and the connection stays open."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


def find(daemon: Daemon, ref: str) -> JobRow:
    row = daemon.store.find(ref)
    if row is None:
        raise RequestError(ErrorCode.NO_SUCH_JOB, f"no job {ref!r}")
    return row


def invalid(message: str) -> RequestError:
    return RequestError(ErrorCode.INVALID_INPUT, message)
