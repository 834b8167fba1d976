"""`tfrun top --host POOL`: the jobs and GPUs of every member of a pool in one view, each job named by its
address (HOST:ID).

Each member is asked on a clock of its own (`ask_one`, the member wait), and the screen is drawn
from what the members last said: a slow or dead box never holds up the others' next frame. A member that
has not answered yet is "asking", one that never answered "unreachable" with the reason, and one whose last
answer is followed by a failure keeps that last view, marked stale with its age. `--once` asks every member
at once (`ask_all`) and prints one frame, as `ps --host POOL` prints its table.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Optional

from tfrun.protocol.watching import Gpu, TopReply

from ..calls import watching
from ..config.settings import Host
from ..views import render, reports
from ..views.styled import Styled
from ..views.top import header, job_cells, jobs_lines, live_screen, on_screen
from .members import Answer, ask_all, ask_one, distinct

if TYPE_CHECKING:
    from rich.console import Console

    from ..views.styled import Output


@dataclass
class View:
    """What the screen knows of one member: its last reply and when it came, and why the last ask failed."""

    host: Host
    reply: Optional[TopReply] = None
    at: float = 0.0  # time.monotonic() of the reply
    error: Optional[str] = None  # the last ask's failure; None once an answer came after it

    def note(self, answer: Answer[TopReply]) -> None:
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


def frame_lines(name: str, views: Sequence[View], terminal: bool) -> list[Styled]:
    """One frame: a header, a line per member that is not fresh, every member's jobs and GPUs by address.
    Rows as `ps --host POOL` has them: whole in a pipe; on a `terminal`, cells cut as top.jobs_lines says."""
    answering = [view for view in views if view.reply is not None]
    jobs = [(view.host.label, job, view.reply) for view in answering if view.reply for job in view.reply.jobs]
    fresh = sum(view.status() is None for view in views)
    lines = [header(f"pool {name}", [job for _, job, _ in jobs], f"{fresh} of {len(views)} hosts")]
    for view in views:
        status = view.status()
        if status is not None:  # a member's reason: one whole line
            style = "yellow" if status.startswith(("stale", "asking")) else "red"
            lines.append(Styled(render.one_line(f"{view.host.label}: {status}"), style))
    rows: list[list[Styled]] = [
        [Styled(host), Styled(f"{host}:{job.id}"), *job_cells(job, reply.losses.get(str(job.id), []))]
        for host, job, reply in jobs
    ]
    lines += [Styled(), *jobs_lines(("HOST", "ID"), rows, terminal)] if rows else [Styled(), Styled("no jobs", "dim")]
    gpus = [_gpu_row(view.host.label, gpu) for view in answering if view.reply for gpu in view.reply.gpus]
    if gpus:
        lines += [Styled(), *reports.gpu_lines(("HOST",), gpus)]
    return lines


def _gpu_row(host: str, gpu: Gpu) -> list[str]:
    """A GPU's row with its host first and its job as an address (one held outside tfrun says by whom)."""
    cells = reports.gpu_cells(gpu)
    return [host, *cells[:-1], cells[-1] if gpu.job is None else f"{host}:{gpu.job}"]


async def print_once(name: str, members: Sequence[Host], out: Output, wait: float, accept_new: bool) -> None:
    """`top --host POOL --once`: one frame of every member's answer (or why there is none, within `wait`
    seconds), printed as `ps` prints its table."""
    views = [View(host) for host in distinct(members)]
    for view, answer in zip(views, await ask_all([v.host for v in views], watching.top(), wait, accept_new)):
        view.note(answer)
    out.write(*frame_lines(name, views, out.terminal), cut=True)


async def show(name: str, members: Sequence[Host], console: Console, interval: float, wait: float,
               accept_new: bool) -> None:  # fmt: skip
    """Draw the pool's frames until `q`, Ctrl-C or SIGTERM."""
    views = [View(host) for host in distinct(members)]
    changed = asyncio.Event()

    async def poll(view: View) -> None:
        """Ask one member, again `interval` after each answer (or failure): its own clock, never the others'."""
        while True:
            view.note(await ask_one(view.host, watching.top(), wait, accept_new))
            changed.set()
            await asyncio.sleep(interval)

    pollers = [asyncio.ensure_future(poll(view)) for view in views]
    try:
        with live_screen(console) as (live, stop):
            while not stop.is_set():
                changed.clear()
                live.update(on_screen(frame_lines(name, views, terminal=True), keys=True), refresh=True)
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
