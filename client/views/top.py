"""`tfrun top`: the box's jobs and GPUs, redrawn in place every second until `q` or Ctrl-C.

One `Top` request a frame (jobs, GPUs and each job's last losses in one round trip), so it runs the same
over SSH. The terminal is put in cbreak mode while it runs, so a single key press is seen at once, and
rich draws each frame over the last on the terminal's alternate screen, as top does: no scrolling, no
flicker, and the screen is left as it was on the way out. A frame's rows are `ps`'s (client/views/render.py's
table), cut at the screen's edge; `--once` prints one as `ps` prints its table, whole rows in a pipe.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import sys
import termios
import time
import tty
from collections.abc import Awaitable, Iterator, Sequence
from typing import TYPE_CHECKING, Callable, Optional

from tfrun.protocol.channel import Channel
from tfrun.protocol.jobs import Job
from tfrun.protocol.watching import TopReply

from ..calls import watching
from ..link.follow import DISCONNECTS, Connect, Reconnect
from . import render, reports
from .plot import sparkline
from .styled import Styled

if TYPE_CHECKING:
    from rich.console import Console, RenderableType
    from rich.live import Live

    from .styled import Output


_JOB_COLUMNS = ("NAME", "STATE", "GPUS", "RUNTIME", "LOSS", "TREND", "COMMAND")  # after those naming the job
_TERMINAL_CELLS = 24  # on a terminal a cell before COMMAND is cut to this: the loss and its trend stay in view


def frame_lines(reply: TopReply, terminal: bool) -> list[Styled]:
    """One frame: a header, the jobs with their GPUs and last loss, the GPUs with their load. Rows as `ps`
    has them: whole (in a pipe, `top --once | grep` finds a job's row, however long), and on a `terminal`
    with each cell before the command cut to a width that keeps the rest of the row in view."""
    rows: list[list[Styled]] = []
    for label, members in render.array_groups(reply.jobs):
        if label is not None:  # an array: a row that sums its tasks up, then each task indented, as `ps` shows them
            summary = [render.array_name(members), render.array_states(members), "", "", "", ""]
            tasks = f"{members[0].script}, {len(members)} tasks"
            rows.append([_cell(label), *map(_cell, summary), _cell(tasks)])
        for job in members:
            rows.append([_cell(f"  {job.id}" if label else str(job.id)),
                         *job_cells(job, reply.losses.get(str(job.id), []))])  # fmt: skip
    lines = [header(reply.host, reply.jobs, ""), Styled()]
    lines += jobs_lines(("ID",), rows, terminal) if rows else [Styled("no jobs", "dim")]
    if reply.gpus:
        lines += [Styled(), *reports.gpu_lines((), [reports.gpu_cells(gpu) for gpu in reply.gpus])]
    return lines


def header(where: str, jobs: Sequence[Job], more: str) -> Styled:
    """`tfrun top — box  12:03:04   1 queued, 2 running`: the frame's first line, `more` before the counts."""
    line = Styled(f"tfrun top — {render.one_line(where)}  ", "bold")
    line.append(time.strftime("%H:%M:%S"), "dim")
    counts = state_counts(jobs)
    line.append(f"   {more}{', ' if more and counts else ''}{counts}", "dim")
    return line


def state_counts(jobs: Sequence[Job]) -> str:
    """`2 queued, 1 running`: the header's summary of the jobs shown."""
    states: dict[str, int] = {}
    for job in jobs:
        states[job.state] = states.get(job.state, 0) + 1
    return ", ".join(f"{n} {state}" for state, n in sorted(states.items()))


def job_cells(job: Job, losses: Sequence[float]) -> list[Styled]:
    """A job's cells after the ones that name it (its id, or its host and address): NAME to TREND, then
    COMMAND (or why it waits)."""
    return [
        _cell(job.name or "-"),
        _cell(job.state, render.STATE_STYLE.get(job.state, "")),
        _cell(",".join(job.gpus) or ("-" if not job.gpus_requested else f"({job.gpus_requested})")),
        _cell(render.duration(render.runtime(job))),
        _cell(f"{losses[-1]:.4g}" if losses else "-"),
        _cell(sparkline(losses), "cyan"),
        _cell(job.waiting or render.command_line(job), "dim" if job.waiting else ""),
    ]


def _cell(text: str, style: str = "") -> Styled:
    """A cell of a job's or a GPU's row: one line whatever a name or an argument holds (render.one_line)."""
    return Styled(render.one_line(text), style)


def jobs_lines(first: tuple[str, ...], rows: list[list[Styled]], terminal: bool) -> list[Styled]:
    """The jobs' table, `first` naming the columns before NAME; on a `terminal` each cell but the command's
    cut to a few words' width, so that a long name leaves the state, the loss and its trend on screen."""
    if terminal:
        for row in rows:
            for cell in row[:-1]:
                cell.truncate(_TERMINAL_CELLS)
    return render.table_lines((*first, *_JOB_COLUMNS), rows, right=("LOSS",))


def on_screen(lines: Sequence[Styled], keys: bool) -> RenderableType:
    """`lines` as rich draws them on the live screen: each cut with … at the terminal's right edge, never
    wrapped (a row stays a row, as in `ps`); with `keys`, the keys it takes below them."""
    from rich.console import Group
    from rich.text import Text

    shown = [*lines, Styled(), Styled("q: quit", "dim")] if keys else lines
    texts = []
    for line in shown:
        text = Text(style=line.style, no_wrap=True, overflow="ellipsis")
        for piece, style in line.pieces:
            text.append(piece, style or None)
        texts.append(text)
    return Group(*texts)


async def print_once(connect: Connect, out: Output) -> None:
    """`top --once`: one frame, printed as `ps` prints its table (whole rows in a pipe, cut on a terminal)."""
    channel = await connect()
    try:
        reply = await watching.top().on(channel)
    finally:
        channel.close()
    out.write(*frame_lines(reply, out.terminal), cut=True)


async def show(connect: Connect, console: Console, interval: float, place: str) -> None:
    """Draw frames until `q`, Ctrl-C or SIGTERM. A connection that drops (a daemon restart, a link that died)
    is made again by itself, the last frame kept meanwhile under a line that says so; `q` still quits while
    it waits."""
    asked = watching.top()
    channel = await connect()
    try:
        screen = _Screen(place)
        again = Reconnect(connect, notice=screen.notice)
        with live_screen(console) as (live, stop):
            while not stop.is_set():
                try:
                    screen.last = on_screen(frame_lines(await asked.on(channel), terminal=True), keys=True)
                except DISCONNECTS as exc:
                    channel.close()
                    found = await _reconnect(again.after(exc), stop, lambda: live.update(screen.outage(), refresh=True))
                    if found is None:
                        return
                    channel = found
                    continue
                live.update(screen.last, refresh=True)
                with contextlib.suppress(asyncio.TimeoutError):
                    await asyncio.wait_for(stop.wait(), interval)
    finally:
        channel.close()


class _Screen:
    """What `top` shows: the last frame, and while the connection is down, that frame under a line saying so."""

    def __init__(self, place: str) -> None:
        from rich.text import Text

        self.place = place
        self.last: RenderableType = Text("")
        self.line = ""

    def notice(self, down: bool, why: str) -> None:
        """client/link/follow.py's `Notice`: an outage that outlasted the first try to reconnect, or its end."""
        why = f" ({why})" if why else ""
        self.line = f"lost the connection to {self.place}{why}; trying again (jobs run on)" if down else ""

    def outage(self) -> RenderableType:
        from rich.console import Group
        from rich.text import Text

        line = self.line or f"the connection to {self.place} dropped; connecting again"
        return Group(Text(line, style="bold red"), self.last)


async def _reconnect(reconnect: Awaitable[Channel], stop: asyncio.Event, draw: Callable[[], None]) -> Optional[Channel]:
    """The channel `reconnect` makes, or None if `stop` (q, Ctrl-C) comes first; `draw` every second meanwhile,
    so that the outage's line reaches the screen."""
    task = asyncio.ensure_future(reconnect)
    try:
        while not task.done() and not stop.is_set():
            draw()
            await asyncio.wait([task], timeout=1)
        if stop.is_set():
            return None
        return task.result()
    finally:
        if not task.done():
            task.cancel()
        elif stop.is_set() and not task.cancelled() and task.exception() is None:
            task.result().close()


@contextlib.contextmanager
def live_screen(console: Console) -> Iterator[tuple[Live, asyncio.Event]]:
    """The alternate screen to draw frames on, and the event that `q`, Ctrl-C or SIGTERM sets; shared by the
    one-box view and the pool's (client/pools/top.py)."""
    from rich.live import Live

    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    with _keys(loop, stop), Live(console=console, screen=True, auto_refresh=False) as live:
        yield live, stop


@contextlib.contextmanager
def _keys(loop: asyncio.AbstractEventLoop, stop: asyncio.Event) -> Iterator[None]:
    """While the block runs: `q` (or Q) sets `stop`; the terminal sees keys one at a time, unechoed."""
    fd = sys.stdin.fileno()
    if not os.isatty(fd):
        yield
        return
    saved = termios.tcgetattr(fd)
    tty.setcbreak(fd)

    def pressed() -> None:
        if b"q" in os.read(fd, 64).lower():
            stop.set()

    loop.add_reader(fd, pressed)
    try:
        yield
    finally:
        loop.remove_reader(fd)
        termios.tcsetattr(fd, termios.TCSADRAIN, saved)
