"""What every handler gets and may raise, and the table of handlers by request type.

A handler is registered with `@handles(RequestType)`: its request parameter must be of that type (mypy checks
the pair), so the daemon's dispatch (runner/daemon.py) hands each handler the request it was written for."""

from __future__ import annotations

import asyncio
import errno
import functools
import logging
import resource
import sqlite3
from collections.abc import Awaitable
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Optional, Protocol, TypeVar

from tfrun.protocol.fields import ErrorCode
from tfrun.protocol.wire import Message, write_message

from ..alerts import diskfull, rules
from ..alerts.outbox import masked
from ..records.job import JobRow

if TYPE_CHECKING:
    from tfrun.protocol.jobs import Job

    from ..config.settings import Config
    from ..records.store import Store

R = TypeVar("R", bound=Message)
C = TypeVar("C")  # what the handler needs of the daemon: its module's Context (runner/daemon.py's Daemon is each)
Handler = Callable[[Any, Any, "Connection"], Awaitable[None]]

log = logging.getLogger("tfrund")

HANDLERS: dict[type[Message], Handler] = {}  # filled by @handles as runner/handlers/ modules are imported


class Shown(Protocol):
    """What finding a job and showing it to a client need of the daemon: its jobs, and its config (the alert
    rules a job without rules of its own has)."""

    store: Store
    config: Config


def handles(request: type[R]) -> Callable[[Callable[[C, R, Connection], Awaitable[None]]], Handler]:
    """Register the decorated coroutine as the handler of `request`."""

    def register(handler: Callable[[C, R, Connection], Awaitable[None]]) -> Handler:
        HANDLERS[request] = functools.partial(_refusing, handler)
        return handler

    return register


async def _refusing(handler: Handler, daemon: Shown, req: Message, conn: Connection) -> None:
    """Run `handler`; a request the box had no room for (`box_refusal`) is refused in one line, logged as one
    (runner/limits.py keeps a repeated one from filling the log), not answered as an internal error with its
    traceback. The home is the store's folder."""
    try:
        await handler(daemon, req, conn)
    except (OSError, sqlite3.Error) as exc:
        refusal = box_refusal(exc, daemon.store.path.parent)
        if refusal is None:
            raise
        log.warning("%s refused: %s", req.TYPE, refusal.message)
        raise refusal from None


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


def box_refusal(exc: BaseException, home: Path) -> Optional[RequestError]:
    """The one line a client gets for a request the box had no room for: its disk full (the disk named, with
    what is free there), or tfrund's file descriptors used up. None for any other failure: a bug, logged
    with its traceback."""
    if diskfull.is_disk_full(exc):
        filename = exc.filename if isinstance(exc, OSError) and isinstance(exc.filename, str) else None
        where = _existing(Path(filename)) if filename else home
        advice = "free some space there (tfrun df shows what jobs take, tfrun prune removes old ones) and try again"
        return RequestError(ErrorCode.NO_ROOM, f"{diskfull.describe(where)}; {advice}")
    if isinstance(exc, OSError) and exc.errno in (errno.EMFILE, errno.ENFILE):
        soft = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
        whose = f"tfrund's ({soft} at most)" if exc.errno == errno.EMFILE else "the box's"
        return RequestError(ErrorCode.NO_ROOM, f"tfrund cannot open a file: {whose} open files are used up (too "
                                               "many clients or followers at once?); try again later")  # fmt: skip
    return None


def _existing(path: Path) -> Path:
    """`path`, or the nearest folder above it that exists (a file a full disk did not let be made)."""
    while not path.exists() and path != path.parent:
        path = path.parent
    return path


def find(daemon: Shown, ref: str) -> JobRow:
    row = daemon.store.find(ref)
    if row is None:
        raise RequestError(ErrorCode.NO_SUCH_JOB, f"no job {ref!r}")
    return row


def invalid(message: str) -> RequestError:
    return RequestError(ErrorCode.INVALID_INPUT, message)


def public(daemon: Shown, row: JobRow) -> Job:
    """The job as a client sees it, with its alert rules and its URLs masked."""
    job = row.public()
    stored = daemon.store.job_alerts(row.id)
    chosen, urls = (stored[0], stored[1]) if stored else (daemon.config.rules, [])
    job.alert_rules = rule_texts(chosen)
    job.notify = [masked(url) for url in urls]
    return job


def rule_texts(chosen: dict[str, Optional[float]]) -> list[str]:
    """A job's alert rules as a client reads them ("stall=30m"); the box's own (gpu-memory, disk-full) left out."""
    return rules.texts({k: v for k, v in chosen.items() if k in rules.JOB_RULES})
