"""Where `tfrun submit --host POOL` puts a job: on the member that can start it soonest.

Each member's figures come from one `Top` request (its unfinished jobs and its GPUs, with the job holding
each, or who holds it outside that daemon: another user's job, a process outside tfrun), asked of all at once
(client/pools/members.py). A GPU held outside the daemon is not free. The rule, in order:

1. A box that can start it now: N GPUs free and nothing queued (a queued job is ahead of ours). Among
   those, the most free GPUs first: jobs spread over the boxes rather than crowd one, and the box with room
   to spare stays the one a bigger job finds free.
2. Else the shortest queue: the box where fewest jobs wait before ours.
3. Ties: fewest running jobs, then the host's name.

N is --gpus, else the GPUs the box gives a job without it: its daemon's default_gpus (`tfrun config`), which
is 1 on a box with GPUs and 0 on one without unless set. A box with fewer GPUs than N in all can never start it
and is left out.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Optional

from tfrun.protocol.fields import JobState
from tfrun.protocol.watching import TopReply

from ..config.settings import Host


@dataclass
class Figures:
    """What placement knows of one member."""

    host: Host
    free: int
    total: int
    running: int
    queued: int
    default_gpus: int  # what a job without --gpus gets here
    outside: tuple[str, ...] = ()  # who holds each GPU held outside its daemon (not free, and no job of its)

    @classmethod
    def of(cls, host: Host, reply: TopReply) -> Figures:
        states = [job.state for job in reply.jobs]
        free = sum(gpu.job is None and gpu.held_by is None for gpu in reply.gpus)  # not another daemon's either
        default = reply.default_gpus if reply.default_gpus is not None else int(len(reply.gpus) > 0)  # older daemon
        running, queued = states.count(JobState.RUNNING), states.count(JobState.QUEUED)
        outside = tuple(gpu.held_by for gpu in reply.gpus if gpu.job is None and gpu.held_by is not None)
        return cls(host, free, len(reply.gpus), running, queued, default, outside)

    def wanted(self, gpus: Optional[int]) -> int:
        """The GPUs the job would get on this box."""
        return gpus if gpus is not None else self.default_gpus

    def starts_now(self, gpus: Optional[int]) -> bool:
        return self.free >= self.wanted(gpus) and self.queued == 0

    def line(self) -> str:
        held = f" ({len(self.outside)} held outside its tfrund, by {'; '.join(self.outside)})" if self.outside else ""
        return f"{self.free} of {self.total} GPUs free{held}, {self.running} running, {self.queued} queued"


@dataclass
class Choice:
    """The chosen member and why, in words."""

    figures: Figures
    why: str


def choose(members: Sequence[Figures], gpus: Optional[int]) -> Optional[Choice]:
    """The member that can start a job of `gpus` GPUs soonest (see the module's rule); None if none can."""
    able = [m for m in members if m.total >= m.wanted(gpus)]
    now = [m for m in able if m.starts_now(gpus)]
    if now:
        best = min(now, key=lambda m: (-m.free, m.running, m.host.label))
        if best.wanted(gpus) == 0 and best.total:  # its default_gpus is 0: the GPUs free do not matter
            return Choice(best, "it can start now: a job without --gpus gets no GPU there (its default_gpus is 0)")
        return Choice(best, f"it can start now, with the most GPUs free ({best.free} of {best.total})")
    if able:
        best = min(able, key=lambda m: (m.queued, m.running, m.host.label))
        return Choice(best, f"no box can start it now; it has the shortest queue ({best.queued} queued)")
    return None
