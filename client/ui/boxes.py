"""The boxes a `tfrun ui` shows, and what it asks each: a page of jobs, a job, its metrics, an action.

Each box is reached as every verb reaches it, through `AsyncClient` (the local daemon over its socket, a
box through the connection keeper), and every request has a deadline: a box that does not answer within it
is a box that is down, said in the words the CLI would use, and the other boxes' rows are shown regardless.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Sequence
from dataclasses import dataclass, field
from typing import Any, Callable, Optional, TypeVar

from tfrun.client import config
from tfrun.client.asyncclient import AsyncClient
from tfrun.client.calls import jobs as job_calls
from tfrun.client.calls import watching as watch_calls
from tfrun.client.config import Host
from tfrun.client.connection import Target
from tfrun.client.errors import TfrunError
from tfrun.losses import training_loss_name
from tfrun.protocol.channel import Channel, RemoteError
from tfrun.protocol.jobs import Job
from tfrun.protocol.watching import MetricSample
from tfrun.protocol.wire import ProtocolError

T = TypeVar("T")

PAGE = 50  # jobs a page of the jobs table shows
ASK_S = 10.0  # the most a request to one box may take before that box is shown as down
LOSSES = 30  # last losses a row draws its trend from


class Unreachable(Exception):
    """A box that did not answer: the reason in the user's words (`no answer within 10s`, ssh's own)."""


@dataclass
class Box:
    """One daemon the page shows: `name` in its URLs (a configured host's name, or `local`)."""

    name: str
    client: AsyncClient
    # losses of ended jobs, which never change: asked once a job (by id), not at each refresh
    ended_losses: dict[int, list[float]] = field(default_factory=dict)

    async def ask(self, action: Callable[[Channel], Awaitable[T]], wait: float = ASK_S) -> T:
        """`action` on a connection of its own within `wait` seconds; every way it fails is `Unreachable`,
        in words, except a refusal of the daemon's (RemoteError: no such job, a job that cannot be cancelled),
        which the page shows as such."""
        try:
            return await asyncio.wait_for(self.client.session(action), wait)
        except asyncio.TimeoutError:
            raise Unreachable(f"no answer within {wait:g}s") from None
        except RemoteError:  # NoSuchJob too: the daemon's own word
            raise
        except TfrunError as exc:
            raise Unreachable(exc.message) from None
        except ProtocolError as exc:
            raise Unreachable(f"talking to tfrund failed: {exc}") from None
        except OSError as exc:
            raise Unreachable(exc.strerror or str(exc)) from None


def boxes(hosts: Optional[Sequence[Host]], local: bool, accept_new: bool) -> list[Box]:
    """The boxes to show: `hosts` as --host or --pool named them, else this machine's daemon (`local`) and
    every configured host. A box's connection keeper is started with a deadline of its own."""
    chosen = list(hosts) if hosts is not None else [host for _, host in sorted(config.load().hosts.items())]
    found = [Box(config.LOCAL, AsyncClient(Target(None)))] if local else []
    seen = set()
    for host in chosen:
        if host.identity not in seen:  # two names for one daemon would list its jobs twice
            seen.add(host.identity)
            found.append(Box(host.label, AsyncClient(Target(host, accept_new, ASK_S))))
    return found


# -- what a page shows of a job ---------------------------------------------------------------------------------


def row(box: str, job: Job, losses: Sequence[float]) -> dict[str, Any]:
    """A job as a row of the jobs table: nothing of its environment, its command or its folders."""
    return {
        "box": box,
        "id": job.id,
        "name": job.name or "",
        "state": job.state,
        "created_at": job.created_at,
        "started_at": job.started_at,
        "finished_at": job.finished_at,
        "gpus": job.gpus,
        "loss": losses[-1] if losses else None,
        "losses": list(losses),
        "reason": job.reason,
    }


def record(box: str, job: Job) -> dict[str, Any]:
    """A job as its page shows it: the row, and its command, the NAMES of its --env (never their values: a
    token passed with --env must not reach a page, its cache or a screenshot), its snapshot and its cause."""
    return {
        **row(box, job, ()),
        "script": job.script,
        "args": job.args,
        "command": job.command,
        "env_names": sorted(job.env),
        "exit_code": job.exit_code,
        "signal": job.signal,
        "cause": job.cause,
        "git_commit": job.git_commit,
        "git_dirty": job.git_dirty,
        "source": job.source,
        "restart_of": job.restart_of,
        "restarted_as": job.restarted_as,
        "array_id": job.array_id,
        "array_index": job.array_index,
        "waiting": job.waiting,
        "now": time.time(),
    }


def losses_of(samples: Sequence[MetricSample]) -> list[float]:
    """The training loss of each sample that has one (tfrun/losses.py's rule, as `top` and alerts use)."""
    found = []
    for sample in samples:
        name = training_loss_name(sample.values)
        if name is not None:
            found.append(sample.values[name])
    return found


# -- a page of every box's jobs ---------------------------------------------------------------------------------


async def page_of(box: Box, page: int) -> tuple[list[dict[str, Any]], int]:
    """The box's newest `page` * PAGE jobs as rows with their last losses, and how many older ones it has.

    The listing's `last` is the protocol's paging: page 1 of a box with 10,000 ended jobs asks for 50 of
    them. Running jobs' losses come in one `Top` round trip; an ended job's are asked once and kept."""

    async def asking(channel: Channel) -> tuple[list[dict[str, Any]], int]:
        listed = await job_calls.job_list(all=True, last=page * PAGE).on(channel)
        jobs = listed.jobs[max(0, len(listed.jobs) - page * PAGE) :]  # an older tfrund sends every job
        older = listed.older + len(listed.jobs) - len(jobs)
        running = (await watch_calls.top(recent=0, losses=LOSSES).on(channel)).losses
        rows = []
        for job in jobs:
            if str(job.id) in running:
                losses = list(running[str(job.id)])
            elif job.finished_at is not None:
                losses = await _ended_losses(box, job, channel)
            else:
                losses = []
            rows.append(row(box.name, job, losses))
        return rows, older

    return await box.ask(asking)


async def _ended_losses(box: Box, job: Job, channel: Channel) -> list[float]:
    """An ended job's last losses, asked of its daemon the first time only."""
    if job.id not in box.ended_losses:
        reply = await watch_calls.metrics(str(job.id), LOSSES).on(channel)
        box.ended_losses[job.id] = losses_of(reply.samples)
    return box.ended_losses[job.id]


async def every_page(boxes: Sequence[Box], page: int) -> dict[str, Any]:
    """Page `page` (from 1) of every box's jobs, newest first, and each box's state: `up`, or why it is
    down. Each box contributes its newest page * PAGE jobs, so the slice of the merged list is exact."""
    answers = await asyncio.gather(*(_answer(box, page) for box in boxes))
    rows: list[dict[str, Any]] = []
    states = {}
    older = 0
    for box, (found, count, down) in zip(boxes, answers):
        rows += found
        older += count
        states[box.name] = {"up": down is None, "why": down}
    rows.sort(key=lambda shown: (shown["created_at"], shown["id"]), reverse=True)
    more = len(rows) > page * PAGE or older > 0
    return {"page": page, "rows": rows[(page - 1) * PAGE : page * PAGE], "boxes": states, "more": more}


async def _answer(box: Box, page: int) -> tuple[list[dict[str, Any]], int, Optional[str]]:
    try:
        rows, older = await page_of(box, page)
        return rows, older, None
    except Unreachable as exc:
        return [], 0, str(exc)
    except RemoteError as exc:
        return [], 0, exc.message
