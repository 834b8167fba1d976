"""SlurmExecutor: jobs submitted with one `sbatch --parsable` each, run by tfrun's own shim in the batch
script, so the output file, exit.json, metrics, the exit-code contract and the cancel grace are exactly
as on a box (runner/shim/supervise.py `--batch`: the shim stays in the foreground, since the allocation ends with
the batch script).

Slurm places jobs: `places_jobs()` tells the scheduler to hand every queued job over at once (after its
`--after` jobs), with no devices of tfrun's; the job asks for `--gres=gpu:N` and Slurm sets its
CUDA_VISIBLE_DEVICES. `max_cpu_jobs` and tfrun's GPU bookkeeping do not apply.

In the job's folder: `slurm.sh` (the batch script), `slurm.json` (runner/executors/slurm/record.py: the Slurm id,
written atomically before launch returns; or why sbatch refused the job), `slurm-ID.out` (the batch script's own
output, named by tfrun's id: Slurm's ids restart when its state is wiped); with `--nodes N`, `task-I.log` (the
output of task I > 0: task 0's is the job's log) and `task-I.json` (how task I's command ended), written by
runner/shim/slurmtask.py.

What a job did is learnt from its folder (shim.json: it runs; exit.json: how it ended, exactly) and from Slurm (one
`squeue` for all jobs, at most every watcher.POLL_INTERVAL_S, less often for a long answer, backing off when it is
slow or fails; `sacct` for those squeue no longer lists), asked in a thread of its own
(runner/executors/slurm/watcher.py):
`poll` answers from the latest answer at once, and `cancel` runs scancel in a worker thread, so a slurmctld that
hangs never stalls the daemon. A failed or missing answer is no change; a job absent from both is lost only after
MISSING_GRACE_S of answers without it.

Slurm may requeue a running job (`scontrol requeue`, a preemption): the same Slurm id runs the batch
script again in the same folder. Such a job stays the same tfrun job, `running`, reported `Requeued`; the
shim of the new run sets the killed run's exit record aside, and an exit record of Slurm's own SIGTERM
(`stopped`) never ends a job before Slurm says how it ended. A job Slurm killed over its memory limit is
told by Slurm's OUT_OF_MEMORY or, without cgroups (jobacct_gather's OverMemoryKill, where Slurm says only
FAILED), by slurmstepd's line in slurm-ID.out.
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Callable, Optional

from tfrun.constants import DEFAULT_GRACE_S
from tfrun.protocol.fields import JobState

from ...records.job import JobRow
from ...shim import jobdir
from ..executor import Capabilities, Change, Ended, Requeued, Started
from . import arrays, states
from .batch import SCRIPT, batch_script, launch_record, sbatch_args
from .checks import slurm_checks
from .commands import AccountedJob, QueuedJob, Slurm, SlurmError
from .record import Records, SlurmRecord
from .settings import SlurmSettings
from .watcher import Watcher, in_thread

if TYPE_CHECKING:
    from tfrun.protocol.admin import Check

    from ...shim.jobdir import CancelRequest, ExitRecord, LaunchRecord, ShimRecord

log = logging.getLogger("tfrund")

MISSING_GRACE_S = 60.0
SETTLE_S = 10.0  # an exit record this old ends the job even if Slurm has not said it ended
KILL_AFTER_S = 10.0  # past the grace, a cancelled job still listed is scancelled outright
# A log follower ends once the job is final and its log has not grown for this long: the shim writes it on
# the compute node, and a shared filesystem may show the daemon its last bytes after Slurm's end.
LOG_SETTLE_S = 2.0


class SlurmExecutor:
    """Jobs on a Slurm cluster, this daemon on its login node (shared filesystem for TFRUN_HOME)."""

    capabilities = Capabilities(
        no_tty="not on a Slurm host (its jobs run in batch allocations, with no terminal to attach)",
        no_services="not on a Slurm host yet (its jobs run in batch allocations on compute nodes)",
        files_here=False,  # written on a compute node: file events on the login node may never tell
        log_settle_s=LOG_SETTLE_S,
    )

    def __init__(self, settings: Callable[[], SlurmSettings], shim_path: Path, slurm: Optional[Slurm] = None) -> None:
        self.settings = settings  # the config's as it is now: a reload applies to jobs launched after it
        self.shim_path = shim_path  # the shim's own import path, named by every batch script
        self.slurm = slurm or Slurm()
        self.watcher = Watcher(self.slurm)  # squeue and sacct, in a thread of their own
        self._missing_since: dict[int, float] = {}
        self.records = Records()  # every job's slurm.json, kept as written

    # -- handing jobs over --------------------------------------------------------------------------------

    async def launch(self, row: JobRow, env: dict[str, str], grace: float) -> None:
        """Write the launch record and the batch script, submit, and record the Slurm id (or the refusal)."""
        job_dir = Path(row.job_dir)
        if row.spec.tty:
            self.records.write(job_dir, {"error": "--tty jobs do not run on Slurm (yet)"})
            return
        launch = launch_record(row, env, grace, self.shim_path)
        jobdir.write_json(job_dir / jobdir.LAUNCH, launch)
        (job_dir / SCRIPT).write_text(batch_script(job_dir, self.shim_path))
        await self._submit(row, grace)

    async def _submit(self, row: JobRow, grace: float) -> None:
        args = sbatch_args(row, self.settings(), grace)
        loop = asyncio.get_running_loop()
        try:
            slurm_id = await loop.run_in_executor(None, self.slurm.submit, args)
        except SlurmError as exc:
            found = await loop.run_in_executor(None, self._submitted, row)  # a timeout may hide a submit
            if found is None:
                log.warning("job %d: sbatch refused it: %s", row.id, exc)
                self.records.write(Path(row.job_dir), {"error": str(exc)})
                return
            slurm_id = found
        self.records.write(Path(row.job_dir), {"slurm_id": slurm_id, "submitted_at": time.time()})
        log.info("job %d: submitted to Slurm as job %s", row.id, slurm_id)

    def _submitted(self, row: JobRow) -> Optional[str]:
        """The Slurm id of the job's submission if Slurm has one (its work dir is the job's folder)."""
        try:
            queue = self.slurm.queue()
        except SlurmError:
            return None
        return next((j.slurm_id for j in queue.values() if j.work_dir == row.job_dir), None)

    async def launch_array(self, rows: list[JobRow], envs: list[dict[str, str]], grace: float) -> None:
        """Tasks of one array: one `sbatch --array` for all of them (runner/executors/slurm/arrays.py)."""
        await arrays.launch(self, rows, envs, grace)

    async def resume(self, row: JobRow) -> bool:
        """A queued job whose launch was recorded: submitted already (its id stored, or found in squeue by
        its folder), or submitted now; False if its launch record was never written."""
        job_dir = Path(row.job_dir)
        if self._record(row) or not (job_dir / jobdir.LAUNCH).exists():
            return bool(self._record(row))
        array = arrays.submitted_with(job_dir)
        if array is not None:  # a task of an array: the array is found, or submitted, as one
            return await arrays.resume(self, row, array)
        loop = asyncio.get_running_loop()
        found = await loop.run_in_executor(None, self._submitted, row)
        if found is not None:
            self.records.write(job_dir, {"slurm_id": found, "submitted_at": time.time()})
            return True
        launch: Optional[LaunchRecord] = jobdir.read_launch(job_dir / jobdir.LAUNCH)
        grace = launch.get("grace", DEFAULT_GRACE_S) if launch else DEFAULT_GRACE_S
        if not (job_dir / SCRIPT).exists():
            (job_dir / SCRIPT).write_text(batch_script(job_dir, self.shim_path))
        log.info("job %d: submitting it (accepted before the last daemon stopped)", row.id)
        await self._submit(row, float(grace))
        return True

    def failed_to_start(self, row: JobRow) -> Optional[str]:
        """sbatch's refusal; None for a job Slurm holds: it waits in Slurm's queue, still `queued`."""
        record = self._record(row)
        if record.get("slurm_id"):
            return None
        return f"sbatch refused it: {record.get('error', 'no Slurm id was recorded')}"

    def places_jobs(self) -> bool:
        return True

    def resources(self) -> list[str]:
        """None of tfrun's: Slurm gives each job its GPUs (--gres)."""
        return []

    def use_devices(self, devices: list[str]) -> None:
        """Nothing: Slurm gives each job its GPUs."""

    def checks(self) -> list[Check]:
        """Slurm's: its commands, partitions and accounting (runner/executors/slurm/checks.py)."""
        return slurm_checks(self.slurm, self.settings())

    # -- learning how jobs are doing ----------------------------------------------------------------------

    def due(self, rows: Sequence[JobRow]) -> list[JobRow]:
        """Every job: what Slurm says of each comes in one answer (`poll` reads no folder between answers)."""
        return list(rows)

    def looks_unasked(self) -> bool:
        """Always: Slurm's answers come whatever tfrun writes."""
        return True

    async def wait(self, timeout: float) -> None:
        await asyncio.sleep(timeout)

    def poll(self, rows: Sequence[JobRow]) -> list[tuple[int, Change]]:
        """One squeue for all jobs (unless backing off), sacct for those it no longer lists, then each job's
        folder. Without an answer from Slurm, only what the folders say for sure (a start) is reported."""
        return self._look(rows, force=False)

    def reconcile(self, rows: Sequence[JobRow]) -> list[tuple[int, Change]]:
        """The same look as poll, now, whatever the backoff."""
        return self._look(rows, force=True)

    def _look(self, rows: Sequence[JobRow], force: bool) -> list[tuple[int, Change]]:
        """Slurm's latest answer, then each job's folder. Between answers only running jobs are looked at (an
        exit record may end one sooner than Slurm tells): a queued one changes only by what Slurm says, so a
        thousand held jobs cost nothing five times a second (a hundred cost 12% of a core in file reads, then
        a stat each), nor at an answer that says they still wait (_check); their records are kept in memory
        (Records), and their Slurm ids listed only when a question to Slurm starts."""

        def slurm_ids() -> list[str]:
            return [record["slurm_id"] for row in rows if (record := self._record(row)).get("slurm_id")]

        snapshot = self.watcher.now(slurm_ids()) if force else self.watcher.take(slurm_ids)
        if snapshot is None and not force:
            rows = [row for row in rows if row.state == JobState.RUNNING]
        tracked = [(row, record) for row in rows if (record := self._record(row)).get("slurm_id")]
        queue = snapshot.queue if snapshot is not None else None
        accounted = snapshot.accounted if snapshot is not None else {}
        asked_at = snapshot.asked_at if snapshot is not None else 0.0
        changes: list[tuple[int, Change]] = []
        for row, record in tracked:
            try:
                changes.extend((row.id, c) for c in self._check(row, record, queue, accounted, asked_at))
            except Exception:
                log.exception("job %d: check failed", row.id)
        return changes

    def _check(
        self,
        row: JobRow,
        record: SlurmRecord,
        queue: Optional[dict[str, QueuedJob]],
        accounted: dict[str, AccountedJob],
        asked_at: float,
    ) -> list[Change]:
        """One job: Slurm's state (if this look asked, at `asked_at`), then its folder, read after Slurm's
        answer so that an end Slurm saw is never read before the exit record the shim wrote first."""
        slurm_id = record["slurm_id"]
        job_dir = Path(row.job_dir)
        listed = queue.get(slurm_id) if queue is not None else None
        acct = accounted.get(slurm_id)
        state = listed.state if listed else (acct.state if acct else None)
        phase = states.phase(state) if state else None
        if row.state == JobState.QUEUED and phase == "pending":  # held, or waiting for room: no folder read
            self._missing_since.pop(row.id, None)  # (its start is told by the answer that says it runs)
            self._escalate(row, record)
            return []
        exit_record = _exit_record(job_dir)
        shim = _shim_record(job_dir)
        cancel_requested = (job_dir / jobdir.CANCEL).exists()
        started_at = row.started_at or (shim or {}).get("started_at")
        if phase is not None or queue is None:
            self._missing_since.pop(row.id, None)
        changes: list[Change] = []
        if row.state == JobState.QUEUED and (shim is not None or phase == "running") and exit_record is None:
            changes.append(Started(None, None, None, None, started_at or time.time()))
        if phase == "final":
            slurm_exit = states.exit_code(acct.exit_code) if acct else (None, None)
            if states.normal(state or "") not in states.FAILED_STATES and _killed_for_memory(job_dir, row.id):
                state, slurm_exit = "OUT_OF_MEMORY", slurm_exit if slurm_exit[0] is not None else (137, 9)
            ran = shim is not None or row.state != JobState.QUEUED
            why = listed.reason if listed else ""
            return [*changes, states.end_of(state, exit_record, cancel_requested, started_at, slurm_exit, ran, why)]
        if row.state == JobState.RUNNING and shim is not None:
            run_began = shim.get("started_at")  # pending again after this run began: a requeue of this run
            again = phase == "pending" and isinstance(run_began, (int, float)) and run_began < asked_at
            changes.extend(self._requeued(row, record, shim, again))
        if exit_record is not None and phase != "pending":  # pending again: requeued, the record is a past run's
            ended_at = exit_record.get("ended_at")
            settled = not isinstance(ended_at, (int, float)) or time.time() - ended_at > SETTLE_S
            # Stopped by Slurm's own SIGTERM: only Slurm tells a time limit or a preemption from a requeue.
            if not exit_record.get("stopped") and (settled or (queue is not None and phase is None)):
                return [*changes, states.end_of(None, exit_record, cancel_requested, started_at)]
        if queue is not None and phase is None:  # listed by neither squeue nor sacct (and no plain exit record)
            since = self._missing_since.setdefault(row.id, time.monotonic())
            if time.monotonic() - since > MISSING_GRACE_S:
                return [*changes, states.end_of(None, exit_record, cancel_requested, started_at)]
        self._escalate(row, record)
        return changes

    def _requeued(self, row: JobRow, record: SlurmRecord, shim: ShimRecord, again: bool) -> list[Change]:
        """A running job Slurm requeued: pending `again` since the run shim.json records began, or a new run's
        shim counts more requeues than were reported; reported once per requeue, the count kept in slurm.json."""
        run = shim.get("slurm_restarts")
        count = (run if isinstance(run, int) else 0) + (1 if again else 0)
        if count <= record.get("requeues", 0):
            return []
        record["requeues"] = count  # in place: what else this look writes to slurm.json keeps it
        self.records.write(Path(row.job_dir), record)
        return [Requeued(count)]

    def _escalate(self, row: JobRow, record: SlurmRecord) -> None:
        """A cancelled job still running past its grace: scancel it outright (Slurm's TERM, KILL), in a
        thread; asked again KILL_AFTER_S later while it is still listed."""
        kill_at = record.get("kill_at")
        if kill_at is not None and time.time() >= kill_at:
            self.records.write(Path(row.job_dir), {**record, "kill_at": time.time() + KILL_AFTER_S})
            slurm_id = record["slurm_id"]
            in_thread(f"scancel {slurm_id}", lambda: self.slurm.cancel(slurm_id))

    # -- cancelling ---------------------------------------------------------------------------------------

    async def cancel(self, row: JobRow, grace: float) -> Optional[Ended]:
        """A job Slurm has not started is scancelled and ends now. A running one: cancel.json (its grace),
        then SIGTERM to the batch script alone, i.e. tfrun's shim, which stops the job within the grace;
        if it is still listed KILL_AFTER_S past the grace, it is scancelled outright. scancel runs in a
        worker thread: the event loop never waits for Slurm."""
        job_dir = Path(row.job_dir)
        request: CancelRequest = {"grace": grace, "requested_at": time.time()}
        jobdir.write_json(job_dir / jobdir.CANCEL, request)
        record = self._record(row)
        slurm_id = record.get("slurm_id")
        if not slurm_id:
            return Ended(JobState.CANCELLED, finished_at=time.time(), reason="cancelled before it started")
        loop = asyncio.get_running_loop()
        try:
            if row.state == JobState.QUEUED and _shim_record(job_dir) is None:
                await loop.run_in_executor(None, self.slurm.cancel, slurm_id)
                return Ended(JobState.CANCELLED, finished_at=time.time(), reason="cancelled before it started")
            await loop.run_in_executor(None, self.slurm.signal_batch, slurm_id, "TERM")
            self.records.write(job_dir, {**record, "kill_at": time.time() + grace + KILL_AFTER_S})
        except SlurmError as exc:
            log.warning("job %d: cancel: %s; scancel again at the next look", row.id, exc)
            self.records.write(job_dir, {**record, "kill_at": time.time()})
        return None

    def forget(self, job_id: int) -> None:
        self._missing_since.pop(job_id, None)
        self.records.forget(job_id)

    def _record(self, row: JobRow) -> SlurmRecord:
        """The job's slurm.json, as kept (read from its folder the first time), until its end is recorded."""
        return self.records.of(row.id, row.job_dir)


# What slurmstepd writes to the batch script's output when it kills a job for its memory: jobacct_gather's
# OverMemoryKill (no cgroups), and the cgroup plugin's count of OOM kills (where Slurm says OUT_OF_MEMORY).
_MEMORY_KILLS = (b"Exceeded job memory limit", b"exceeded memory limit", b"oom-kill event", b"oom_kill event")
_OUT_TAIL_BYTES = 64 << 10


def _killed_for_memory(job_dir: Path, job_id: int) -> bool:
    """Whether Slurm killed the job over its memory limit, as slurmstepd wrote at the end of slurm-ID.out:
    with jobacct_gather's OverMemoryKill (no cgroups) Slurm's state says only FAILED."""
    try:
        with open(job_dir / f"slurm-{job_id}.out", "rb") as f:
            f.seek(max(0, f.seek(0, os.SEEK_END) - _OUT_TAIL_BYTES))
            tail = f.read()
    except OSError:
        return False
    return any(marker in tail for marker in _MEMORY_KILLS)


def _exit_record(job_dir: Path) -> Optional[ExitRecord]:
    try:
        return jobdir.read_exit(job_dir / jobdir.EXIT)
    except ValueError:
        return None  # being written by another writer, or damaged: Slurm's state decides


def _shim_record(job_dir: Path) -> Optional[ShimRecord]:
    try:
        return jobdir.read_shim(job_dir / jobdir.SHIM)
    except ValueError:
        return None
