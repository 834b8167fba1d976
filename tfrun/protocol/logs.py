"""Reading a job's log: `ReadLog` and the stream that answers it (raw chunks or filtered lines, then an end)."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Annotated, Optional, Union

from tfrun.constants import (
    MAX_NODES,
)
from tfrun.protocol.fields import Context, JobRef, Offset, Patterns, Range
from tfrun.protocol.wire import Message, Request, tagged


@tagged("log_chunk")
@dataclass
class LogChunk(Message):
    """Bytes of the job's log starting at byte `offset` of the file."""

    offset: int
    data: bytes


@tagged("log_lines")
@dataclass
class LogLines(Message):
    """Finished lines that passed the filter, as UTF-8 text each ending in a newline; they lie between
    byte `offset` and `next_offset` of the log, where a follower that reconnects resumes."""

    offset: int
    next_offset: int
    data: bytes


@tagged("log_end")
@dataclass
class LogEnd(Message):
    """No more bytes: `offset` is the end of the log; the job's final state when it has ended."""

    offset: int
    state: str
    exit_code: Optional[int] = None
    restarted_as: Optional[int] = None  # the job that carries on after this one failed, if any


@dataclass
class LogQuery:
    """Which lines of a log to read; empty means every byte as written. The filters run on the box.

    The Python API's `tfrun.LogQuery`, and the part of `ReadLog` that says which lines: a filter is declared
    here once, for the wire, its bounds and the API alike."""

    patterns: Patterns = field(default_factory=list)  # extended regular expressions, ORed
    invert: bool = False
    ignore_case: bool = False
    fixed: bool = False  # patterns are plain strings
    tail: Optional[Offset] = None  # only the last N lines (that pass) of what is there now; any count
    after: Context = 0  # lines of context after each match, as grep -A
    before: Context = 0  # and before, as grep -B
    since: Optional[float] = None  # only lines complete at or after this time (seconds since the epoch)
    # only lines complete in the last this many seconds (the box's clock)
    since_ago: Optional[Annotated[float, Range(0, math.inf)]] = None
    timestamps: bool = False  # each line starts with the time it was complete, as RFC 3339 in UTC
    # whose output, of a job on several Slurm nodes (submit --nodes): task 0's is the job's log; task I > 0
    # writes task-I.log, which has no time index (no `since` or `timestamps` then)
    task: Annotated[int, Range(0, MAX_NODES - 1)] = 0


@dataclass
class LogPlace:
    """Where a read of a log starts: the job, the byte, and whether to keep reading as it grows. A base of
    ReadLog's apart from LogQuery's so that its fields come first (the job has no default)."""

    job: JobRef
    offset: Offset = 0
    follow: bool = False


@tagged("read_log")
@dataclass
class ReadLog(Request[Union[LogChunk, LogLines, LogEnd]], LogQuery, LogPlace):
    """The job's output from byte `offset`; with `follow`, keep sending until the job ends. Its fields: the
    place (`LogPlace`), then which lines (`LogQuery`).

    With no filter the bytes come as they are, in `LogChunk`s. With `patterns`, `tail`, a `since` or
    `timestamps` the daemon reads the log as terminal lines (see runner/logs/lines.py) and sends only the lines
    that pass, in `LogLines`; `offset` must then be a line boundary, as every `LogLines.next_offset` is.
    Times are the box's: seconds since the epoch, from the log's (offset, time) index.
    """


@tagged("attach_reply")
@dataclass
class AttachReply(Message):
    """The command that attaches a terminal to the job's tmux session, to run on the box."""

    command: list[str]


@tagged("attach")
@dataclass
class Attach(Request[AttachReply]):
    """How to open a running `--tty` job's session: answered by `AttachReply`."""

    job: JobRef
