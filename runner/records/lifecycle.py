"""A job's states and the moves between them, written down once (MOVES), and the Lifecycle, the only code
that moves a job from one state to another.

Each move is one SQLite transaction through the store, made only if the job is still in the state the
caller holds it in (a move from a state it has left is refused, as is any move not in MOVES: nothing is
written and ForbiddenMove names the move). The row a move wrote is returned, so nobody reads the database
again to learn what they just wrote. A job's end also records, in the same transaction, that its end
alerts are due, why it failed (its cause: lost, oom, signal, error) and the restart its `--max-restarts`
and `--restart-on` call for, with the new job: a daemon killed at any point leaves all of that or none of it
(runner/faults.py crash points let the tests check).

The cause is decided here alone (`end_cause`), from all there is to know when the end is recorded; everyone
else reads it: the restart policy below, `tfrun status`, and the alert watch, whose `oom` alert at a job's end
is the cause read (runner/alerts/watch.py), never a judgment of its own.

The moves, as ARCHITECTURE.md's table gives them with when and where each is made:

    (new)    -> queued                                       create, create_array, rerun
    queued   -> running                                      start: its shim wrote shim.json
    queued   -> succeeded, failed, cancelled, lost           end: before its start was recorded (an exit
                                                             record already, a failure to start, a cancel,
                                                             a reboot)
    running  -> succeeded, failed, cancelled, lost           end

succeeded, failed, cancelled and lost are final: nothing moves a job out of them.
"""

from __future__ import annotations

import logging
import signal
from collections.abc import Mapping
from dataclasses import replace
from pathlib import Path
from typing import Any, Callable, Optional

from tfrun import restarts
from tfrun.protocol.fields import Cause, JobState, State

from ..faults import crash_point
from ..shim import jobdir
from . import oom
from .job import JobRow, JobSpec
from .store import Store

log = logging.getLogger("tfrund")

_ENDS: tuple[State, ...] = (JobState.SUCCEEDED, JobState.FAILED, JobState.CANCELLED, JobState.LOST)

MOVES: Mapping[Optional[State], tuple[State, ...]] = {
    None: (JobState.QUEUED,),  # a submit, or a restart of an ended job
    JobState.QUEUED: (JobState.RUNNING, *_ENDS),
    JobState.RUNNING: _ENDS,
    JobState.SUCCEEDED: (),
    JobState.FAILED: (),
    JobState.CANCELLED: (),
    JobState.LOST: (),
}
"""Every move a job makes: its state (None: not yet a job) to the states it may move to."""


class ForbiddenMove(Exception):
    """A move not in MOVES, or from a state the job is no longer in; nothing was written."""

    def __init__(self, job_id: int, old: Optional[str], new: str, actual: Optional[str] = None) -> None:
        was = "(new)" if old is None else old
        now = "" if actual is None or actual == old else f" (it is {actual})"
        super().__init__(f"job {job_id}: {was} -> {new} is not a move a job can make{now}")
        self.job_id, self.old, self.new, self.actual = job_id, old, new, actual


def allowed(old: Optional[State], new: State) -> bool:
    """Whether MOVES lets a job in state `old` (None: a new one) move to `new`."""
    return new in MOVES.get(old, ())


class Lifecycle:
    """Creates jobs and moves them between states, through the store, one transaction a move."""

    def __init__(self, store: Store, jobs_dir: Path, checkpoint_root: Callable[[], Path]) -> None:
        self.store = store
        self.jobs_dir = jobs_dir
        self.checkpoint_root = checkpoint_root  # the config's, read when a job is made (a reload changes it)

    def create(self, name: Optional[str], spec: JobSpec, submission_id: Optional[str] = None) -> JobRow:
        """A new queued job, its folder made. Inside a caller's transaction it is part of that one (a submit
        stores the job's alert settings with it)."""
        return self.store.create_job(name, spec, self.jobs_dir, self.checkpoint_root(), submission_id=submission_id)

    def create_array(
        self, tasks: list[tuple[Optional[str], JobSpec]], submission_id: Optional[str] = None
    ) -> list[JobRow]:
        """The queued tasks of an array, from (name, spec) in index order, their folders made, in one
        transaction (or the caller's): a daemon killed half way leaves all of them or none. The first task's
        id is the array's; it alone carries the submission id (a submit sent again finds the array by it)."""
        rows: list[JobRow] = []
        with self.store.transaction():
            for index, (name, spec) in enumerate(tasks):
                first = rows[0].id if rows else None
                sid = None if rows else submission_id
                row = self.store.create_job(name, spec, self.jobs_dir, self.checkpoint_root(), None, sid, index, first)
                rows.append(row)
        return rows

    def rerun(self, row: JobRow, restarts_left: Optional[int] = None) -> JobRow:
        """The queued job that runs `row` again (same spec, alert settings and checkpoint folder); `row`
        records it as its restart, in memory too; with `restarts_left`, an automatic restart (counted in its
        spec's `restarts`). One transaction, or part of the one that ends `row`, so whoever waits for `row`
        learns of the new job at once, and a daemon killed at any point leaves both or neither. Its work dir
        is built later (Scheduler.build_restart), which a new daemon redoes."""
        spec = row.spec.rerun(row.id, restarts_left)
        with self.store.transaction():
            new = self.store.create_job(
                row.name, spec, self.jobs_dir, self.checkpoint_root(), Path(row.checkpoint_dir),
                array_index=row.array_index, array_id=row.array_id,
            )  # fmt: skip
            settings = self.store.job_alerts(row.id)
            if settings is not None:
                self.store.set_job_alerts(new.id, *settings)
            self.store.update(row.id, restarted_as=new.id)
        row.restarted_as = new.id
        return new

    def start(self, row: JobRow, **values: Any) -> JobRow:
        """queued -> running, with its shim's identity (`values`); the row as written."""
        return self._move(row, JobState.RUNNING, values)

    def end(self, row: JobRow, state: State, **values: Any) -> tuple[JobRow, Optional[JobRow]]:
        """Make a job final, in one transaction with what its end calls for: its cause (`end_cause`, which weighs
        the executor's word in `values` with the rest), its end alerts are due (the watch stores them once it has
        read the rest of the log), and a job that failed or was lost for a cause of its --restart-on, with
        restarts left, runs again as a new job. The row as written, and the restart if one was made. A
        daemon killed before the commit leaves the job unfinished, to be ended again from its exit record."""
        if state not in _ENDS:
            raise ForbiddenMove(row.id, row.state, state)
        reported = values.pop("cause", None)
        values["cause"] = end_cause(replace(row, state=state, **values), reported)  # before the write lock: it reads
        with self.store.transaction():
            ended = self._move(row, state, values)
            self.store.end_alerts_due(row.id)
            restart = self._restart_if_wanted(ended)
            crash_point("end-before-commit")
        return ended, restart

    def _move(self, row: JobRow, state: State, values: dict[str, Any]) -> JobRow:
        """Write one move, checked against MOVES and against the state the database holds."""
        if not allowed(row.state, state):
            raise ForbiddenMove(row.id, row.state, state)
        with self.store.transaction():
            if not self.store.move(row.id, row.state, state, **values):
                stored = self.store.get(row.id)  # only to say what it is instead
                raise ForbiddenMove(row.id, row.state, state, stored.state if stored else "gone")
        return replace(row, state=state, **values)

    def _restart_if_wanted(self, row: JobRow) -> Optional[JobRow]:
        """The restart policy, applied the moment a job becomes final: a job that failed or was lost for a
        cause its --restart-on names, with restarts left, runs again (same snapshot, same checkpoint folder)
        as a new job. A bug fails the same way every time: by default (tfrun/restarts.py) an error is not
        run again, so that it fails once and alerts once."""
        left = row.spec.max_restarts
        if row.cause is None or left <= 0 or row.restarted_as:
            return None
        if row.cause not in row.spec.restart_on:
            shown = restarts.shown(row.spec.restart_on)
            log.info("job %d: %s (%s), not restarted: --restart-on is %s", row.id, row.state, row.cause, shown)
            return None
        new = self.rerun(row, restarts_left=left - 1)
        reason = f"{row.state} ({row.cause}) with exit code {row.exit_code}; {left - 1} automatic restart(s) left"
        log.info("job %d: %s; running it again as job %d", row.id, reason, new.id)
        return new


def end_cause(row: JobRow, reported: Optional[Cause] = None) -> Optional[Cause]:
    """Why a job that just became final ended, as --restart-on names causes, decided once from every account of
    it: None for a success or a cancel; lost; `oom` when any says it ran out of memory: its executor's
    (`reported`: Slurm killed it over its memory limit), its cgroup's (a SIGKILL while the kernel's OOM-kill
    count rose, on the machine and boot its shim recorded) or its log's (its last words a fatal out-of-memory
    message, whoever ran it); else a signal, else an error (a non-zero exit, or no start at all)."""
    if row.state == JobState.LOST:
        return "lost"
    if row.state != JobState.FAILED:
        return None
    job_dir = Path(row.job_dir)
    if reported == "oom" or (row.signal == signal.SIGKILL and oom.killed_by_oom_killer(job_dir)):
        return "oom"
    if oom.log_ends_in_oom(job_dir / jobdir.OUTPUT):
        return "oom"
    return "signal" if row.signal is not None else "error"
