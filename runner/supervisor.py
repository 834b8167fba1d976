"""Starting jobs through shims, noticing how they end, re-adopting them after a restart, cancelling them.

The daemon is never a job's parent: it starts a shim (which forks away at once) and from then on learns
everything from the job's folder (shim.json, exit.json) and from /proc. That is what lets a job outlive
the daemon, and what lets a new daemon pick up where the last one stopped.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Optional

import tfrun
from tfrun.constants import EXIT_LOST, MONITOR_INTERVAL_S
from tfrun.paths import Layout
from tfrun.protocol import JobState
from tfrun.runner import jobdir
from tfrun.runner.faults import crash_point
from tfrun.runner.job import JobRow
from tfrun.runner.process import Identity, boot_id
from tfrun.runner.store import Store

if TYPE_CHECKING:
    from tfrun.runner.jobdir import CancelRequest, ExitRecord, LaunchRecord, ShimRecord

log = logging.getLogger("tfrund")
_TFRUN_PARENT = str(Path(tfrun.__file__).resolve().parent.parent)  # where `import tfrun` finds this tfrun


class Supervisor:
    def __init__(self, layout: Layout, store: Store) -> None:
        self.layout = layout
        self.store = store
        self._starting: set[int] = set()
        self._final_events: dict[int, asyncio.Event] = {}
        # The daemon's: on_final records what a job's end calls for (end alerts, a restart) in the transaction
        # that ends it; after_final, once that is committed, does the work outside the database (the queue).
        self.on_final: Callable[[int], None] = lambda job_id: None
        self.after_final: Callable[[int], None] = lambda job_id: None

    # -- starting -----------------------------------------------------------------------------------------

    async def start(self, row: JobRow, env: dict[str, str], grace: float, command: Optional[list[str]] = None) -> None:
        """Write the job's launch record and start its shim; return once the job runs (or failed to start).
        The shim runs `command` if given (a wrapper around the job's own), else the job's command."""
        spare = self.layout.spare_exit(row.id)
        jobdir.reserve(spare)
        launch: LaunchRecord = {
            "command": command or list(row.spec.command),
            "cwd": str(Path(row.job_dir) / jobdir.WORK),
            "env": env,
            "grace": grace,
            "spare_exit": str(spare),
        }
        jobdir.write_json(Path(row.job_dir) / jobdir.LAUNCH, launch)
        await self.launch(row)

    async def launch(self, row: JobRow) -> None:
        """Start the shim of a job whose launch record is written."""
        self._starting.add(row.id)
        try:
            await self._spawn_shim(Path(row.job_dir))
            crash_point("start-spawned")
            self.check(row.id)
            row = self.store.get(row.id) or row
            if row.state == JobState.QUEUED:  # the shim died before the job started
                self.mark_failed(row, f"its shim failed to start; see {Path(row.job_dir) / jobdir.SHIM_LOG}")
        finally:
            self._starting.discard(row.id)

    async def resume_queued(self) -> None:
        """At daemon start: launch jobs accepted by a daemon that died before starting them."""
        for row in self.store.list(include_final=False):
            if row.state != JobState.QUEUED or row.id in self._starting:  # a restart this daemon is preparing
                continue
            if (Path(row.job_dir) / jobdir.LAUNCH).exists():
                log.info("job %d: starting it (accepted before the last daemon stopped)", row.id)
                await self.launch(row)
            elif not row.prepared:
                self.mark_failed(row, "the daemon stopped while preparing it")
            elif row.gpus is not None:  # scheduled, but the daemon died before it wrote the launch record
                self.store.update(row.id, gpus=None)  # so the scheduler takes it again
            # else: it waits for the scheduler, as it did

    async def _spawn_shim(self, job_dir: Path) -> None:
        with open(job_dir / jobdir.SHIM_LOG, "ab") as shim_log:
            proc = await asyncio.create_subprocess_exec(
                sys.executable,
                "-S",  # no site: the shim needs only tfrun (on PYTHONPATH) and starts ~30 ms sooner
                "-m",
                "tfrun.runner.shim",
                str(job_dir),
                env={**os.environ, "PYTHONPATH": _TFRUN_PARENT},
                stdin=asyncio.subprocess.DEVNULL,
                stdout=asyncio.subprocess.DEVNULL,
                stderr=shim_log,
                cwd=str(job_dir),
                start_new_session=True,
            )
        # The shim's first process exits as soon as its forked self has started the job.
        await proc.wait()

    # -- learning how jobs are doing ----------------------------------------------------------------------

    def reconcile(self) -> None:
        """At daemon start: bring every unfinished job up to date with what happened while we were away."""
        current_boot = boot_id()
        for row in self.store.list(include_final=False):
            if row.boot_id and row.boot_id != current_boot:
                self._lose(row, "the machine rebooted while it ran")
            else:
                self.check(row.id, adopting=True)

    def preparing(self, job_id: int) -> None:
        """Mark a job as being prepared here (its work dir built) before `launch`, which unmarks it."""
        self._starting.add(job_id)

    def launched(self, job_id: int) -> None:
        self._starting.discard(job_id)

    def is_starting(self, job_id: int) -> bool:
        """Whether someone in this daemon is preparing or launching the job (not to be started twice)."""
        return job_id in self._starting

    def active(self) -> list[int]:
        """Jobs the monitor must watch: not final, and not being started right now."""
        return [r.id for r in self.store.list(include_final=False) if r.id not in self._starting]

    def check(self, job_id: int, adopting: bool = False) -> None:
        """Look at one unfinished job's folder and processes, and record what is found."""
        row = self.store.get(job_id)
        if row is None or row.final or self._recorded_end(row):
            return
        try:
            shim = jobdir.read_shim(Path(row.job_dir) / jobdir.SHIM)
        except ValueError as exc:
            self._lose(row, f"its shim record is unreadable: {exc}")
            return
        if shim is None:
            if row.state != JobState.QUEUED:  # a queued job's start is owned by whoever is starting it
                self._lose(row, "its shim left no record")
            return
        identity = _shim_identity(shim)
        if identity is None:
            self._lose(row, "its shim record is incomplete")
            return
        if row.shim_pid is None or row.state == JobState.QUEUED:
            self._record_start(row, shim)
        if identity.alive():
            if adopting:
                log.info("job %d: re-adopted (shim pid %d)", row.id, identity.pid)
            return
        # The shim is gone. It writes exit.json (or its spare) before it exits, so look once more before
        # calling it lost.
        if not self._recorded_end(row) and not self._recorded_spare_end(row):
            self._stop_orphan(shim)
            self._lose(row, f"its shim (pid {identity.pid}) ended without recording an exit status")

    def _recorded_end(self, row: JobRow) -> bool:
        """Finish the job from its exit.json if the shim wrote one; True if the job is now final."""
        return self._end_from(row, Path(row.job_dir) / jobdir.EXIT, "exit record")

    def _recorded_spare_end(self, row: JobRow) -> bool:
        """Finish the job from the spare exit record its shim filled because the job folder took no more
        writes; True if the job is now final. Read only once the shim is gone: it is written in place."""
        return self._end_from(row, self.layout.spare_exit(row.id), "spare exit record", blank_is_missing=True)

    def _end_from(self, row: JobRow, path: Path, what: str, blank_is_missing: bool = False) -> bool:
        """Finish the job from the exit record at `path` if there is one; True if the job is now final."""
        try:
            exit_info = jobdir.read_exit(path, blank_is_missing=blank_is_missing)
        except ValueError as exc:
            self._lose(row, f"its {what} is unreadable: {exc}")
            return True
        if exit_info is None:
            return False
        self._finish(row, exit_info)
        return True

    def _record_start(self, row: JobRow, shim: ShimRecord) -> None:
        self.store.update(
            row.id,
            state=JobState.RUNNING,
            pid=shim.get("job_pid"),
            shim_pid=shim.get("shim_pid"),
            shim_start=shim.get("shim_start"),
            boot_id=shim.get("boot_id"),
            started_at=shim.get("started_at"),
        )

    def _finish(self, row: JobRow, exit_info: ExitRecord) -> None:
        code = exit_info.get("exit_code")
        code = code if isinstance(code, int) else 255
        sig = exit_info.get("signal") if isinstance(exit_info.get("signal"), int) else None
        if exit_info.get("cancelled"):
            state = JobState.CANCELLED
        elif code == 0:
            state = JobState.SUCCEEDED
        else:
            state = JobState.FAILED
        self._end(
            row,
            state=state,
            exit_code=code,
            signal=sig,
            started_at=row.started_at or exit_info.get("started_at"),
            finished_at=exit_info.get("finished_at"),
            reason=exit_info.get("error") or row.reason,
        )
        log.info("job %d: %s (exit code %d)", row.id, state, code)

    def _lose(self, row: JobRow, reason: str) -> None:
        self._end(row, state=JobState.LOST, exit_code=EXIT_LOST, finished_at=time.time(), reason=reason)
        log.warning("job %d: lost: %s", row.id, reason)

    def _end(self, row: JobRow, **values: Any) -> None:
        """Make a job final. Its state, exit code and reason, and what the daemon records for its
        end (the end-alert watch, a restart with its link) are one transaction: a daemon killed before the
        commit leaves the job unfinished, to be ended again from its exit record; one killed after it
        leaves all of it, and the next daemon does the folder work of a restart that is still queued."""
        with self.store.transaction():
            self.store.update(row.id, **values)
            self.on_final(row.id)
            crash_point("end-before-commit")
        crash_point("end-after-commit")
        self.layout.spare_exit(row.id).unlink(missing_ok=True)  # the truth is in the database now
        self.after_final(row.id)
        self._notify_final(row.id)

    def _stop_orphan(self, shim: ShimRecord) -> None:
        """A job whose shim was killed runs unsupervised: nobody could record its end, so stop it."""
        pid, start = shim.get("job_pid"), shim.get("job_start")
        if isinstance(pid, int) and isinstance(start, int) and Identity(pid, start, boot_id()).alive():
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(pid, signal.SIGKILL)

    def mark_failed(self, row: JobRow, reason: str) -> None:
        """A job that never got as far as a shim."""
        self._end(row, state=JobState.FAILED, finished_at=time.time(), reason=reason)

    async def monitor(self) -> None:
        """Forever: look at every unfinished job. Cheap: a stat or two and a read of /proc per job."""
        while True:
            for job_id in self.active():
                try:
                    self.check(job_id)
                except Exception:  # one odd job folder must not stop the watch over the others
                    log.exception("job %d: check failed", job_id)
            await asyncio.sleep(MONITOR_INTERVAL_S)

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
        """SIGTERM the job through its shim, which SIGKILLs it after `grace`; return its final row."""
        while row.id in self._starting:
            await asyncio.sleep(0.05)
        row = self.store.get(row.id) or row
        if row.final:
            return row
        job_dir = Path(row.job_dir)
        request: CancelRequest = {"grace": grace, "requested_at": time.time()}
        jobdir.write_json(job_dir / jobdir.CANCEL, request)
        shim = jobdir.read_shim(job_dir / jobdir.SHIM)
        identity = _shim_identity(shim) if shim else None
        if identity is None:
            reason = "cancelled before it started"
            self._end(row, state=JobState.CANCELLED, finished_at=time.time(), reason=reason)
        elif identity.alive():
            os.kill(identity.pid, signal.SIGTERM)
        return await self.wait_final(row.id)


def _shim_identity(shim: ShimRecord) -> Optional[Identity]:
    pid, start, boot = shim.get("shim_pid"), shim.get("shim_start"), shim.get("boot_id")
    if isinstance(pid, int) and isinstance(start, int) and isinstance(boot, str):
        return Identity(pid, start, boot)
    return None
