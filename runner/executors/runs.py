"""Runs: the jobs this daemon runs through its executor, started, watched and cancelled, with every change the
executor reports made into a lifecycle move.

Runs drives the lifecycle (runner/records/lifecycle.py) from the executor (runner/executors/executor.py): it
hands a scheduled job to the executor, and every change the executor reports (a job started, a job ended or is
gone) becomes a move, at once on a start and in the monitor, and at daemon start (reconcile). Neither writes a
job's state: only the lifecycle's moves do. The monitor polls only the jobs the executor says are due (locally:
a running job whose shim exited, and every running job now and then), so a job that runs quietly, or waits in
the queue, costs it nothing. (The job's *supervisor*, its parent that outlives tfrund, is the shim.)
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Sequence
from dataclasses import replace
from typing import Callable

from tfrun.constants import MONITOR_INTERVAL_S
from tfrun.protocol.fields import JobState

from ..faults import crash_point
from ..records.job import JobRow
from ..records.lifecycle import Lifecycle
from ..records.store import Store
from .executor import Change, Ended, Executor, Requeued, Started

log = logging.getLogger("tfrund")


class Runs:
    """Makes moves of what the executor sees; knows which jobs this daemon is starting, and who waits."""

    def __init__(self, store: Store, lifecycle: Lifecycle, executor: Executor) -> None:
        self.store = store
        self.lifecycle = lifecycle
        self.executor = executor
        self._starting: set[int] = set()
        self._final_events: dict[int, asyncio.Event] = {}
        # The daemon's: once a job's end (with the restart it calls for) is committed, the work outside the
        # database (building the restart, a scheduler pass).
        self.after_final: Callable[[int], None] = lambda job_id: None

    # -- starting -----------------------------------------------------------------------------------------

    async def start_job(self, row: JobRow, env: dict[str, str], grace: float) -> None:
        """Hand a scheduled job to the executor; return once it runs (recorded) or failed to start."""
        self._starting.add(row.id)
        try:
            await self.executor.launch(row, env, grace)
            await self._started(row)
        finally:
            self._starting.discard(row.id)

    async def start_array(self, rows: list[JobRow], envs: list[dict[str, str]], grace: float) -> None:
        """Hand the scheduled tasks of one array to the executor together (Slurm: one sbatch), then record
        each as `start_job` does."""
        ids = {row.id for row in rows}
        self._starting |= ids
        try:
            await self.executor.launch_array(rows, envs, grace)
            for row in rows:
                await self._started(row)
        finally:
            self._starting -= ids

    async def _started(self, row: JobRow) -> None:
        """Record what became of a job just handed over: running, ended already, or failed to start."""
        crash_point("start-spawned")
        row = self._apply_all(row, self.executor.poll([row]))
        if row.state == JobState.QUEUED:  # handed over, and yet it did not start: failed, or in a batch queue
            why = self.executor.failed_to_start(row)
            if why is not None:
                self.mark_failed(row, why)

    async def resume_queued(self) -> None:
        """At daemon start: launch jobs accepted by a daemon that died before starting them."""
        for row in self.store.list(include_final=False):
            if row.state != JobState.QUEUED or row.id in self._starting:  # a restart this daemon is preparing
                continue
            self._starting.add(row.id)
            try:
                if await self.executor.resume(row):
                    await self._started(row)
                elif not row.prepared:
                    self.mark_failed(row, "the daemon stopped while preparing it")
                elif row.gpus is not None:  # scheduled, but the daemon died before it handed the job over
                    self.store.update(row.id, gpus=None)  # so the scheduler takes it again
                # else: it waits for the scheduler, as it did
            finally:
                self._starting.discard(row.id)

    def mark_starting(self, job_id: int) -> None:
        """Mark a job as being built here (its work dir) before it is scheduled, so that nobody starts it
        twice and the monitor leaves it alone; `done_starting` unmarks it."""
        self._starting.add(job_id)

    def done_starting(self, job_id: int) -> None:
        self._starting.discard(job_id)

    def is_starting(self, job_id: int) -> bool:
        """Whether someone in this daemon is building or starting the job (not to be started twice)."""
        return job_id in self._starting

    # -- learning how jobs are doing ----------------------------------------------------------------------

    def reconcile(self) -> None:
        """At daemon start: bring every unfinished job up to date with what happened while we were away."""
        rows = self.store.list(include_final=False)
        self._apply(rows, self.executor.reconcile(rows))

    async def monitor(self) -> None:
        """Forever: poll the unfinished jobs (none being started right now) that the executor says are due,
        whenever a job was written or the executor has a reason of its own (a shim exited); then wait for
        it, at most MONITOR_INTERVAL_S (a job that started meanwhile is followed from then on)."""
        asked_at = -1  # the store's job_writes when the executor was last asked
        while True:
            if self.store.job_writes != asked_at or self.executor.looks_unasked():
                asked_at = self.store.job_writes
                rows = [r for r in self.store.list(include_final=False) if r.id not in self._starting]
                due = self.executor.due(rows)
                if due:
                    self._apply(due, self.executor.poll(due))
            await self.executor.wait(MONITOR_INTERVAL_S)

    def _apply(self, rows: Sequence[JobRow], changes: list[tuple[int, Change]]) -> None:
        """Make moves of the changes the executor saw; one job's failure does not stop the others'."""
        by_id = {row.id: row for row in rows}
        for job_id, change in changes:
            try:
                by_id[job_id] = self._move(by_id[job_id], change)
            except Exception:
                log.exception("job %d: check failed", job_id)

    def _apply_all(self, row: JobRow, changes: list[tuple[int, Change]]) -> JobRow:
        """Make moves of one job's changes; the job as left."""
        for _, change in changes:
            row = self._move(row, change)
        return row

    def _move(self, row: JobRow, change: Change) -> JobRow:
        if isinstance(change, Started):
            return self.lifecycle.start(row, **change.values())
        if isinstance(change, Requeued):  # no move: it is still running, as the same job
            log.info("job %d: %s", row.id, change.reason())
            self.store.update(row.id, reason=change.reason())
            return replace(row, reason=change.reason())
        ended = self._end(row, change)
        if change.state == JobState.LOST:
            log.warning("job %d: lost: %s", row.id, change.reason)
        elif change.exit_code is not None:
            log.info("job %d: %s (exit code %d)", row.id, change.state, change.exit_code)
        return ended

    def _end(self, row: JobRow, change: Ended) -> JobRow:
        """Make a job final through the lifecycle (one transaction with its end alerts and its restart): a
        daemon killed before the commit leaves the job unfinished, to be ended again from what the executor
        sees; one killed after it leaves all of it, and the next daemon does the folder work of a restart
        that is still queued. Then the work outside the database; the final row."""
        ended, _ = self.lifecycle.end(row, change.state, **change.values())
        crash_point("end-after-commit")
        self.executor.forget(row.id)
        self.after_final(row.id)
        self._notify_final(row.id)
        return ended

    def mark_failed(self, row: JobRow, reason: str) -> JobRow:
        """A job that never got as far as running."""
        return self._end(row, Ended(JobState.FAILED, finished_at=time.time(), reason=reason))

    # -- waiting and cancelling ---------------------------------------------------------------------------

    def _notify_final(self, job_id: int) -> None:
        event = self._final_events.pop(job_id, None)
        if event is not None:
            event.set()

    async def wait_final(self, job_id: int) -> JobRow:
        """The job's row once it is final."""
        while True:
            row = self.store.get(job_id)
            assert row is not None
            if row.final:
                return row
            event = self._final_events.setdefault(job_id, asyncio.Event())
            await event.wait()

    async def cancel(self, row: JobRow, grace: float) -> JobRow:
        """Ask the executor to stop the job, killed after `grace`; return its final row."""
        while row.id in self._starting:
            await asyncio.sleep(0.05)
        row = self.store.get(row.id) or row
        if row.final:
            return row
        ended = await self.executor.cancel(row, grace)
        if ended is not None:  # it never started
            self._end(row, ended)
        return await self.wait_final(row.id)
