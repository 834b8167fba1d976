"""Streaming a job's log to a client (the ReadLog request): its bytes as they are (LogChunk), or its terminal
lines (LogLines) chosen by patterns, --tail, --since, and stamped with their times (-t); when following, on
as the log grows until the job is final (LogEnd says where it stopped, so a client resumes there).

A *chunk* is a run of the log's bytes; a *line* is a terminal line (runner/logs/lines.py), as the job's output
shows on a terminal once carriage returns and erasures are applied. Times come from the shim's log index
(runner/shim/logindex.py). Offsets are byte offsets in the log read (output.log, or task-I.log for a task of a job on
several Slurm nodes: `ReadLog.task`); a line-wise stream resumes at a line's end.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import os
import time
from collections.abc import Awaitable
from pathlib import Path
from typing import Any, BinaryIO, Callable, NamedTuple, Optional, Protocol

from tfrun.constants import FILTER_THREADS, FOLLOW_POLL_S, LOG_CHUNK_BYTES
from tfrun.protocol.fields import State
from tfrun.protocol.logs import LogChunk, LogEnd, LogLines, ReadLog
from tfrun.protocol.wire import Message

from ..shim import jobdir
from ..shim.logindex import LogIndex, Stamper
from ..shim.slurmtask import TASK_LOG
from .lines import BlockMatcher, LineFilter, Selector, Tail, TerminalLines, display
from .loggrowth import LogGrowth

Send = Callable[[Message], Awaitable[None]]


class _Nodes(Protocol):
    @property
    def nodes(self) -> Optional[int]: ...  # Slurm: one task a node, task I > 0 writing task-I.log


class LoggedJob(Protocol):
    """What a log stream needs of a job: where its folder is, how many tasks write logs, and whether it is
    final and how it ended (runner/records/job.py's JobRow is one; this wing stands below records/)."""

    @property
    def id(self) -> int: ...

    @property
    def job_dir(self) -> str: ...

    @property
    def spec(self) -> _Nodes: ...

    @property
    def final(self) -> bool: ...

    @property
    def state(self) -> State: ...

    @property
    def exit_code(self) -> Optional[int]: ...

    @property
    def restarted_as(self) -> Optional[int]: ...


# Threads that compile and match `logs` patterns, apart from the default pool (doctor, metrics, GPUs), so that
# costly filters queue behind each other instead of in front of everything else.
_FILTERS = concurrent.futures.ThreadPoolExecutor(FILTER_THREADS, thread_name_prefix="tfrund-filter")


_JOIN_LINES = 4096  # lines joined into one frame's text at most (see _LineReader._send)

# A read is matched on the event loop, not in a _FILTERS thread, when its bytes times its patterns' length (one
# more than the sum of their characters: the work of the search, roughly) is at most this, and it is at most
# _INLINE_MAX_BYTES: what a follower reads on each growth, a line or a few, costs the daemon about 15 us that
# way, where the hop to a thread and back (a wake-up, GIL hand-overs, the loop's self-pipe) cost it about 110 us
# of CPU and a followed line some 0.4 ms on this 2-CPU box. Big reads and costly filters still go to the threads.
_INLINE_WORK = 1 << 18
_INLINE_MAX_BYTES = 16 << 10


class PastTheEnd(Exception):
    """The request starts at an offset past the end of the log."""


class NoSuchLog(Exception):
    """The request names a task the job does not have, or asks a task's log for times it does not hold; the
    message says so, for the client."""


def log_path(req: ReadLog, row: LoggedJob) -> Path:
    """The log the request reads: the job's own (its task 0's), or task-I.log, which task I of a job on
    several Slurm nodes writes (runner/shim/slurmtask.py). Only the job's own log has an (offset, time) index (the
    shim's, beside it): a task's is written by its command on another node, so `since` and `timestamps` on it
    are refused rather than answered wrong."""
    tasks = row.spec.nodes or 1
    if req.task >= tasks:
        have = f"tasks 0-{tasks - 1}" if tasks > 1 else "task 0 only"
        raise NoSuchLog(f"job {row.id} has {have}; no task {req.task}")
    if req.task == 0:
        return Path(row.job_dir) / jobdir.OUTPUT
    if req.since is not None or req.since_ago is not None or req.timestamps:
        raise NoSuchLog(f"task {req.task}'s log has no times (only task 0's has): --since and -t are for task 0")
    return Path(row.job_dir) / TASK_LOG.format(req.task)


class Selection(NamedTuple):
    """A request's line patterns, compiled."""

    compiled: Optional[Any]  # None: no patterns
    blocks: BlockMatcher


async def selection(req: ReadLog) -> Selection:
    """The request's patterns compiled, in a worker thread: a thousand of them cost RE2 tens of milliseconds,
    which must not be every other client's wait. Raises lines.PatternError."""
    line_filter = LineFilter(tuple(req.patterns), req.invert, req.ignore_case, req.fixed)
    if not line_filter.patterns:
        return Selection(None, BlockMatcher(line_filter))

    def work() -> Selection:
        return Selection(line_filter.compile(), BlockMatcher(line_filter))

    return await asyncio.get_running_loop().run_in_executor(_FILTERS, work)


async def stream(
    req: ReadLog,
    chosen: Selection,
    row: LoggedJob,
    latest: Callable[[], LoggedJob],
    log_growth: LogGrowth,
    send: Send,
    settle_s: float = 0.0,
) -> None:
    """Send the log of job `row` from the request's offset; when following, until the job is final and all
    is sent. `latest` reads the job's row again, to learn whether it is final. `settle_s`: a follower ends
    only once the final job's log has not grown for this long (a log written on another machine, on a
    shared filesystem, may show its last bytes after the job's end is known: Slurm)."""
    since = time.time() - req.since_ago if req.since_ago is not None else req.since
    path = log_path(req, row)
    index = LogIndex(Path(row.job_dir) / jobdir.INDEX) if since is not None or req.timestamps else None
    lines = _line_reader(req, chosen, send, path, index, since)
    with log_growth.follow(path) as grew, contextlib.ExitStack() as cleanup:
        offset = req.offset
        handle: Optional[Any] = None
        # Without -f, the job's state is read before the log's end: a job final then has written all it will.
        current, state_read = (row, False) if req.follow else (latest(), True)
        quiet_since: Optional[float] = None  # since when a final job's log has not grown
        # The log is read as it was when asked (its end then), the whole read without -f, the lines of a --tail
        # before a -f goes on: a job writing fast moves the end faster than a client takes it, and `--tail 5`
        # chasing it sent 2,060,006 lines (447 MB) in 6.3 s and never stopped.
        asked_end: Optional[int] = None
        while True:
            if handle is None and path.exists():
                handle = cleanup.enter_context(open(path, "rb"))
                asked_end = os.fstat(handle.fileno()).st_size
                if offset > asked_end:
                    raise PastTheEnd(f"offset {offset} is past the end of the log")
                if lines is not None and lines.tail is not None and chosen.compiled is None and not req.invert:
                    offset = lines.boundary = await _tail_start(handle, lines.tail.n, offset, asked_end)
                    lines.tail = None  # every line from there is the tail's: sent as read, none held
                if since is not None and index is not None and lines is not None:
                    offset = lines.boundary = _line_start(handle, max(offset, index.offset_since(since)), offset)
            if asked_end is not None and offset >= asked_end and req.follow:
                if lines is not None:
                    await lines.caught_up(final=False, end=offset)  # the --tail as asked is out; then, what comes
                    if _only_a_tail(req, index) and lines.resume_at == lines.boundary:
                        # nothing else reads lines: what comes is sent as read, as a reconnected follower gets it
                        # (a line at a time through the terminal reader cost tfrund a third more than bytes)
                        offset, lines = lines.resume_at, None
                asked_end = None
            data = b""
            if handle is not None:
                handle.seek(offset)
                data = handle.read(LOG_CHUNK_BYTES if asked_end is None else min(LOG_CHUNK_BYTES, asked_end - offset))
            if data:
                if lines is None:
                    await send(LogChunk(offset=offset, data=data))
                else:
                    await lines.feed(data, offset)
                offset += len(data)
                state_read, quiet_since = not req.follow, None
                continue
            if not state_read:
                # The file ends here for now. Read the job's state, then the file once more: a final job can
                # write no more, but it may have written between the read above and this state.
                current, state_read = latest(), True
                continue
            ended = current.final or not req.follow
            if ended and req.follow and settle_s > 0:
                quiet_since = quiet_since or time.monotonic()
                ended = time.monotonic() - quiet_since >= settle_s
            if lines is not None:
                await lines.caught_up(final=current.final and ended, end=offset)
            if ended:
                end = offset if lines is None else lines.resume_at
                await send(LogEnd(end, current.state, current.exit_code, restarted_as=current.restarted_as))
                return
            await grew.wait(FOLLOW_POLL_S)
            state_read = False


def _only_a_tail(req: ReadLog, index: Optional[LogIndex]) -> bool:
    """Whether a request reads lines only for its --tail: no pattern, context or inversion, no time."""
    return not req.patterns and not req.invert and not req.after and not req.before and index is None


def _line_reader(
    req: ReadLog, chosen: Selection, send: Send, path: Path, index: Optional[LogIndex], since: Optional[float]
) -> Optional[_LineReader]:
    """The line-wise reading the request asks for (patterns, --tail, times), or None: its bytes as they are."""
    if not req.patterns and req.tail is None and index is None:
        return None
    stamper = Stamper(index, path) if req.timestamps and index is not None else None
    selector = Selector(chosen.compiled, req.invert, req.after, req.before)
    plain_selection = not req.invert and not req.after and not req.before and stamper is None
    blocks = chosen.blocks if plain_selection else None
    reader = _LineReader(send, selector, req.offset, req.tail, index, since, stamper, blocks)
    if index is None:  # times read the shim's index file: that I/O stays off the loop
        reader.inline_bytes = min(_INLINE_MAX_BYTES, _INLINE_WORK // (1 + sum(len(p) for p in req.patterns)))
    return reader


async def _tail_start(handle: BinaryIO, n: int, floor: int, end: int) -> int:
    """Where the last `n` finished lines between `floor` and `end` begin, found as GNU tail does, from the end
    backwards: just after the (n+1)th newline from the end, else `floor`. So a --tail without a filter reads
    only the lines it sends and holds none, however large `n` (any count: more than the log has is all of it).
    In a worker thread: that can be a whole log's bytes."""
    if n >= end - floor:  # every line holds a byte at least: all of them
        return floor

    def work() -> int:
        pos, wanted = end, n + 1
        while pos > floor:
            step = min(LOG_CHUNK_BYTES, pos - floor)
            handle.seek(pos - step)
            block = handle.read(step)
            count = block.count(b"\n")
            if count >= wanted:
                cut = len(block)
                for _ in range(wanted):
                    cut = block.rfind(b"\n", 0, cut)
                return pos - step + cut + 1
            wanted -= count
            pos -= step
        return floor

    return await asyncio.get_running_loop().run_in_executor(_FILTERS, work)


def _line_start(handle: BinaryIO, offset: int, floor: int) -> int:
    """The start of the line that holds byte `offset`: just after the last newline before it (or `floor`)."""
    pos = offset
    while pos > floor:
        step = min(LOG_CHUNK_BYTES, pos - floor)
        handle.seek(pos - step)
        found = handle.read(step).rfind(b"\n")
        if found >= 0:
            return pos - step + found + 1
        pos -= step
    return floor


class _LineReader:
    """The line-wise side of `stream`: bytes in, passing terminal lines out, resumable at line ends."""

    def __init__(
        self,
        send: Send,
        selector: Selector,
        offset: int,
        tail: Optional[int],
        index: Optional[LogIndex] = None,
        since: Optional[float] = None,
        stamper: Optional[Stamper] = None,
        blocks: Optional[BlockMatcher] = None,
    ) -> None:
        self.send = send
        self.selector = selector
        self.terminal = TerminalLines()
        self.boundary = offset  # just after the last newline read
        self.resume_at = offset  # the boundary the client has been told about
        self.tail = Tail(tail) if tail is not None else None
        self.index = index
        self.since = since  # lines complete before this are skipped; None once a line was after it
        self.stamper = stamper
        self.blocks = blocks  # the fast path for whole blocks of plain lines, where the request allows it
        self.inline_bytes = 0  # reads up to this size are matched on the event loop (see _INLINE_WORK)

    async def feed(self, data: bytes, offset: int) -> None:
        """Take the bytes at `offset` of the log. They are matched in a worker thread (RE2 lets go of the
        GIL): a thousand long patterns can cost a third of a second per chunk, time the other clients of
        the event loop must not wait through. A small read against cheap patterns (a follower's new line)
        is matched here at once: the thread's round trip would cost it more than the match."""
        if len(data) <= self.inline_bytes:
            found = self._match(data, offset)
        else:
            found = await asyncio.get_running_loop().run_in_executor(_FILTERS, self._match, data, offset)
        if found is not None:
            await self._deliver(*found)

    def _match(self, data: bytes, offset: int) -> Optional[tuple[list[bytes], int]]:
        """(the lines of `data` that pass, the boundary after them), or None while no line is finished."""
        if self.blocks is not None and self.since is None:
            head = self.terminal.unfinished_line_ends(data)  # the rest of a line begun in an earlier read
            cut = data.rfind(b"\n") + 1
            matched = self.blocks.lines(data[head:cut]) if cut > head else None
            if matched is not None:
                passing = self._select(self.terminal.feed(data[:head]), []) + matched
                self.terminal.feed(data[cut:])
                return passing, offset + cut
        finished = self.terminal.feed(data)
        if not finished:
            return None
        ends = [offset + end for end in _line_ends(data)] if self.stamper or self.since is not None else []
        return self._select(finished, ends), offset + data.rfind(b"\n") + 1

    async def _deliver(self, passing: list[bytes], boundary: int) -> None:
        self.boundary = boundary
        if self.tail is not None:
            self.tail.add(passing)
        else:
            await self._send(passing, boundary)

    async def caught_up(self, final: bool, end: int) -> None:
        """At the end of what the file holds: release --tail's lines, and a last line without newline."""
        if self.tail is not None:
            await self._send(self.tail.release(), self.boundary)
            self.tail = None
        if final:
            last = self.terminal.pending()
            if last is not None:
                await self._send(self._select([last], [end]), end)
            self.resume_at = end

    def _select(self, finished: list[bytes], ends: list[int]) -> list[bytes]:
        """The lines to send, as UTF-8, among terminal lines `finished` (ending at `ends`, when times count)."""
        if not finished:
            return []
        if self.since is not None and self.index is not None:
            skip = 0
            for end in ends:
                when = self.index.time_at(end)
                if when is not None and when < self.since:
                    skip += 1
                else:
                    self.since = None  # times only grow along the log: every later line is wanted
                    break
            finished, ends = finished[skip:], ends[skip:]
        stamps = [self.stamper.stamp(end) for end in ends] if self.stamper is not None else None
        texts = self.selector.select([display(line) for line in finished], stamps)
        return [text.encode("utf-8", "backslashreplace") for text in texts]

    async def _send(self, lines: list[bytes], next_offset: int) -> None:
        """Send `lines`, in frames of about LOG_CHUNK_BYTES cut at line ends: a --tail may hold 64 MB, and a
        frame's payload is at most MAX_PAYLOAD_BYTES. Joined _JOIN_LINES at a time: bytes.join takes 80
        bytes per item besides, 100 MB for a tail of a million short lines. Where in the log the lines of
        a frame end is known only for the last, so the others say the position where they start (a
        follower that reconnects in the middle of a tail reads again from before it: no line is lost)."""
        for first in range(0, len(lines), _JOIN_LINES):
            data = b"\n".join(lines[first : first + _JOIN_LINES]) + b"\n"
            start = 0
            while len(data) - start > LOG_CHUNK_BYTES:
                cut = data.rfind(b"\n", start, start + LOG_CHUNK_BYTES) + 1
                if cut <= start:  # one line longer than a frame: a frame of its own
                    cut = data.find(b"\n", start + LOG_CHUNK_BYTES) + 1
                await self.send(LogLines(offset=self.resume_at, next_offset=self.resume_at, data=data[start:cut]))
                start = cut
            done = first + _JOIN_LINES >= len(lines)
            await self.send(LogLines(self.resume_at, next_offset if done else self.resume_at, data[start:]))
        if lines:
            self.resume_at = next_offset


def _line_ends(data: bytes) -> list[int]:
    """The offset just past each newline in `data`."""
    ends = []
    pos = data.find(b"\n")
    while pos >= 0:
        ends.append(pos + 1)
        pos = data.find(b"\n", pos + 1)
    return ends
