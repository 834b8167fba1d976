"""Carrying on through a daemon that goes away: a job's log read to its end, and actions safe to repeat.

A job may outlive any number of daemons (a crash, a restart, a dropped SSH link), so a client that waits on
it connects again and carries on for as long as a daemon comes back, and gives up only once none has
answered for the reconnect timeout (TFRUN_RECONNECT_TIMEOUT), never after some count of retries.

Words used here: a *cursor* is the next byte of a log to hand out, where a reader resumes; *following*
reads a log until its job ends, and on into the job that runs it again after a failure (`--max-restarts`).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable
from dataclasses import fields
from typing import Callable, Optional, TypeVar

from tfrun.constants import EXIT_DAEMON, RECONNECT_PAUSE_S
from tfrun.duration import format_duration
from tfrun.protocol.channel import Channel
from tfrun.protocol.logs import LogEnd, LogLines, LogQuery, ReadLog
from tfrun.protocol.wire import ConnectionClosed, ProtocolError

from ..config import settings as config
from ..errors import TfrunError

T = TypeVar("T")
Connect = Callable[[], Awaitable[Channel]]
# Hears, once an outage has lasted NOTICE_AFTER_S, that the link is down (True, and why if a try to connect
# said; else ""), and later that it is back (False, and for how long it was down): a follower silent for
# minutes must not look like a job that prints nothing.
Notice = Callable[[bool, str], None]
NOTICE_AFTER_S = 5.0

# What a daemon that went away in the middle of a conversation looks like: worth connecting again.
DISCONNECTS = (ConnectionError, ConnectionClosed)


def read_request(job: str, cursor: LogCursor, follow: bool, query: LogQuery) -> ReadLog:
    """The `ReadLog` from the cursor: after a reconnect, every line from there (no tail, no since again)."""
    which = {f.name: getattr(query, f.name) for f in fields(LogQuery)}
    if cursor.started:
        which.update(tail=None, since=None, since_ago=None)
    return ReadLog(job=job, offset=cursor.offset, follow=follow, **which)


class LogCursor:
    """The next byte of the log to hand out: where a follower resumes after losing its connection."""

    def __init__(self) -> None:
        self.offset = 0
        self.started = False  # something was received: a reconnect carries on instead of starting over
        self.end: Optional[LogEnd] = None  # the daemon's last word, once it came


async def read_log(
    channel: Channel, job: str, cursor: LogCursor, follow: bool, query: LogQuery
) -> AsyncIterator[bytes]:
    """The log's bytes from the cursor, moving it along; the final `LogEnd` lands in `cursor.end`."""
    request = read_request(job, cursor, follow, query)
    await channel.send(request)
    while True:
        msg = await channel.reply_to(request)
        if isinstance(msg, LogEnd):
            cursor.started = True
            cursor.end = msg
            return
        if msg.offset != cursor.offset:
            raise ProtocolError(f"log data from byte {msg.offset}, expected {cursor.offset}")
        cursor.offset = msg.next_offset if isinstance(msg, LogLines) else msg.offset + len(msg.data)
        cursor.started = True
        yield msg.data


class Reconnect:
    """New channels for a conversation that lost its daemon, tried every RECONNECT_PAUSE_S until one answers
    (one may be starting, the SSH link coming back; jobs run on regardless) or the patience runs out.

    With `hello_answers` False, a daemon that takes the connection but dies before answering the request does
    not count as answering: a submit that kills every daemon it reaches must not retry forever. `notice`
    hears of an outage that lasts (see `_Outage`), and of its end."""

    def __init__(self, connect: Connect, hello_answers: bool = True, notice: Optional[Notice] = None) -> None:
        self.connect = connect
        self.hello_answers = hello_answers
        self.notice = notice
        self.patience = config.reconnect_timeout(config.load())
        self.deadline: Optional[float] = None

    async def after(self, lost: Exception) -> Channel:
        loop = asyncio.get_running_loop()
        if self.deadline is None or self.hello_answers:
            self.deadline = loop.time() + self.patience
        outage = _Outage(self.notice, loop.time(), lost)
        try:
            while True:
                if loop.time() >= self.deadline:
                    raise TfrunError(
                        f"no tfrund answered for {format_duration(self.patience)} ({_reason(lost)}); jobs run on "
                        f"without it: try again later, or keep trying longer with {config.RECONNECT_ENV}",
                        EXIT_DAEMON,
                    )
                try:
                    channel = await self.connect()
                except (OSError, TfrunError, ProtocolError) as exc:
                    lost = outage.lost = exc
                else:
                    outage.over(loop.time())
                    return channel
                await asyncio.sleep(RECONNECT_PAUSE_S)
        finally:
            outage.timer.cancel()


class _Outage:
    """One outage of a Reconnect: told to its `Notice` once it has lasted NOTICE_AFTER_S (a daemon restart or
    a fresh keeper heals sooner, silently), and then its end. A timer, not the first failed try, since one try
    may itself wait out a dead link's whole connect deadline."""

    def __init__(self, notice: Optional[Notice], since: float, lost: Exception) -> None:
        self.notice = notice
        self.since = since
        self.lost = lost
        self.told = False
        self.timer = asyncio.get_running_loop().call_at(since + NOTICE_AFTER_S, self._tell)

    def _tell(self) -> None:
        self.told = True
        if self.notice is not None:
            self.notice(True, _reason(self.lost) if isinstance(self.lost, TfrunError) else "")

    def over(self, now: float) -> None:
        if self.told and self.notice is not None:
            self.notice(False, format_duration(max(1, round(now - self.since))))


def _reason(lost: Exception) -> str:
    """Why a connection was lost or could not be made, in words: the TfrunError's line, else the OS's."""
    return lost.message if isinstance(lost, TfrunError) else getattr(lost, "strerror", None) or str(lost)


async def resilient(
    action: Callable[[Channel], Awaitable[T]],
    connect: Connect,
    hello_answers: bool = True,
    notice: Optional[Notice] = None,
) -> T:
    """Run `action` on a new channel; if the daemon goes away in the middle, connect again and run it again.

    Only for actions that are safe to repeat: waiting, and a submit that carries its submission id. A daemon
    that cannot be reached at the start is an error at once."""
    again = Reconnect(connect, hello_answers, notice)
    channel = await connect()
    while True:
        try:
            return await action(channel)
        except DISCONNECTS as exc:
            lost = exc
        finally:
            channel.close()
        channel = await again.after(lost)


async def follow_log(
    connect: Connect,
    job: str,
    cursor: LogCursor,
    query: LogQuery,
    on_restart: Callable[[str, LogEnd], None],
    notice: Optional[Notice] = None,
) -> AsyncIterator[bytes]:
    """The job's output until it ends, resuming at the same byte after a daemon restart; when the job failed
    and was restarted (submit --max-restarts), `on_restart(job, end)` hears of it and the job that runs it
    again carries on, from its first byte. `cursor.end` is the last job's `LogEnd`."""
    while True:
        again = Reconnect(connect, notice=notice)
        channel = await connect()
        try:
            while cursor.end is None:
                try:
                    async for data in read_log(channel, job, cursor, True, query):
                        yield data
                except DISCONNECTS as exc:
                    channel.close()
                    channel = await again.after(exc)
        finally:
            channel.close()
        end = cursor.end
        if end is None or end.restarted_as is None:
            return
        on_restart(job, end)
        job = str(end.restarted_as)
        cursor.offset, cursor.started, cursor.end = 0, False, None
