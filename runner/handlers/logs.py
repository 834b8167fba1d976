"""Handlers of a job's output: its log read or followed, filtered on the box (runner/logs/logstream.py), and its
terminal (`--tty`: the tmux session `tfrun attach` opens)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol

from tfrun.protocol.fields import ErrorCode, JobState
from tfrun.protocol.logs import Attach, AttachReply, ReadLog

from ..executors.local import tty_socket
from ..logs import logstream
from ..logs.lines import PatternError
from .base import Connection, RequestError, Shown, find, handles, invalid

if TYPE_CHECKING:
    from tfrun.paths import Layout

    from ..executors.executor import Executor
    from ..logs.loggrowth import LogGrowth


class Context(Shown, Protocol):
    """What reading logs and attaching need of the daemon (runner/daemon.py's Daemon is one)."""

    executor: Executor
    layout: Layout
    log_growth: LogGrowth


@handles(ReadLog)
async def read_log(daemon: Context, req: ReadLog, conn: Connection) -> None:
    """Send the log (the job's, or one task's) from `offset`; when following, until the job is final and all is
    sent (runner/logs/logstream.py)."""
    row = find(daemon, req.job)
    try:
        chosen = await logstream.selection(req)
    except PatternError as exc:
        raise invalid(str(exc)) from None
    settle = daemon.executor.capabilities.log_settle_s
    try:
        await logstream.stream(
            req, chosen, row, lambda: daemon.store.get(row.id) or row, daemon.log_growth, conn.send, settle
        )
    except logstream.PastTheEnd as exc:
        raise RequestError(ErrorCode.BAD_REQUEST, str(exc)) from None
    except logstream.NoSuchLog as exc:
        raise invalid(str(exc)) from None


@handles(Attach)
async def attach(daemon: Context, req: Attach, conn: Connection) -> None:
    row = find(daemon, req.job)
    if not row.spec.tty:
        raise invalid(f"job {row.id} was not submitted with --tty: there is no session to attach to")
    if row.state != JobState.RUNNING:
        raise invalid(f"job {row.id} is {row.state}: only a running job's session can be attached to")
    socket_path = tty_socket(daemon.layout, row.id)
    await conn.send(AttachReply(command=["tmux", "-S", str(socket_path), "attach-session", "-t", "job"]))
