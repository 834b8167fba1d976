"""Slurm's answers off the daemon's event loop: one `squeue` (and `sacct` for the jobs it no longer lists)
at a time, in a thread of its own, so that a slurmctld that hangs (each command has a 15 s timeout) never
stalls the daemon. The executor's look hands out each answer once (`take`) and starts the next one when it
is due: at most every POLL_INTERVAL_S, the interval doubled (up to MAX_BACKOFF_S) while squeue is slow or
fails. No answer yet, or a failed one, is no answer at all: never proof that a job ended.

A long answer is asked for less often: at most LISTED_PER_S jobs listed a second, on average. squeue's work,
slurmctld's and the daemon's grow with the jobs listed (held ones too), so this keeps the cost of watching a
queue of a thousand jobs that of a hundred (a job's start or Slurm's end of it is then learnt up to
1,000 / LISTED_PER_S s later; an end the job's exit record tells is still seen at once).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Callable, Optional

from .commands import AccountedJob, QueuedJob, Slurm, SlurmError

log = logging.getLogger("tfrund")

POLL_INTERVAL_S = 1.0  # squeue at most this often (the monitor looks every 0.2 s)
MAX_BACKOFF_S = 30.0
SLOW_S = 2.0  # an squeue slower than this doubles the interval
LISTED_PER_S = 200.0  # squeue's lines a second at most, on average (the interval grows with its answer)


@dataclass(frozen=True)
class Snapshot:
    """squeue's answer (every job it lists) and sacct's for the asked jobs squeue did not list; `asked_at`:
    when squeue was asked (time.time()), so that what a job's folder says since is not read as older."""

    queue: dict[str, QueuedJob]
    accounted: dict[str, AccountedJob] = field(default_factory=dict)
    asked_at: float = 0.0


class Watcher:
    """Takes snapshots in the background, one at a time; `take` hands each out once."""

    def __init__(self, slurm: Slurm) -> None:
        self.slurm = slurm
        self._lock = threading.Lock()
        self._fresh: Optional[Snapshot] = None
        self._busy = False
        self._next = 0.0
        self._interval = POLL_INTERVAL_S

    def take(self, slurm_ids: Callable[[], Sequence[str]]) -> Optional[Snapshot]:
        """The snapshot taken since the last call, if any; never waits. Starts the next one (sacct asked
        about the ids `slurm_ids()` gives that squeue does not list) if it is due, none is being taken, and
        there are any: they are listed only then, at most every POLL_INTERVAL_S, not at every poll."""
        with self._lock:
            fresh, self._fresh = self._fresh, None
            start = not self._busy and time.monotonic() >= self._next
            self._busy = self._busy or start
        if start:
            ids = list(slurm_ids())
            if ids:
                threading.Thread(target=self._refresh, args=(ids,), name="tfrund-squeue", daemon=True).start()
            else:
                with self._lock:
                    self._busy = False
        return fresh

    def now(self, slurm_ids: Sequence[str]) -> Optional[Snapshot]:
        """A snapshot taken now, waiting for it (at daemon start, before any client is served)."""
        return self._ask(list(slurm_ids))

    def _refresh(self, slurm_ids: list[str]) -> None:
        snapshot = None
        try:
            snapshot = self._ask(slurm_ids)
        except Exception:
            log.exception("squeue: the look failed")
        finally:
            with self._lock:
                self._busy = False
                if snapshot is not None:
                    self._fresh = snapshot

    def _ask(self, slurm_ids: list[str]) -> Optional[Snapshot]:
        """squeue, then sacct for the jobs it does not list; None if squeue failed. The next one is due after
        the interval, doubled while slow or failing."""
        began, asked_at = time.monotonic(), time.time()
        try:
            queue: Optional[dict[str, QueuedJob]] = self.slurm.queue()
        except SlurmError as exc:
            log.warning("squeue: %s; no change assumed, asking again in %.0fs", exc, self._interval * 2)
            queue = None
        took = time.monotonic() - began
        ok = queue is not None and took < SLOW_S
        self._interval = steady_interval(len(queue)) if ok and queue is not None else backoff(self._interval)
        self._next = time.monotonic() + self._interval
        if queue is None:
            return None
        missing = [i for i in slurm_ids if i not in queue]
        return Snapshot(queue, (self.slurm.accounting(missing) or {}) if missing else {}, asked_at)


def steady_interval(listed: int) -> float:
    """The wait after an answer that listed `listed` jobs: POLL_INTERVAL_S, longer for a long answer."""
    return min(MAX_BACKOFF_S, max(POLL_INTERVAL_S, listed / LISTED_PER_S))


def backoff(interval: float) -> float:
    """The wait after a slow or failed answer: the last one doubled, up to MAX_BACKOFF_S."""
    return min(MAX_BACKOFF_S, interval * 2)


def in_thread(name: str, work: Callable[[], None]) -> None:
    """Run `work` in a thread of its own, logging its failure (a Slurm command the loop must not wait for)."""

    def run() -> None:
        try:
            work()
        except SlurmError as exc:
            log.warning("%s: %s", name, exc)
        except Exception:
            log.exception("%s failed", name)

    threading.Thread(target=run, name=f"tfrund-{name}", daemon=True).start()
