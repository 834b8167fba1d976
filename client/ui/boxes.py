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

from tfrun.protocol.channel import Channel, RemoteError
from tfrun.protocol.jobs import Job
from tfrun.protocol.wire import ProtocolError

from ..config import settings as config
from ..config.settings import Host
from ..errors import TfrunError
from ..library.asyncclient import AsyncClient
from ..link.connection import Target

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
        return await self._within(self.client.session(action), wait)

    async def opened(self) -> Channel:
        """A connection the caller keeps for its looks (`ask_on`) and closes: a look a second on a connection
        of its own cost tfrund its accept, hello and close each time."""
        return await self._within(self.client.connect(), ASK_S)

    async def ask_on(self, channel: Channel, action: Callable[[Channel], Awaitable[T]]) -> T:
        """`action` on the caller's connection (`opened`), within ASK_S; failures as `ask`'s."""
        return await self._within(action(channel), ASK_S)

    async def _within(self, work: Awaitable[T], wait: float) -> T:
        try:
            return await asyncio.wait_for(work, wait)
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
        "array_id": job.array_id,  # the tasks of an array: compared in one click
        "array_index": job.array_index,
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
        "waiting": job.waiting,
        "now": time.time(),
    }
