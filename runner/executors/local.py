"""LocalExecutor: a shim per job on this machine, and the `--tty` job's tmux command and socket.

LocalExecutor learns everything from the job's folder (shim.json, exit.json) and from /proc: the daemon
is never a job's parent, which is what lets a job outlive the daemon and a new daemon pick up where the
last one stopped. A pid alone is never trusted: a shim is known by its pid, start time and boot id. It
looks at a running job when its shim exits (a pidfd per shim, which the event loop reads: the kernel tells
of the exit at once, and a job that runs costs nothing meanwhile) and at every running job each SWEEP_S
(what a pidfd could miss: a shim whose record says one thing while its process does another).
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import logging
import os
import signal
import sys
import time
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Optional

from tfrun.constants import EXIT_LOST, SAFE_PATH
from tfrun.paths import Layout
from tfrun.protocol.fields import JobState

from ..home import inherited_env
from ..records.job import JobRow
from ..shim import jobdir
from ..shim.process import Identity, boot_id
from .executor import Capabilities, Change, Ended, Started

if TYPE_CHECKING:
    from tfrun.protocol.admin import Check

    from ..shim.jobdir import CancelRequest, ExitRecord, LaunchRecord, ShimRecord

log = logging.getLogger("tfrund")
SWEEP_S = 5.0  # every running job is looked at this often, whatever its shim's pidfd says


class LocalExecutor:
    """Jobs on this machine, each under its own shim (runner/shim/supervise.py)."""

    capabilities = Capabilities(no_batch_options="only on a Slurm host (this daemon runs jobs itself)")

    def __init__(self, layout: Layout, devices: list[str]) -> None:
        self.layout = layout
        self.devices = devices  # the config's (a reload sets them)
        self._exits: dict[int, int] = {}  # running job -> a pidfd of its shim, readable once the shim exits
        self._exited: set[int] = set()  # jobs whose shim exited since their last poll
        self._pidfds = hasattr(os, "pidfd_open")  # False once the kernel says it has none
        self._woken: Optional[asyncio.Event] = None  # made on the loop, by the first `wait`
        self._swept_at = 0.0
        self._unfollowed = False  # the last `due` found a running job that no pidfd follows

    # -- handing jobs over --------------------------------------------------------------------------------

    async def launch(self, row: JobRow, env: dict[str, str], grace: float) -> None:
        """Write the job's launch record and start its shim; return once the job runs (or failed to start).
        A `--tty` job's command runs in a tmux session (runner/executors/ttyjob.py), which `tfrun attach` opens."""
        spare = self.layout.spare_exit(row.id)
        jobdir.reserve(spare)
        launch: LaunchRecord = {
            "command": tty_command(self.layout, row) if row.spec.tty else list(row.spec.command),
            "cwd": str(Path(row.job_dir) / jobdir.WORK),
            "env": env,
            "grace": grace,
            "spare_exit": str(spare),
        }
        jobdir.write_json(Path(row.job_dir) / jobdir.LAUNCH, launch)
        await self._spawn_shim(Path(row.job_dir))

    async def launch_array(self, rows: list[JobRow], envs: list[dict[str, str]], grace: float) -> None:
        """One `launch` each: on this machine a task is a job like any other, given its GPUs on its own."""
        for row, env in zip(rows, envs):
            await self.launch(row, env, grace)

    async def resume(self, row: JobRow) -> bool:
        """Start the shim of a queued job whose launch record is written; False if it is not."""
        if not (Path(row.job_dir) / jobdir.LAUNCH).exists():
            return False
        log.info("job %d: starting it (accepted before the last daemon stopped)", row.id)
        await self._spawn_shim(Path(row.job_dir))
        return True

    async def _spawn_shim(self, job_dir: Path) -> None:
        with open(job_dir / jobdir.SHIM_LOG, "ab") as shim_log:
            proc = await asyncio.create_subprocess_exec(
                sys.executable,
                "-S",  # no site: the shim needs only its own copy (on PYTHONPATH) and starts ~30 ms sooner
                *SAFE_PATH,
                "-m",
                "tfrun.runner.shim",
                str(job_dir),
                env={**inherited_env(), "PYTHONPATH": str(self.layout.shim_pythonpath)},
                stdin=asyncio.subprocess.DEVNULL,
                stdout=asyncio.subprocess.DEVNULL,
                stderr=shim_log,
                cwd=str(job_dir),
                start_new_session=True,
            )
        # The shim's first process exits as soon as its forked self has started the job.
        await proc.wait()

    def failed_to_start(self, row: JobRow) -> str:
        """Why a job handed over is still queued: its shim died before the job started."""
        return f"its shim failed to start; see {Path(row.job_dir) / jobdir.SHIM_LOG}"

    # -- learning how jobs are doing ----------------------------------------------------------------------

    def due(self, rows: Sequence[JobRow]) -> list[JobRow]:
        """The running jobs whose shim exited, or that no pidfd follows; every running job each SWEEP_S. A
        queued job is not looked at: whoever hands it over sees its start (`launch`, `resume`)."""
        now = time.monotonic()
        sweep = now - self._swept_at >= SWEEP_S
        if sweep:
            self._swept_at = now
        running = [row for row in rows if row.state == JobState.RUNNING]
        for gone in set(self._exits) - {row.id for row in running}:
            self._unfollow(gone)
        due, self._unfollowed = [], False
        for row in running:  # each job once: a shim that exited is not followed again (it would fail)
            if row.id in self._exited:
                due.append(row)
            elif not self._follow(row):
                due.append(row)
                self._unfollowed = True
            elif sweep:
                due.append(row)
        return due

    def looks_unasked(self) -> bool:
        """A shim exited, a sweep is due, or a job is polled for want of a pidfd."""
        return bool(self._exited) or self._unfollowed or time.monotonic() - self._swept_at >= SWEEP_S

    async def wait(self, timeout: float) -> None:
        """Until a shim exits, or `timeout`."""
        if self._woken is None:
            self._woken = asyncio.Event()
        if not self._exited:  # not wait_for: before 3.12 it may swallow the cancel that stops the daemon
            woken = asyncio.ensure_future(self._woken.wait())
            try:
                await asyncio.wait({woken}, timeout=timeout)
            finally:
                woken.cancel()
        self._woken.clear()

    def _follow(self, row: JobRow) -> bool:
        """Whether the exit of the job's shim is followed (a pidfd, read by the event loop); False where it
        cannot be, and for a shim that is gone or is not the one recorded (the job must be looked at)."""
        if row.id in self._exits:
            return True
        if not self._pidfds or row.shim_pid is None or row.shim_start is None:
            return False
        try:
            fd = os.pidfd_open(row.shim_pid)
        except ProcessLookupError:
            return False
        except OSError as exc:  # ENOSYS: a kernel before 5.3; anything else: this job is polled
            self._pidfds = exc.errno != errno.ENOSYS
            return False
        if Identity(row.shim_pid, row.shim_start, boot_id()).alive():  # opened after: it is the shim's
            asyncio.get_running_loop().add_reader(fd, self._shim_exited, row.id)
            self._exits[row.id] = fd
            return True
        os.close(fd)
        return False

    def _shim_exited(self, job_id: int) -> None:
        """A followed shim exited (on the event loop): its job is due."""
        self._unfollow(job_id)
        self._exited.add(job_id)
        if self._woken is not None:
            self._woken.set()

    def _unfollow(self, job_id: int) -> None:
        fd = self._exits.pop(job_id, None)
        if fd is not None:
            asyncio.get_running_loop().remove_reader(fd)
            os.close(fd)

    def poll(self, rows: Sequence[JobRow]) -> list[tuple[int, Change]]:
        """Cheap: a stat or two and a read of /proc per job. One odd job folder does not stop the others."""
        self._exited -= {row.id for row in rows}
        return self._look(rows, adopting=False)

    def reconcile(self, rows: Sequence[JobRow]) -> list[tuple[int, Change]]:
        """A job of an earlier boot is lost; the others are looked at, and a live shim is adopted again."""
        current_boot = boot_id()
        rebooted = [r for r in rows if r.boot_id and r.boot_id != current_boot]
        lost = [(r.id, _lost("the machine rebooted while it ran")) for r in rebooted]
        return [*lost, *self._look([r for r in rows if r not in rebooted], adopting=True)]

    def _look(self, rows: Sequence[JobRow], adopting: bool) -> list[tuple[int, Change]]:
        changes: list[tuple[int, Change]] = []
        for row in rows:
            try:
                changes.extend((row.id, change) for change in self._check(row, adopting))
            except Exception:
                log.exception("job %d: check failed", row.id)
        return changes

    def _check(self, row: JobRow, adopting: bool) -> list[Change]:
        """What one unfinished job's folder and processes say happened to it."""
        ended = self._recorded_end(row)
        if ended is not None:
            return [ended]
        try:
            shim = jobdir.read_shim(Path(row.job_dir) / jobdir.SHIM)
        except ValueError as exc:
            return [_lost(f"its shim record is unreadable: {exc}")]
        if shim is None:  # a queued job's start is owned by whoever is starting it
            return [_lost("its shim left no record")] if row.state != JobState.QUEUED else []
        identity = _shim_identity(shim)
        if identity is None:
            return [_lost("its shim record is incomplete")]
        changes: list[Change] = []
        if row.state == JobState.QUEUED:  # a running job's shim identity was recorded with its start
            started = Started(
                pid=shim.get("job_pid"),
                shim_pid=shim.get("shim_pid"),
                shim_start=shim.get("shim_start"),
                boot_id=shim.get("boot_id"),
                started_at=shim.get("started_at"),
            )
            changes.append(started)
            row = replace(row, state=JobState.RUNNING, **started.values())
        if identity.alive():
            if adopting:
                log.info("job %d: re-adopted (shim pid %d)", row.id, identity.pid)
            return changes
        # The shim is gone. It writes exit.json (or its spare) before it exits, so look once more before
        # calling it lost.
        ended = self._recorded_end(row) or self._recorded_spare_end(row)
        if ended is None:
            self._stop_orphan(shim)
            ended = _lost(f"its shim (pid {identity.pid}) ended without recording an exit status")
        return [*changes, ended]

    def _recorded_end(self, row: JobRow) -> Optional[Ended]:
        """The end its shim wrote to exit.json, if it did."""
        return self._end_from(row, Path(row.job_dir) / jobdir.EXIT, "exit record")

    def _recorded_spare_end(self, row: JobRow) -> Optional[Ended]:
        """The end its shim wrote to the spare exit record because the job folder took no more writes, if it
        did. Read only once the shim is gone: it is written in place."""
        return self._end_from(row, self.layout.spare_exit(row.id), "spare exit record", blank_is_missing=True)

    def _end_from(self, row: JobRow, path: Path, what: str, blank_is_missing: bool = False) -> Optional[Ended]:
        """The end the exit record at `path` says, if there is one."""
        try:
            exit_info = jobdir.read_exit(path, blank_is_missing=blank_is_missing)
        except ValueError as exc:
            return _lost(f"its {what} is unreadable: {exc}")
        return None if exit_info is None else _finished(row, exit_info)

    def _stop_orphan(self, shim: ShimRecord) -> None:
        """A job whose shim was killed runs unsupervised: nobody could record its end, so stop it."""
        pid, start = shim.get("job_pid"), shim.get("job_start")
        if isinstance(pid, int) and isinstance(start, int) and Identity(pid, start, boot_id()).alive():
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(pid, signal.SIGKILL)

    def forget(self, job_id: int) -> None:
        """The truth is in the database now: the spare exit record goes, and the shim is not followed."""
        self.layout.spare_exit(job_id).unlink(missing_ok=True)
        self._unfollow(job_id)
        self._exited.discard(job_id)

    # -- cancelling, resources ----------------------------------------------------------------------------

    async def cancel(self, row: JobRow, grace: float) -> Optional[Ended]:
        """SIGTERM the job through its shim, which SIGKILLs it after `grace`."""
        job_dir = Path(row.job_dir)
        request: CancelRequest = {"grace": grace, "requested_at": time.time()}
        jobdir.write_json(job_dir / jobdir.CANCEL, request)
        shim = jobdir.read_shim(job_dir / jobdir.SHIM)
        identity = _shim_identity(shim) if shim else None
        if identity is None:
            return Ended(JobState.CANCELLED, finished_at=time.time(), reason="cancelled before it started")
        if identity.alive():
            os.kill(identity.pid, signal.SIGTERM)
        return None

    def resources(self) -> list[str]:
        return self.devices

    def places_jobs(self) -> bool:
        return False  # the scheduler gives each job its devices

    def use_devices(self, devices: list[str]) -> None:
        self.devices = devices

    def checks(self) -> list[Check]:
        """None of its own: the box's checks (runner/doctor.py) are this executor's."""
        return []


def tty_socket(layout: Layout, job_id: int) -> Path:
    """The tmux socket of a `--tty` job: beside the daemon's own, in a folder only its user can enter."""
    return layout.socket.parent / f"tmux-{job_id}.sock"


def tty_command(layout: Layout, row: JobRow) -> list[str]:
    """What the shim runs for a `--tty` job: runner/executors/ttyjob.py under the daemon's Python, the job's command
    in a tmux session."""
    wrapper = Path(__file__).with_name("ttyjob.py")
    log_path = Path(row.job_dir) / jobdir.OUTPUT
    return [sys.executable, "-S", str(wrapper), str(tty_socket(layout, row.id)), str(log_path), "--", *row.spec.command]


def _finished(row: JobRow, exit_info: ExitRecord) -> Ended:
    """The end an exit record says: cancelled, succeeded (code 0) or failed. Its cause (an OOM kill among them:
    a SIGKILL with a risen OOM-kill count of its cgroup) is the lifecycle's to decide (runner/records/lifecycle.py)."""
    code = exit_info.get("exit_code")
    code = code if isinstance(code, int) else 255
    sig = exit_info.get("signal") if isinstance(exit_info.get("signal"), int) else None
    if exit_info.get("cancelled"):
        state = JobState.CANCELLED
    elif code == 0:
        state = JobState.SUCCEEDED
    else:
        state = JobState.FAILED
    return Ended(
        state,
        exit_code=code,
        signal=sig,
        started_at=row.started_at or exit_info.get("started_at"),
        finished_at=exit_info.get("finished_at"),
        reason=exit_info.get("error") or row.reason,
    )


def _lost(reason: str) -> Ended:
    return Ended(JobState.LOST, exit_code=EXIT_LOST, finished_at=time.time(), reason=reason)


def _shim_identity(shim: ShimRecord) -> Optional[Identity]:
    pid, start, boot = shim.get("shim_pid"), shim.get("shim_start"), shim.get("boot_id")
    if isinstance(pid, int) and isinstance(start, int) and isinstance(boot, str):
        return Identity(pid, start, boot)
    return None
