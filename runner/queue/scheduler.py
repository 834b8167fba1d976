"""Which queued job starts when: GPUs of its own for each job, first in first out by priority, `--after`;
and, before that, building a job's work dir from its snapshot (`build`), which makes it one to schedule.

A job asks for N GPUs (`submit --gpus N`; default: the config's `default_gpus`, else 1 where the box has
GPUs and 0 where it has none). The scheduler gives it N devices that no other unfinished job holds, through
CUDA_VISIBLE_DEVICES, and records them with the job before it starts, so a daemon that restarts sees the
same assignment. Jobs wait in order of priority (higher first), then of submission; the first GPU job that
does not fit holds back the GPU jobs behind it, so a 2-GPU job is not starved by a stream of 1-GPU jobs.
Jobs without GPUs wait only for the cap on concurrent CPU-only jobs (`max_cpu_jobs`, none by default). A
job submitted `--after` others waits until they have all succeeded; if one did not, it fails, saying which.

A GPU is free only if no other tfrund's job holds its box-wide lease and no process outside tfrun holds more
than a little of its memory (runner/gpus/devices.py, runner/shim/gpulease.py): a pass that has GPU jobs to place
claims the leases of the devices it picks for each job, and the job's shim takes them over before the pass lets
its claims go (runner/gpus/claims.py). A job that waits for a GPU held outside the daemon says by whom, and the
pass runs again every GPU_RECHECK_S while it does (the end of another daemon's job makes no event here).

A pass runs whenever a job is submitted or ends and when the daemon starts; passes never overlap.

Where the executor places jobs itself (Slurm: `Executor.places_jobs`), GPUs and CPU slots are its business:
every queued job is handed over as soon as its `--after` jobs allow, in priority order, with no devices
(Slurm sets CUDA_VISIBLE_DEVICES from the job's --gres), and no job waits here for a GPU. The tasks of an
array (submit --array) that are ready in one pass are handed over together (`Executor.launch_array`: one
`sbatch --array`); a restart of a task goes alone, as any job.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import json
import logging
import os
import shutil
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Callable, NamedTuple, Optional, Protocol

from tfrun.constants import DEFAULT_GRACE_S, GPU_HELD_OUTSIDE, GPU_RECHECK_S
from tfrun.content import ManifestError
from tfrun.protocol.fields import JobState
from tfrun.protocol.submit import FileEntry
from tfrun.storage.remote import StorageError

from ..faults import crash_point
from ..gpus.claims import Claims
from ..home import inherited_env
from ..records.job import JobRow, JobSpec, from_json
from ..shim import jobdir
from ..storage import restore
from ..storage.uploader import STORED_LIST, Uploader
from ..workdir import checkpoints
from ..workdir.blobs import read_manifest, write_manifest
from . import queries

if TYPE_CHECKING:
    from collections.abc import AsyncIterator

    from tfrun.paths import Layout

    from ..executors.runs import Runs
    from ..records.store import Store
    from ..workdir.blobs import Spares

log = logging.getLogger("tfrund")


class QueueConfig(Protocol):
    """What the scheduler takes of the daemon's config (runner/config/settings.py's Config is one)."""

    @property
    def default_gpus(self) -> Optional[int]: ...  # a job that names no count; None: 1 where the box has GPUs

    @property
    def max_cpu_jobs(self) -> int: ...  # jobs without GPUs at once; 0: no cap


class SnapshotError(Exception):
    """A job's snapshot manifest cannot be read, so its work dir cannot be built again."""


class Scheduler:
    """Decides when each queued job starts and with which devices; Runs starts it, the lifecycle
    records what becomes of it. It writes only scheduling fields itself (`prepared`, `gpus`, `waiting`)."""

    def __init__(
        self, store: Store, runs: Runs, spares: Spares, layout: Layout, config: Callable[[], QueueConfig],
        uploader: Optional[Uploader] = None,
    ) -> None:  # fmt: skip
        self.store = store
        self.uploader = uploader  # object storage: a resumed job's checkpoint is restored before it starts
        self.runs = runs
        self.spares = spares
        self.layout = layout
        self.config = config  # the daemon's config as it is now: a reload replaces it
        self._lock = asyncio.Lock()
        self._claims = Claims()  # in a pass: the GPU leases it claimed for the jobs it starts
        self._recheck: Optional[asyncio.Task[None]] = None  # the pass to come for GPUs held outside
        self._specs: dict[int, JobSpec] = {}  # the spec of each waiting job (`_waiting_jobs`)

    @property
    def devices(self) -> list[str]:
        """The devices the executor may give jobs."""
        return self.runs.executor.resources()

    async def build(self, row: JobRow, files: list[FileEntry], schedule: bool = True) -> JobRow:
        """Build the job's work dir from `files` (its snapshot) and keep the manifest; then a pass starts it,
        now or once its GPUs, its turn and the jobs it runs after allow. The job as a pass left it. Without
        `schedule`, it is built only: the caller marks it ready (`prepared`) with others and runs the pass
        (an array's tasks, which a pass must see all together to hand them over as one).

        A submit's job that cannot be built leaves no trace (ManifestError); a restart's is failed."""
        job_dir = Path(row.job_dir)
        try:
            if not (job_dir / jobdir.FILES).exists():
                write_manifest(job_dir / jobdir.FILES, files)
            crash_point("prepare-manifest-written")
            if not (job_dir / jobdir.WORK).exists():  # else built by a daemon that died before recording it
                build = functools.partial(self.spares.build, files, job_dir / jobdir.WORK, row.spec.source)
                await asyncio.get_running_loop().run_in_executor(None, build)
            checkpoints.claim(row, self.store.daemon_id)  # the job's alone: never one another made first
            if row.spec.restore:
                await self._restore(row)
        except (ManifestError, OSError) as exc:
            if row.spec.restart_of is not None:
                self.runs.mark_failed(row, f"could not build its work dir: {exc}")
            else:
                self.store.delete(row.id)  # nothing was started: leave no trace of a job that never was
                shutil.rmtree(job_dir, ignore_errors=True)
            raise ManifestError(str(exc)) from None
        if not schedule:
            return row
        self.store.update(row.id, prepared=1)
        crash_point("prepare-built")
        await self.run_pass()
        return self.store.get(row.id) or row

    async def _restore(self, row: JobRow) -> None:
        """Fetch the newest checkpoint of a resumed job's stored folder into its checkpoint folder, unless the
        folder has checkpoints already (a restart of it here); ManifestError in one line if it cannot."""
        place = row.spec.checkpoints_to
        if self.uploader is None or place is None:
            return
        remote = self.uploader.remote(place)
        work = functools.partial(restore.restore_newest, remote, Path(row.checkpoint_dir))
        try:
            found = await asyncio.get_running_loop().run_in_executor(None, work)
        except (StorageError, ValueError) as exc:
            raise ManifestError(f"could not restore its checkpoint from {place}: {exc}") from None
        if found is not None:
            manifest, restored = found
            self.uploader.restored(row, restored)
            log.info("job %d: restored checkpoint %s (%d bytes) from %s", row.id, manifest.name, manifest.size, place)

    async def build_restart(self, row: JobRow) -> None:
        """Build and schedule a job made by `Lifecycle.rerun` from the snapshot of the job it runs again (for
        automatic restarts, and at daemon start for restarts a dead daemon did not finish, in the background);
        a failure is the job's. The caller marked it as starting (Runs.mark_starting); this unmarks it."""
        of = row.spec.restart_of
        source = (self.store.get(of) if of is not None else None) or row  # kept meanwhile (housekeeping)
        try:
            await self.build(row, snapshot_files(source))
        except SnapshotError as exc:
            self.runs.mark_failed(row, f"could not start: {exc}")
        except ManifestError:
            pass  # recorded as the job's failure by build
        finally:
            self.runs.done_starting(row.id)

    def default_gpus(self) -> int:
        configured = self.config().default_gpus
        return configured if configured is not None else min(1, len(self.devices))

    def held(self) -> dict[str, int]:
        """Devices held by unfinished jobs, and by which."""
        return {device: job_id for job_id, devices in queries.scheduled(self.store) for device in devices}

    async def run_pass(self) -> None:
        """Start every waiting job whose turn it is and whose GPUs are free; fail those whose `--after`
        job did not succeed.

        A submit waits for its pass (its answer says whether the job started, or why it waits), so a pass
        reads only what it decides by: the waiting jobs' ids, reasons and specs (each spec decoded once in
        its wait), and the states of the jobs they run after, in one query; a whole row only for a job it
        starts or fails. With 1,000 jobs waiting `--after` one, it reads and decodes none of their rows."""
        async with self._lock:
            waiting = self._waiting_jobs()
            async with self._handing_out(waiting) as outside:
                await self._place(waiting, outside)

    async def _place(self, waiting: list[_Waiting], outside: dict[str, str]) -> None:
        """The pass itself, over the `waiting` jobs, with the devices held `outside` this daemon."""
        scheduled = queries.scheduled(self.store)
        held = {device for _, devices in scheduled for device in devices}
        free = [d for d in self.devices if d not in held and d not in outside]
        cpu_running = queries.cpu_jobs(self.store, scheduled)
        after = queries.after_states(self.store, {ref for job in waiting for ref in job.spec.after})
        gpu_blocked = False
        arrays: dict[int, list[JobRow]] = {}  # the tasks of each array ready in this pass
        for job in sorted(waiting, key=lambda job: (-job.spec.priority, job.id)):
            if self._held_by_dependencies(job, after):
                continue
            if self.runs.executor.places_jobs():
                row = self._current(job)
                if row is None:
                    continue
                if row.array_id is not None and row.spec.restart_of is None:
                    arrays.setdefault(row.array_id, []).append(row)
                else:
                    await self._start_on(row, [])
                continue
            need = job.spec.gpus
            devices: list[str] = []
            if need:
                if not gpu_blocked and need <= len(free):
                    devices, lost = await self._claims.take(free, need)
                    outside.update(lost)
                    free = [d for d in free if d not in lost]
                if not devices:
                    self._wait(
                        job,
                        f"waiting for {need} GPU(s); {len(free)} free"
                        + (", others first" if gpu_blocked and need <= len(free) else "")
                        + _outside_text(outside),
                    )
                    gpu_blocked = True
                    continue
            else:
                # Services (TensorBoard, Jupyter) neither take nor wait for a CPU-only job slot: they mostly wait.
                cap = 0 if job.spec.service is not None else self.config().max_cpu_jobs
                if cap and cpu_running >= cap:
                    self._wait(job, f"waiting for one of the {cap} CPU-only job slots")
                    continue
            row = self._current(job)
            if row is None:
                self._claims.let_go(devices)
                continue
            if need:
                free = [d for d in free if d not in devices]
            else:
                cpu_running += job.spec.service is None
            await self._start_on(row, devices)
            self._claims.let_go(devices)  # its shim holds leases of its own now, or the job did not start
        for tasks in arrays.values():
            await self._start_array(tasks)
        if gpu_blocked and outside:
            self._recheck_soon()

    @contextlib.asynccontextmanager
    async def _handing_out(self, waiting: list[_Waiting]) -> AsyncIterator[dict[str, str]]:
        """For a pass with GPU jobs to place, on GPUs other daemons may lease: who holds each device outside this
        daemon (in words). The leases the pass claims for the jobs it starts are let go at its end at the latest."""
        if self.runs.executor.places_jobs() or not any(job.spec.gpus for job in waiting):
            yield {}
            return
        try:
            yield await self._claims.look(self.devices, [d for d in self.devices if d not in self.held()])
        finally:
            self._claims.let_go_all()

    def _recheck_soon(self) -> None:
        """A pass in GPU_RECHECK_S, unless one is due already: a GPU held outside frees with no event here."""
        if self._recheck is None or self._recheck.done():
            self._recheck = asyncio.get_running_loop().create_task(self._pass_later())

    async def _pass_later(self) -> None:
        await asyncio.sleep(GPU_RECHECK_S)
        self._recheck = None  # this pass may call for the next
        await self.run_pass()

    def _waiting_jobs(self) -> list[_Waiting]:
        """Queued jobs whose work dir is built and that nobody is starting yet, by id; each spec decoded in
        the first pass that sees it (it never changes), the others forgotten."""
        found = queries.waiting_rows(self.store)
        self._specs = {job_id: self._specs.get(job_id) or from_json(spec) for job_id, spec, _ in found}
        return [_Waiting(job_id, self._specs[job_id], why) for job_id, _, why in found]

    def _current(self, job: _Waiting) -> Optional[JobRow]:
        """The job's row as it is now, if it still waits: starting others awaits, and it may be cancelled."""
        row = self.store.get(job.id)
        return row if row is not None and _waiting(row) else None

    def _held_by_dependencies(self, job: _Waiting, after: dict[int, tuple[str, Optional[int]]]) -> bool:
        """Whether `--after` keeps `job` from starting: it waits for jobs still to succeed (the reason is
        recorded), or it is failed now because one of them failed, was cancelled or lost. A job that failed
        and runs again (--max-restarts, `tfrun restart`) counts as its last run, as `tfrun wait` has it.
        `after`: the state and restart of each job it may name, as `_after_states` read them for the pass."""
        pending = []
        for ref in job.spec.after:
            dep, found = ref, after.get(ref)
            while found is not None and found[1] is not None and found[1] in after:
                dep, found = found[1], after[found[1]]
            if found is None or found[0] in (JobState.FAILED, JobState.CANCELLED, JobState.LOST):
                how = "no longer exists" if found is None else f"{found[0]}"
                run = "" if found is None or dep == ref else f" in its restart, job {dep}"
                row = self._current(job)
                if row is not None:
                    self.runs.mark_failed(row, f"job {ref}, which it runs after, {how}{run}")
                return True
            if found[0] != JobState.SUCCEEDED:
                pending.append(str(dep))  # the run it waits for: a restart's id once there is one
        if pending:
            listed = ", ".join(pending[:5]) + (f" and {len(pending) - 5} more" if len(pending) > 5 else "")
            self._wait(job, f"waiting for job(s) {listed} to succeed")
        return bool(pending)

    def _wait(self, job: _Waiting, why: str) -> None:
        """Record why a job waits, where it changed. Written on the pass's reading: a job cancelled since
        keeps a reason that no one is shown (a client sees one only while a job is queued)."""
        if job.waiting != why:
            self.store.update(job.id, waiting=why)

    async def _start_on(self, row: JobRow, devices: list[str]) -> None:
        """Record the devices with the job, then hand it to the executor with them."""
        self.store.update(row.id, gpus=json.dumps(devices), waiting=None)
        crash_point("start-scheduled")
        row = replace(row, gpus=devices, waiting=None)
        try:
            env = job_env(self.layout, row, devices, self.devices)
            env.update(self._claims.env(devices))  # its shim takes the claims over (runner/gpus/claims.py)
            await self.runs.start_job(row, env, DEFAULT_GRACE_S)
        except OSError as exc:  # e.g. a full disk: the job is recorded as failed, not left queued forever
            self.runs.mark_failed(row, f"could not start: {exc.strerror or exc}")

    async def _start_array(self, rows: list[JobRow]) -> None:
        """Hand the ready tasks of one array to an executor that places jobs, together (Slurm: one sbatch)."""
        for row in rows:
            self.store.update(row.id, gpus="[]", waiting=None)
        rows = [replace(row, gpus=[], waiting=None) for row in rows]
        try:
            envs = [job_env(self.layout, row, [], self.devices) for row in rows]
            await self.runs.start_array(rows, envs, DEFAULT_GRACE_S)
        except OSError as exc:
            for row in rows:
                current = self.store.get(row.id)
                if current is not None and not current.final:
                    self.runs.mark_failed(current, f"could not start: {exc.strerror or exc}")


def _outside_text(outside: dict[str, str]) -> str:
    """Why GPUs are not free though no job of this daemon holds them, for a job's waiting reason."""
    if not outside:
        return ""
    return f"; {GPU_HELD_OUTSIDE}: " + "; ".join(f"GPU {d} by {why}" for d, why in sorted(outside.items()))


def snapshot_files(row: JobRow) -> list[FileEntry]:
    """The manifest a job's work dir was built from."""
    try:
        return read_manifest(Path(row.job_dir) / jobdir.FILES)
    except (OSError, ValueError, TypeError) as exc:
        raise SnapshotError(f"job {row.id} kept no readable snapshot manifest ({exc}); submit it again") from None


def _waiting(row: JobRow) -> bool:
    return row.state == JobState.QUEUED and row.gpus is None and bool(row.prepared)


class _Waiting(NamedTuple):
    """A job that waits to be scheduled, as a pass decides by: what it asks for, and why it waits now."""

    id: int
    spec: JobSpec
    waiting: Optional[str]


def job_env(layout: Layout, row: JobRow, devices: list[str], box_devices: list[str]) -> dict[str, str]:
    """The daemon's environment (less its secrets), the user's --env on top, and tfrun's own variables, which
    always win."""
    env = inherited_env()
    env["PYTHONUNBUFFERED"] = "1"
    env.update(row.spec.env)
    pythonpath = [str(layout.job_pythonpath), env.get("PYTHONPATH", "")]
    env["PYTHONPATH"] = os.pathsep.join(p for p in pythonpath if p)
    env["TFRUN_JOB_ID"] = str(row.id)
    env["TFRUN_JOB_DIR"] = row.job_dir
    env["TFRUN_CHECKPOINT_DIR"] = row.checkpoint_dir
    if row.spec.checkpoints_to:  # tfrun.jobs.Checkpoints keeps what is not stored yet (runner/storage/uploader.py)
        env["TFRUN_CHECKPOINTS_TO"] = row.spec.checkpoints_to
        env["TFRUN_CHECKPOINTS_STORED"] = str(Path(row.checkpoint_dir) / STORED_LIST)
    env["TFRUN_METRICS_FILE"] = str(Path(row.job_dir) / jobdir.METRICS)
    # TensorBoard runs of the job's own (a Keras TensorBoard callback's log_dir); `tfrun tensorboard` shows them
    # beside the `printed` run the daemon writes from the job's output (runner/metrics/eventfile.py).
    env["TFRUN_TENSORBOARD_DIR"] = str(Path(row.job_dir) / jobdir.TENSORBOARD)
    if row.array_id is not None:  # a task of an array (submit --array); its values are in its --env already
        env["TFRUN_ARRAY_ID"] = str(row.array_id)
        env["TFRUN_ARRAY_INDEX"] = str(row.array_index)
    if box_devices:  # its own GPUs, and none of the others' (an empty list hides them all)
        env["CUDA_VISIBLE_DEVICES"] = ",".join(devices)
        env["CUDA_DEVICE_ORDER"] = "PCI_BUS_ID"  # CUDA's numbering, as nvidia-smi's and NVML's
    # Without it TensorFlow takes all of every GPU's memory at start; a job that sets it keeps its choice.
    env.setdefault("TF_FORCE_GPU_ALLOW_GROWTH", "true")
    return env
