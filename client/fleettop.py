"""`tfrun top --host POOL`: the jobs and GPUs of every member of a pool in one view, each job named by its
address (HOST:ID).

Each member is asked on a clock of its own (`fleet.ask_one`, the fleet timeout), and the screen is drawn
from what the members last said: a slow or dead box never holds up the others' next frame. A member that
has not answered yet is "asking", one that never answered "unreachable" with the reason, and one whose last
answer is followed by a failure keeps that last view, marked stale with its age. `--once` asks every member
at once (`fleet.ask_all`) and prints one frame.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Optional

from tfrun.client import fleet, reports
from tfrun.client.calls import watching
from tfrun.client.config import Host
from tfrun.client.top import gpus_table, job_cells, jobs_table, live_screen, state_counts
from tfrun.protocol.watching import TopReply

if TYPE_CHECKING:
    from rich.console import Console, RenderableType
    from rich.text import Text


@dataclass
class View:
    """What the screen knows of one member: its last reply and when it came, and why the last ask failed."""

    host: Host
    reply: Optional[TopReply] = None
    at: float = 0.0  # time.monotonic() of the reply
    error: Optional[str] = None  # the last ask's failure; None once an answer came after it

    def note(self, answer: fleet.Answer[TopReply]) -> None:
        if answer.reply is not None:
            self.reply, self.at, self.error = answer.reply, time.monotonic(), None
        else:
            self.error = answer.skipped or "no answer"

    def status(self) -> Optional[str]:
        """None while the view is fresh; else what is wrong with it, in words."""
        if self.error is None:
            return None if self.reply is not None else "asking"
        if self.reply is None:
            return f"unreachable ({self.error})"
        return f"stale, as of {time.monotonic() - self.at:.0f}s ago ({self.error})"


def frame(name: str, views: Sequence[View], width: int, keys: bool = False) -> RenderableType:
    """One screen: a header, a line per member that is not fresh, every member's jobs and GPUs by address;
    with `keys`, the keys it takes."""
    from rich.console import Group
    from rich.text import Text

    answering = [view for view in views if view.reply is not None]
    jobs = [(view.host.label, job, view.reply) for view in answering if view.reply for job in view.reply.jobs]
    header = Text(f"tfrun top — pool {name}  ", style="bold")
    header.append(time.strftime("%H:%M:%S"), style="dim")
    fresh = sum(view.status() is None for view in views)
    summary = state_counts([job for _, job, _ in jobs])
    header.append(f"   {fresh} of {len(views)} hosts" + (f", {summary}" if summary else ""), style="dim")
    parts: list[RenderableType] = [header]
    for view in views:
        status = view.status()
        if status is not None:
            style = "yellow" if status.startswith(("stale", "asking")) else "red"
            parts.append(Text(f"{view.host.label}: {status}", style=style))
    rows: list[list[Text]] = [
        [Text(host), Text(f"{host}:{job.id}"), *job_cells(job, reply.losses.get(str(job.id), []))]
        for host, job, reply in jobs
    ]
    parts += [Text(""), jobs_table(("HOST", "ID"), rows, width) if rows else Text("no jobs", style="dim")]
    gpus = [_gpu_row(view.host.label, cells) for view in answering if view.reply for cells in _gpus(view.reply)]
    if gpus:
        parts += [Text(""), gpus_table(("HOST",), gpus)]
    if keys:
        parts += [Text(""), Text("q: quit", style="dim")]
    return Group(*parts)


def _gpus(reply: TopReply) -> list[list[str]]:
    return [list(reports.gpu_cells(gpu)) for gpu in reply.gpus]


def _gpu_row(host: str, cells: list[str]) -> list[str]:
    """A GPU's row with its host first and its job as an address."""
    job = cells[-1]
    return [host, *cells[:-1], job if job == "-" else f"{host}:{job}"]


async def show(name: str, members: Sequence[Host], console: Console, interval: float, once: bool, wait: float,
               accept_new: bool) -> None:  # fmt: skip
    """Draw the pool's frames until `q`, Ctrl-C or SIGTERM; with `once`, one frame of every member's answer
    (or why there is none, within `wait` seconds), printed."""
    views = [View(host) for host in fleet.distinct(members)]
    if once:
        for view, answer in zip(views, await fleet.ask_all([v.host for v in views], watching.top(), wait, accept_new)):
            view.note(answer)
        console.print(frame(name, views, console.width), soft_wrap=True)  # a member's reason: one whole line
        return
    changed = asyncio.Event()

    async def poll(view: View) -> None:
        """Ask one member, again `interval` after each answer (or failure): its own clock, never the others'."""
        while True:
            view.note(await fleet.ask_one(view.host, watching.top(), wait, accept_new))
            changed.set()
            await asyncio.sleep(interval)

    pollers = [asyncio.ensure_future(poll(view)) for view in views]
    try:
        with live_screen(console) as (live, stop):
            while not stop.is_set():
                changed.clear()
                live.update(frame(name, views, console.width, keys=True), refresh=True)
                with contextlib.suppress(asyncio.TimeoutError):  # the clock and the ages move on regardless
                    await asyncio.wait_for(_either(stop, changed), interval)
    finally:
        for poller in pollers:
            poller.cancel()
        await asyncio.gather(*pollers, return_exceptions=True)


async def _either(*events: asyncio.Event) -> None:
    """Until one of `events` is set."""
    waits = [asyncio.ensure_future(event.wait()) for event in events]
    try:
        await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for waiting in waits:
            waiting.cancel()
