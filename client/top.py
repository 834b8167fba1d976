"""`tfrun top`: the box's jobs and GPUs, redrawn in place every second until `q` or Ctrl-C.

One `Top` request a frame (jobs, GPUs and each job's last losses in one round trip), so it runs the same
over SSH. The terminal is put in cbreak mode while it runs, so a single key press is seen at once, and
rich draws each frame over the last on the terminal's alternate screen, as top does: no scrolling, no
flicker, and the screen is left as it was on the way out.
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

from tfrun.client import render, reports
from tfrun.client.calls import watching
from tfrun.client.follow import DISCONNECTS, Connect, Reconnect
from tfrun.client.plot import sparkline
from tfrun.protocol.channel import Channel
from tfrun.protocol.jobs import Job
from tfrun.protocol.watching import TopReply

if TYPE_CHECKING:
    from rich.console import Console, RenderableType
    from rich.live import Live
    from rich.table import Table
    from rich.text import Text


def frame(reply: TopReply, width: int) -> RenderableType:
    """One screen: a header, the jobs with their GPUs and last loss, the GPUs with their load."""
    from rich.console import Group
    from rich.text import Text

    header = Text(f"tfrun top — {reply.host}  ", style="bold")
    header.append(time.strftime("%H:%M:%S"), style="dim")
    header.append("   " + state_counts(reply.jobs), style="dim")
    rows = []
    for label, members in render.array_groups(reply.jobs):
        if label is not None:  # an array: a row that sums its tasks up, then each task indented, as `ps` shows them
            summary = [render.array_name(members), render.array_states(members), "", "", "", ""]
            rows.append([Text(label), *map(Text, summary), Text(f"{members[0].script}, {len(members)} tasks")])
        for job in members:
            rows.append(
                [Text(f"  {job.id}" if label else str(job.id)), *job_cells(job, reply.losses.get(str(job.id), []))]
            )
    parts: list[RenderableType] = [
        header,
        Text(""),
        jobs_table(("ID",), rows, width) if rows else Text("no jobs", style="dim"),
    ]
    if reply.gpus:
        parts += [Text(""), gpus_table((), [list(reports.gpu_cells(gpu)) for gpu in reply.gpus])]
    parts += [Text(""), Text("q: quit", style="dim")]
    return Group(*parts)


def state_counts(jobs: Sequence[Job]) -> str:
    """`2 queued, 1 running`: the header's summary of the jobs shown."""
    states: dict[str, int] = {}
    for job in jobs:
        states[job.state] = states.get(job.state, 0) + 1
    return ", ".join(f"{n} {state}" for state, n in sorted(states.items()))


def job_cells(job: Job, losses: Sequence[float]) -> list[Text]:
    """A job's cells after the ones that name it (its id, or its host and address): NAME to TREND, then
    COMMAND (or why it waits)."""
    from rich.text import Text

    return [
        Text(job.name or "-"),
        Text(job.state, style=render.STATE_STYLE.get(job.state, "")),
        Text(",".join(job.gpus) or ("-" if not job.gpus_requested else f"({job.gpus_requested})")),
        Text(render.duration(render.runtime(job))),
        Text(f"{losses[-1]:.4g}" if losses else "-"),
        Text(sparkline(losses), style="cyan"),
        Text(job.waiting or render.command_line(job), style="dim" if job.waiting else ""),
    ]


def jobs_table(first: tuple[str, ...], rows: list[list[Text]], width: int) -> Table:
    """The jobs, `first` naming the columns before NAME; the command gives way to a narrow terminal: it gets
    what the other columns leave."""
    from rich.table import Table

    table = Table(box=None, pad_edge=False, header_style="bold")
    headers = (*first, "NAME", "STATE", "GPUS", "RUNTIME", "LOSS", "TREND")
    widths = [min(24, max([len(column), *(row[i].cell_len for row in rows)])) for i, column in enumerate(headers)]
    for column, column_width in zip(headers, widths):
        table.add_column(column, no_wrap=True, width=column_width, justify="right" if column == "LOSS" else "left")
    table.add_column("COMMAND", no_wrap=True, overflow="ellipsis",
                     max_width=max(10, width - sum(widths) - 2 * (len(headers) + 1)))  # fmt: skip
    for row in rows:
        table.add_row(*row)
    return table


def gpus_table(first: tuple[str, ...], rows: list[list[str]]) -> Table:
    """The GPUs with their memory, load and job, `first` naming the columns before GPU."""
    from rich.table import Table
    from rich.text import Text

    table = Table(box=None, pad_edge=False, header_style="bold")
    for column in (*first, "GPU", "NAME", "MEMORY", "USE", "JOB"):
        table.add_column(column, no_wrap=True)
    for row in rows:
        table.add_row(*(Text(cell) for cell in row))  # Text: a name is not markup
    return table


async def show(connect: Connect, console: Console, interval: float, once: bool, place: str) -> None:
    """Draw frames until `q`, Ctrl-C or SIGTERM; with `once`, print one frame and return. A connection that
    drops (a daemon restart, a link that died) is made again by itself, the last frame kept meanwhile under a
    line that says so; `q` still quits while it waits."""
    asked = watching.top()
    channel = await connect()
    try:
        if once:
            console.print(frame(await asked.on(channel), console.width))
            return
        screen = _Screen(place)
        again = Reconnect(connect, notice=screen.notice)
        with live_screen(console) as (live, stop):
            while not stop.is_set():
                try:
                    screen.last = frame(await asked.on(channel), console.width)
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
        """client/follow.py's `Notice`: an outage that outlasted the first try to reconnect, or its end."""
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
    one-box view and the pool's (client/fleettop.py)."""
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
