"""Handlers of submitting: a job or an array's tasks (each submission made once, however often its client asks
again after a lost connection), their work dirs built from the uploaded contents, and the uploads themselves
(which contents the box lacks, then those contents). The request becomes a spec in runner/handlers/jobspec.py."""

from __future__ import annotations

import asyncio
import errno
import functools
import os
import shutil
from dataclasses import replace
from typing import TYPE_CHECKING, Callable, Optional, Protocol, TypeVar

from tfrun import arrays
from tfrun.content import ManifestError
from tfrun.protocol.jobs import (
    JobList,
    JobReply,
)
from tfrun.protocol.submit import FileEntry, HaveBlobs, MissingBlobs, PutBlob, PutBlobs, Submit, SubmitArray
from tfrun.protocol.wire import Ok, encode

from .. import housekeeping
from ..alerts import diskfull
from ..faults import crash_point
from ..records.job import JobRow
from . import jobspec
from .base import Connection, handles, invalid, public

if TYPE_CHECKING:
    from ..records.lifecycle import Lifecycle
    from ..workdir.blobs import Spares

T = TypeVar("T")


class Context(jobspec.Context, housekeeping.Context, Protocol):
    """What submitting needs of the daemon (runner/daemon.py's Daemon is one)."""

    lifecycle: Lifecycle
    spares: Spares
    submissions: dict[str, asyncio.Future[list[JobRow]]]  # submits being made, by submission id

    async def off_loop(self, work: Callable[[], T]) -> T: ...


@handles(Submit)
async def submit(daemon: Context, req: Submit, conn: Connection) -> None:
    """Check the request, build the job's work dir from the uploaded contents, start the job's shim.

    Once per submission id: the same submit sent again (by a client that lost its daemon before the answer,
    to the next daemon or over a new SSH link to this one) gets the job the first one made."""
    (row,) = await _once(daemon, req, req.submission_id, [])
    await conn.send(JobReply(public(daemon, row)))


@handles(SubmitArray)
async def submit_array(daemon: Context, req: SubmitArray, conn: Connection) -> None:
    """`submit`, as one task a combination of the axes' values (tfrun/arrays.py), answered with every task."""
    axes = [(axis.key, axis.values) for axis in req.axes]
    try:
        arrays.check(axes, req.submit.env)
    except arrays.ArrayError as exc:
        raise invalid(f"--array: {exc}") from None
    rows = await _once(daemon, req.submit, req.submit.submission_id, arrays.tasks(axes))
    await conn.send(JobList([public(daemon, row) for row in rows]))


async def _once(daemon: Context, req: Submit, sid: Optional[str], tasks: list[dict[str, str]]) -> list[JobRow]:
    """The job (or the array's tasks) of a submit, made once per submission id."""
    if sid is None:
        return await new_jobs(daemon, req, tasks)
    pending = daemon.submissions.get(sid)
    if pending is None:  # else the first is still being made here: its answer is this one's too
        pending = daemon.submissions[sid] = asyncio.ensure_future(_submitted_once(daemon, req, sid, tasks))
        pending.add_done_callback(lambda _: daemon.submissions.pop(sid, None))
    return await asyncio.shield(pending)  # its client hanging up does not stop a job half made


async def _submitted_once(daemon: Context, req: Submit, sid: str, tasks: list[dict[str, str]]) -> list[JobRow]:
    """The jobs of submission `sid`: the ones a daemon made before, or new ones."""
    found = daemon.store.find_submission(sid)
    made = [] if found is None else daemon.store.array_tasks(found.id) if found.array_id is not None else [found]
    if found is not None and found.prepared:
        return made
    for row in made:
        # Recorded by a daemon that died before its work dir was built (the next one marked it failed): it
        # never ran and its client never learnt its id, so it makes way for the job it was meant to be.
        daemon.store.delete(row.id)
        shutil.rmtree(daemon.layout.jobs_dir / str(row.id), ignore_errors=True)
    return await new_jobs(daemon, req, tasks, sid)


async def new_jobs(
    daemon: Context, req: Submit, tasks: list[dict[str, str]], sid: Optional[str] = None,
    resume_from: Optional[str] = None,
) -> list[JobRow]:  # fmt: skip
    """One job, or the tasks of an array (one per item of `tasks`, their values by key): made in one
    transaction, their work dirs built, then scheduled. With `resume_from` (a stored folder), the job stores
    there and starts from its newest checkpoint (runner/handlers/storage.py)."""
    _refuse_on_a_full_disk(daemon)
    spec = jobspec.job_spec(daemon, req)
    if resume_from is not None:
        spec = replace(spec, checkpoints_to=resume_from, restore=True)
    alert_rules = jobspec.alert_rules(daemon, req)
    task_specs = [jobspec.task_spec(req, spec, index, values) for index, values in enumerate(tasks)]
    with daemon.store.transaction():
        if task_specs:
            rows = daemon.lifecycle.create_array(task_specs, sid)
        else:
            rows = [daemon.lifecycle.create(req.name, spec, submission_id=sid)]
        for row in rows:
            daemon.store.set_job_alerts(row.id, alert_rules, req.notify, req.metric_patterns)
    try:
        if tasks:
            rows = await _build_array(daemon, rows, req.files)
        else:
            rows = [await daemon.scheduler.build(rows[0], req.files)]
    except ManifestError as exc:
        _refuse_on_a_full_disk(daemon)  # the build removed the job: what failed it was the disk
        raise invalid(f"cannot build the work dir: {exc}") from None
    crash_point("submit-accepted")
    daemon.in_background(functools.partial(daemon.spares.prepare, req.files, req.source))
    housekeeping.after_submit(daemon)
    return rows


def _refuse_on_a_full_disk(daemon: Context) -> None:
    """ENOSPC, which the handlers refuse in one line naming the disk (runner/handlers/base.py), when the home's
    disk is full: a submit is then refused before anything of it is made, not failed half way (a row whose
    commit failed, a folder whose row was undone)."""
    if diskfull.space(daemon.layout.home).free < diskfull.FULL_BELOW_BYTES:
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))


async def _build_array(daemon: Context, rows: list[JobRow], files: list[FileEntry]) -> list[JobRow]:
    """Build every task's work dir, then make them all ready in one transaction and run one pass, which
    sees them together (on Slurm: one sbatch). A task that cannot be built takes the others with it."""
    for built, row in enumerate(rows):
        try:
            await daemon.scheduler.build(row, files, schedule=False)
        except ManifestError:
            for other in rows[:built] + rows[built + 1 :]:  # build removed this one
                daemon.store.delete(other.id)
                shutil.rmtree(other.job_dir, ignore_errors=True)
            raise
    with daemon.store.transaction():
        for row in rows:
            daemon.store.update(row.id, prepared=1)
    await daemon.scheduler.run_pass()
    return [daemon.store.get(row.id) or row for row in rows]


@handles(HaveBlobs)
async def have_blobs(daemon: Context, req: HaveBlobs, conn: Connection) -> None:
    """The contents not stored, looked up (a stat each) and encoded in a worker thread: a request may name
    100,000 of them, which took the event loop from every other client for most of a second."""

    def work() -> bytes:
        return encode(MissingBlobs(daemon.blobs.missing(req.digests, holder=conn.key)))

    try:
        await conn.send_frame(await daemon.off_loop(work))
    except ManifestError as exc:
        raise invalid(str(exc)) from None


@handles(PutBlobs)
async def put_blobs(daemon: Context, req: PutBlobs, conn: Connection) -> None:
    """Contents packed in one frame (4 MB of small files), hashed and written in a worker thread."""
    try:
        await daemon.off_loop(lambda: daemon.blobs.write_many(conn.key, req.digests, req.sizes, req.data))
    except ManifestError as exc:
        raise invalid(str(exc)) from None
    await conn.send(Ok())


@handles(PutBlob)
async def put_blob(daemon: Context, req: PutBlob, conn: Connection) -> None:
    """A chunk of one content, written (and on the last, hashed) in a worker thread; a connection's chunks
    still follow each other, as the daemon reads its next request once this one is done."""
    try:
        await daemon.off_loop(lambda: daemon.blobs.write_chunk(conn.key, req.digest, req.offset, req.data, req.last))
    except ManifestError as exc:
        raise invalid(str(exc)) from None
    if req.last:
        await conn.send(Ok())
