"""Handlers of a job's life: submit (its request checked and made a job), restart, cancel, wait, and the
queries of jobs (ps, status)."""

from __future__ import annotations

import asyncio
import dataclasses
import functools
import hashlib
import json
import os
import shutil
import sqlite3
from collections.abc import AsyncIterator, Iterator
from dataclasses import replace
from pathlib import PurePosixPath
from typing import TYPE_CHECKING, Optional, Protocol

from tfrun import __version__, arrays, restarts
from tfrun.constants import (
    DEFAULT_GRACE_S,
    MAX_PAYLOAD_BYTES,
)
from tfrun.content import ManifestError, check_manifest
from tfrun.protocol.fields import Cause, ErrorCode, JobState, is_job_id, validate_name
from tfrun.protocol.jobs import (
    Cancel,
    CancelReply,
    CancelResult,
    GetJob,
    Job,
    JobList,
    JobReply,
    ListJobs,
    Restart,
    Wait,
    record_text,
)
from tfrun.protocol.submit import FileEntry, Submit, SubmitArray
from tfrun.runner import housekeeping, rules
from tfrun.runner.doctor import job_python
from tfrun.runner.faults import crash_point
from tfrun.runner.handlers.base import Connection, RequestError, Shown, find, handles, invalid, public, rule_texts
from tfrun.runner.job import SERVICE_LIKE, JobRow, JobSpec, from_json
from tfrun.runner.metrics import LogMetrics
from tfrun.runner.metrics import PatternError as MetricPatternError
from tfrun.runner.outbox import diagnose, masked, usable
from tfrun.runner.scheduler import SnapshotError, snapshot_files
from tfrun.runner.slurm import settings as slurm_settings

if TYPE_CHECKING:
    from tfrun.runner.blobs import Spares
    from tfrun.runner.executor import Executor
    from tfrun.runner.lifecycle import Lifecycle
    from tfrun.runner.scheduler import Scheduler
    from tfrun.runner.supervisor import Supervisor


class Context(Shown, housekeeping.Context, Protocol):
    """What submitting, listing, waiting for and ending jobs need of the daemon (runner/daemon.py's Daemon is
    one)."""

    executor: Executor
    lifecycle: Lifecycle
    scheduler: Scheduler
    supervisor: Supervisor
    spares: Spares
    submissions: dict[str, asyncio.Future[list[JobRow]]]  # submits being made, by submission id


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
        return await _new_jobs(daemon, req, tasks)
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
    return await _new_jobs(daemon, req, tasks, sid)


async def _new_jobs(
    daemon: Context, req: Submit, tasks: list[dict[str, str]], sid: Optional[str] = None
) -> list[JobRow]:
    """One job, or the tasks of an array (one per item of `tasks`, their values by key): made in one
    transaction, their work dirs built, then scheduled."""
    script = _check_submit(daemon, req)
    command = _command(daemon, req, script)
    gpus, after = _resources(daemon, req)  # checked after the command, as they always were
    partition, time_limit = _slurm_options(daemon, req)
    spec = JobSpec(
        source=req.source,
        script=str(script),
        args=tuple(req.args),
        command=tuple(command),
        env=req.env,
        git_commit=req.git_commit,
        git_dirty=req.git_dirty,
        files=len(req.files),
        bytes=sum(e.size for e in req.files if e.kind == "file"),
        max_restarts=req.max_restarts,
        restart_on=_restart_on(req),
        gpus=gpus,
        priority=req.priority,
        after=after,
        tty=req.tty,
        partition=partition,
        time_limit=time_limit,
        nodes=req.nodes,
    )
    alert_rules = _alert_rules(daemon, req)
    task_specs = [_task(req, spec, index, values) for index, values in enumerate(tasks)]
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
        raise invalid(f"cannot build the work dir: {exc}") from None
    crash_point("submit-accepted")
    daemon.in_background(functools.partial(daemon.spares.prepare, req.files, req.source))
    housekeeping.after_submit(daemon)
    return rows


def _restart_on(req: Submit) -> tuple[Cause, ...]:
    """The causes whose failures restart the job: the request's, each once (the protocol checked each; an
    empty list is refused, as the option refuses it), else tfrun's default."""
    if req.restart_on is None:
        return restarts.DEFAULT
    try:
        return restarts.parse(req.restart_on)
    except ValueError as exc:
        raise invalid(f"--restart-on: {exc}") from None


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


def _task(req: Submit, spec: JobSpec, index: int, values: dict[str, str]) -> tuple[Optional[str], JobSpec]:
    """An array task's name and spec: its values as variables and as arguments after the script's own."""
    name = arrays.task_name(req.name, index)
    if name is not None and validate_name(name):
        raise invalid(f"--name {req.name!r} with the task index: {validate_name(name)}")
    extra = arrays.task_args(values)
    return name, replace(
        spec, args=(*spec.args, *extra), command=(*spec.command, *extra), env={**spec.env, **arrays.task_env(values)}
    )


def _resources(daemon: Context, req: Submit) -> tuple[int, tuple[int, ...]]:
    """What the job waits for besides its turn: its GPUs, the jobs it runs after (by id); checked."""
    devices = daemon.scheduler.devices
    gpus = daemon.scheduler.default_gpus() if req.gpus is None else req.gpus
    if gpus > len(devices) and not daemon.executor.places_jobs():  # Slurm checks its own GPUs
        has = f"has {len(devices)} ({', '.join(devices)})" if devices else "has none"
        raise invalid(f"the job asks for {gpus} GPU(s) and this box {has}")
    after: list[int] = []
    for ref in req.after:
        after += [job_id for job_id in _after_ids(daemon, ref) if job_id not in after]
    no_tty = daemon.executor.capabilities.no_tty
    if req.tty and no_tty:
        raise invalid(f"--tty: {no_tty}")
    if req.tty and shutil.which("tmux") is None:
        raise invalid("--tty needs tmux on the box (apt-get install tmux)")
    return gpus, tuple(after)


def _after_ids(daemon: Context, ref: str) -> list[int]:
    """The jobs `--after REF` waits for: the job of that id or name, else every task of the newest array
    submitted with --name REF (its tasks are named REF-0, REF-1, ...: a sweep, then the job that compares)."""
    dep = daemon.store.find(ref)
    if dep is not None:
        return [dep.id]
    if is_job_id(ref):
        raise RequestError(ErrorCode.NO_SUCH_JOB, f"--after: no job {ref!r}")
    first = daemon.store.find(arrays.task_name(ref, 0) or "")
    if first is None or first.array_id is None or first.array_index != 0:
        raise RequestError(ErrorCode.NO_SUCH_JOB, f"--after: no job or array {ref!r}")
    return [task.id for task in daemon.store.array_tasks(first.array_id)]


def _slurm_options(daemon: Context, req: Submit) -> tuple[Optional[str], Optional[str]]:
    """The job's --partition and --time (as sbatch takes it), checked; refused on a box that is no Slurm host."""
    given = [flag for flag, value in (("--partition", req.partition), ("--time", req.time), ("--nodes", req.nodes))
             if value is not None]  # fmt: skip
    refused = daemon.executor.capabilities.no_batch_options
    if given and refused:
        raise invalid(f"{', '.join(given)}: {refused}")
    try:
        return slurm_settings.job_options(req.partition, req.time, req.nodes)
    except slurm_settings.SettingsError as exc:
        raise invalid(str(exc)) from None


def _alert_rules(daemon: Context, req: Submit) -> dict[str, Optional[float]]:
    """The job's alert rules from the daemon's and the request's; its URLs and metric patterns checked."""
    try:
        chosen = rules.combine(daemon.config.rules, req.alerts, req.no_alerts)
    except rules.RuleError as exc:
        raise invalid(str(exc)) from None
    try:
        LogMetrics(req.metric_patterns)
    except MetricPatternError as exc:
        raise invalid(f"--metric: {exc}") from None
    for url in req.notify:
        if not usable(url):
            raise invalid(f"--notify: {diagnose(url)}")
    return {name: value for name, value in chosen.items() if name in rules.JOB_RULES}


@handles(Restart)
async def restart(daemon: Context, req: Restart, conn: Connection) -> None:
    """Run an ended job again, as a new job with the same snapshot, command and checkpoint folder."""
    row = find(daemon, req.job)
    if row.spec.service is not None:  # its port and token were this run's: a new one gets its own
        raise invalid(f"{row.name or row.id} is a service: start it again with tfrun {row.spec.service}")
    if not row.final:
        raise invalid(f"job {row.id} is still {row.state}: cancel it first, or wait for it")
    files = _snapshot_files(row)
    new = daemon.lifecycle.rerun(row)
    daemon.supervisor.mark_starting(new.id)  # not to be picked up by Daemon.build_restarts as well
    try:
        started = await daemon.scheduler.build(new, files)
    except ManifestError as exc:
        raise invalid(f"cannot build job {row.id}'s work dir again: {exc}") from None
    finally:
        daemon.supervisor.done_starting(new.id)
    await conn.send(JobReply(public(daemon, started)))


def _snapshot_files(row: JobRow) -> list[FileEntry]:
    """The manifest a job's work dir was built from."""
    try:
        return snapshot_files(row)
    except SnapshotError as exc:
        raise invalid(str(exc)) from None


def _check_submit(daemon: Context, req: Submit) -> PurePosixPath:
    """The script's path in the snapshot, once everything about the request is known to be sound."""
    if req.name is not None:
        problem = validate_name(req.name)
        if problem:
            raise invalid(problem)
    for key, value in req.env.items():
        if not key or "=" in key or "\0" in key or "\0" in value:
            raise invalid(f"bad environment variable {key!r}: use NAME=VALUE")
    try:
        check_manifest(req.files)
        lacking = daemon.blobs.missing([e.digest for e in req.files if e.kind == "file" and e.digest])
    except ManifestError as exc:
        raise invalid(f"bad file list: {exc}") from None
    if lacking:
        raise invalid(f"{len(lacking)} file content(s) were never uploaded (e.g. {lacking[0][:12]})")
    entry = next((e for e in req.files if e.path == req.script), None)
    if entry is None or entry.kind == "dir":
        raise invalid(f"script {req.script!r} is not among the files sent (ignored by .gitignore or .tfrunignore?)")
    script = PurePosixPath(req.script)
    if script.suffix != ".py" and entry.kind == "file" and not entry.mode & 0o111:
        raise invalid(f"script {req.script} is not executable: chmod +x it, or name its interpreter")
    return script


def _command(daemon: Context, req: Submit, script: PurePosixPath) -> list[str]:
    """The argv the shim runs: `.py` through the job interpreter, anything else directly."""
    if script.suffix != ".py":
        return [f"./{script}", *req.args]
    python = req.python or job_python(daemon.config.job_python)
    if os.sep in python:
        if not os.access(python, os.X_OK):
            raise invalid(f"job interpreter {python} does not exist or is not executable")
    else:
        found = shutil.which(python)
        if found is None:
            raise invalid(f"job interpreter {python!r} is not on the daemon's PATH")
        python = found
    return [python, _as_argument(script), *req.args]


def _as_argument(script: PurePosixPath) -> str:
    """The script's path as no interpreter can read it as an option: `python3 -dash.py` is "Unknown option"."""
    return f"./{script}" if str(script).startswith("-") else str(script)


@handles(ListJobs)
async def list_jobs(daemon: Context, req: ListJobs, conn: Connection) -> None:
    """`ps`: the jobs listed (with `last`, the newest of them), as records in one reply, or with `text` as
    the JSON text `ps --json` prints, a page of jobs read, encoded and sent at a time, other clients served
    in between: a history of 10,000 jobs is neither one frame nor a query a job."""
    first, older = _first_listed(daemon, req)
    if not req.text:
        await conn.send(JobList([job async for page in _listed(daemon, req, first) for job in page], older))
        return
    opened = False
    async for texts in _listed_texts(daemon, req, first):
        if texts:
            text = ("[\n" if not opened else ",\n") + ",\n".join(texts)
            opened = True
            data = text.encode("ascii")  # record_text escapes all else, as json.dumps does
            for start in range(0, len(data), MAX_PAYLOAD_BYTES):
                await conn.send(JobList(older=older, more=True, data=data[start : start + MAX_PAYLOAD_BYTES]))
    await conn.send(JobList(older=older, data=b"\n]" if opened else b"[]"))


# The reads of a listing, in the store's way (runner/store.py's `_row`): they belong there as Store methods.
_ROW_COLUMNS = tuple(f.name for f in dataclasses.fields(JobRow))
_SPEC, _GPUS = _ROW_COLUMNS.index("spec"), _ROW_COLUMNS.index("gpus")  # the columns stored as JSON
_PAGE = 500  # jobs read and encoded between two turns of the event loop: some 15 ms
# A job's row with its alert rules and notify URLs (NULL for a job without settings of its own), for a WHERE.
_ALERTED_ROWS = (
    f"SELECT {', '.join(f'j.{name}' for name in _ROW_COLUMNS)}, a.rules, a.notify "
    "FROM jobs j LEFT JOIN job_alerts a ON a.job_id = j.id"
)


def _by_state(req: ListJobs) -> tuple[str, tuple[str, ...]]:
    """The condition on a job's state that `req` lists by, and its parameters."""
    if req.all:
        return "1", ()
    return f"state NOT IN ({', '.join('?' * len(JobState.FINAL))})", JobState.FINAL


def _first_listed(daemon: Context, req: ListJobs) -> tuple[Optional[int], int]:
    """The id the listing starts from (None: it lists nothing) and how many listed jobs are older: with
    `last`, the newest `last` jobs' oldest, counted from the newest by id alone, a spec decoded only where
    it may be a service's (services left out) and the rest only counted."""
    if req.last is None:
        return 0, 0
    where, params = _by_state(req)
    maybe_service = "NULL" if req.services else "CASE WHEN spec LIKE ? THEN spec END"
    query = f"SELECT id, {maybe_service} FROM jobs WHERE {where} ORDER BY id DESC"
    found = daemon.store.db.execute(query, params if req.services else (SERVICE_LIKE, *params))
    first: Optional[int] = None
    shown = older = 0
    for job_id, spec in found:
        if spec is not None and from_json(spec).service is not None:
            continue
        if shown < req.last:
            first, shown = job_id, shown + 1
        else:
            older += 1
    return first, older


async def _listed(daemon: Context, req: ListJobs, first: Optional[int]) -> AsyncIterator[list[Job]]:
    """The jobs `req` lists from id `first` on, oldest first, a page at a time with their alert settings
    (one query a page, not one a job), other clients served between pages."""
    if first is None:
        return
    where, params = _by_state(req)
    query = f"{_ALERTED_ROWS} WHERE j.id >= ? AND {where} ORDER BY j.id LIMIT {_PAGE}"
    texts: dict[Optional[str], list[str]] = {}  # each distinct set of rules once: a history mostly shares one
    while True:
        found = daemon.store.db.execute(query, (first, *params)).fetchall()
        yield [job for _, job, _ in _listed_jobs(daemon, req, found, texts)]
        if len(found) < _PAGE:
            return
        first = found[-1][0] + 1
        await asyncio.sleep(0)


def _listed_jobs(
    daemon: Context, req: ListJobs, found: list[sqlite3.Row], texts: dict[Optional[str], list[str]]
) -> Iterator[tuple[JobRow, Job, bool]]:
    """Each row of `_ALERTED_ROWS` that `req` lists (a service only if it lists services): the job's row, its
    record with its alert settings, and whether it has settings of its own."""
    for values in found:
        row = _job_row(values)
        if req.services or row.spec.service is None:
            yield row, _alerted(daemon, row.public(), values[-2], values[-1], texts), values[-2] is not None


async def _listed_texts(daemon: Context, req: ListJobs, first: Optional[int]) -> AsyncIterator[list[str]]:
    """The `ps --json` records of the jobs `req` lists from id `first` on, a page at a time: an ended job's as
    kept in job_texts, any other's made from its row (and an ended one's kept for the next listing). A
    history of 10,000 jobs is then read as text, where decoding and encoding each row cost 40 us a job."""
    if first is None:
        return
    where, params = _by_state(req)
    form = _record_form()
    query = (
        "SELECT j.id, t.text FROM jobs j LEFT JOIN job_texts t ON t.job_id = j.id AND t.form = ? "
        f"WHERE j.id >= ? AND {where} ORDER BY j.id LIMIT {_PAGE}"
    )
    while True:
        found = daemon.store.db.execute(query, (form, first, *params)).fetchall()
        made = _made_texts(daemon, req, [job_id for job_id, text in found if text is None])
        texts = [text if text is not None else made.get(job_id) for job_id, text in found]
        yield [text for text in texts if text is not None]
        if len(found) < _PAGE:
            return
        first = found[-1][0] + 1
        await asyncio.sleep(0)


def _made_texts(daemon: Context, req: ListJobs, ids: list[int]) -> dict[int, str]:
    """The records of jobs with no text kept, made from their rows (services left out unless `req` lists
    them); those of ended jobs with alert settings of their own are kept (a job without them shows the
    daemon's rules, which a config reload may change)."""
    if not ids:
        return {}
    query = f"{_ALERTED_ROWS} WHERE j.id IN ({', '.join('?' * len(ids))})"
    found = daemon.store.db.execute(query, ids).fetchall()
    made: dict[int, str] = {}
    kept: list[tuple[int, str]] = []
    for row, job, own_settings in _listed_jobs(daemon, req, found, {}):
        made[row.id] = record_text(job)
        if row.final and row.spec.service is None and own_settings:
            kept.append((row.id, made[row.id]))
    if kept:
        daemon.store.keep_texts(_record_form(), kept)
    return made


@functools.cache
def _record_form() -> str:
    """The form of the records kept in job_texts: the tfrun that writes them and the fields of `Job`, so that
    no release or change of the record reads texts an older one kept."""
    layout = repr([(f.name, str(f.type)) for f in dataclasses.fields(Job)]).encode()
    return f"{__version__}-{hashlib.sha256(layout).hexdigest()[:16]}"


def _job_row(values: sqlite3.Row) -> JobRow:
    """A job's row from the columns `_ROW_COLUMNS` names (its spec and GPUs as stored, JSON)."""
    row = list(values[: len(_ROW_COLUMNS)])
    row[_SPEC] = from_json(row[_SPEC])
    row[_GPUS] = None if row[_GPUS] is None else json.loads(row[_GPUS])
    return JobRow(*row)


def _alerted(
    daemon: Context, job: Job, stored: Optional[str], notify: Optional[str], texts: dict[Optional[str], list[str]]
) -> Job:
    """`job` with its alert rules (stored as JSON, else the daemon's) and its URLs masked, as `public` makes it."""
    if stored not in texts:
        texts[stored] = rule_texts(json.loads(stored) if stored is not None else daemon.config.rules)
    job.alert_rules = list(texts[stored])
    job.notify = [masked(url) for url in json.loads(notify)] if notify is not None else []
    return job


@handles(GetJob)
async def get_job(daemon: Context, req: GetJob, conn: Connection) -> None:
    await conn.send(JobReply(public(daemon, find(daemon, req.job))))


@handles(Wait)
async def wait(daemon: Context, req: Wait, conn: Connection) -> None:
    row = await daemon.supervisor.wait_final(find(daemon, req.job).id)
    await conn.send(JobReply(public(daemon, row)))


@handles(Cancel)
async def cancel(daemon: Context, req: Cancel, conn: Connection) -> None:
    grace = DEFAULT_GRACE_S if req.grace is None else req.grace

    async def one(ref: str, row: Optional[JobRow]) -> CancelResult:
        if row is None:
            return CancelResult(job=ref, ok=False, message=f"no job {ref!r}")
        if row.final:
            return CancelResult(ref, False, f"job {row.id} already ended ({row.state})", row.id, row.state)
        row = await daemon.supervisor.cancel(row, grace)
        return CancelResult(ref, True, f"job {row.id} {row.state}", row.id, row.state)

    rows = await _find_all(daemon, req.jobs)
    await conn.send(CancelReply(list(await asyncio.gather(*(one(ref, row) for ref, row in zip(req.jobs, rows))))))


async def _find_all(daemon: Context, refs: list[str]) -> list[Optional[JobRow]]:
    """The job each of `refs` names (None for none), looked up a hundred at a time with other clients served
    in between: the thousand a request may name take the store about 15 ms."""
    rows: list[Optional[JobRow]] = []
    for start in range(0, len(refs), 100):
        rows.extend(daemon.store.find(ref) for ref in refs[start : start + 100])
        await asyncio.sleep(0)
    return rows
