"""Handlers of jobs once made: the queries of them (ps, status), wait, cancel, and restart (an ended job run again
as a new one). Submitting is runner/handlers/submit.py's."""

from __future__ import annotations

import asyncio
import dataclasses
import functools
import hashlib
import json
import sqlite3
from collections.abc import AsyncIterator, Iterator
from typing import TYPE_CHECKING, Optional, Protocol

from tfrun import __version__
from tfrun.constants import (
    DEFAULT_GRACE_S,
    MAX_INT64,
    MAX_PAYLOAD_BYTES,
)
from tfrun.content import ManifestError
from tfrun.protocol.fields import JobState, is_job_id
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
from tfrun.protocol.submit import FileEntry

from ..alerts.outbox import masked
from ..queue.scheduler import SnapshotError, snapshot_files
from ..records.job import SERVICE_LIKE, JobRow, from_json
from .base import Connection, Shown, find, handles, invalid, public, rule_texts

if TYPE_CHECKING:
    from ..executors.runs import Runs
    from ..queue.scheduler import Scheduler
    from ..records.lifecycle import Lifecycle


class Context(Shown, Protocol):
    """What listing, showing, waiting for, ending and restarting jobs need of the daemon (runner/daemon.py's
    Daemon is one)."""

    lifecycle: Lifecycle
    scheduler: Scheduler
    runs: Runs


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
    daemon.runs.mark_starting(new.id)  # not to be picked up by Daemon.build_restarts as well
    try:
        started = await daemon.scheduler.build(new, files)
    except ManifestError as exc:
        raise invalid(f"cannot build job {row.id}'s work dir again: {exc}") from None
    finally:
        daemon.runs.done_starting(new.id)
    await conn.send(JobReply(public(daemon, started)))


def _snapshot_files(row: JobRow) -> list[FileEntry]:
    """The manifest a job's work dir was built from."""
    try:
        return snapshot_files(row)
    except SnapshotError as exc:
        raise invalid(str(exc)) from None


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


# The reads of a listing, in the store's way (runner/records/store.py's `_row`): they belong there as Store methods.
_ROW_COLUMNS = tuple(f.name for f in dataclasses.fields(JobRow))
_SPEC, _GPUS = _ROW_COLUMNS.index("spec"), _ROW_COLUMNS.index("gpus")  # the columns stored as JSON
_PAGE = 500  # jobs read and encoded between two turns of the event loop: some 15 ms
# A job's row with its alert rules and notify URLs (NULL for a job without settings of its own), for a WHERE.
_ALERTED_ROWS = (
    f"SELECT {', '.join(f'j.{name}' for name in _ROW_COLUMNS)}, a.rules, a.notify "
    "FROM jobs j LEFT JOIN job_alerts a ON a.job_id = j.id"
)


def _where(req: ListJobs) -> tuple[str, tuple[object, ...]]:
    """The condition on a job's row that `req` lists by, and its parameters: final or not, its states, its id
    below the cursor `before`, its id or name matching (a name holds the text, ASCII letters in any case).
    Each is a condition on the row alone: the page is the newest rows by id that pass, read by the primary
    key (or the index on state) from the cursor down, never the whole history."""
    conditions: list[str] = []
    params: list[object] = []
    if not req.all:
        conditions.append(f"state NOT IN ({', '.join('?' * len(JobState.FINAL))})")
        params += JobState.FINAL
    if req.states:
        conditions.append(f"state IN ({', '.join('?' * len(req.states))})")
        params += req.states
    if req.before is not None:
        conditions.append("id < ?")
        params.append(req.before)
    if req.match:
        named = int(req.match) if is_job_id(req.match) and int(req.match) <= MAX_INT64 else -1
        conditions.append("(id = ? OR instr(lower(name), lower(?)) > 0)")
        params += [named, req.match]
    return " AND ".join(conditions) or "1", tuple(params)


def _first_listed(daemon: Context, req: ListJobs) -> tuple[Optional[int], int]:
    """The id the listing starts from (None: it lists nothing) and how many listed jobs are older: with
    `last`, the newest `last` jobs' oldest, read from the newest down by id alone (a spec decoded only where
    it may be a service's: services left out) until it is found; the older ones are counted by `_older`."""
    if req.last is None:
        return 0, 0
    where, params = _where(req)
    maybe_service = "NULL" if req.services else "CASE WHEN spec LIKE ? THEN spec END"
    query = f"SELECT id, {maybe_service} FROM jobs WHERE {where} ORDER BY id DESC"
    found = daemon.store.db.execute(query, params if req.services else (SERVICE_LIKE, *params))
    first: Optional[int] = None
    shown = 0
    for job_id, spec in found:
        if shown == req.last:
            break
        if spec is None or from_json(spec).service is None:
            first, shown = job_id, shown + 1
    found.close()
    return first, _older(daemon, req, where, params, first if shown else None)


def _older(daemon: Context, req: ListJobs, where: str, params: tuple[object, ...], below: Optional[int]) -> int:
    """How many jobs `where` takes with an id below `below` (None: any), services left out unless `req` lists
    them: counted in SQL, where the rows of a history of 10,000 ended jobs cost 1 ms (they cost 7 ms read
    into Python one by one, at every page of `tfrun ui`); only the specs that may be a service's are read."""
    if below is not None:
        where, params = f"{where} AND id < ?", (*params, below)
    (count,) = daemon.store.db.execute(f"SELECT COUNT(*) FROM jobs WHERE {where}", params).fetchone()
    if count and not req.services:
        maybe = daemon.store.db.execute(f"SELECT spec FROM jobs WHERE {where} AND spec LIKE ?", (*params, SERVICE_LIKE))
        count -= sum(from_json(spec).service is not None for (spec,) in maybe)
    return int(count)


async def _listed(daemon: Context, req: ListJobs, first: Optional[int]) -> AsyncIterator[list[Job]]:
    """The jobs `req` lists from id `first` on, oldest first, a page at a time with their alert settings
    (one query a page, not one a job), other clients served between pages."""
    if first is None:
        return
    where, params = _where(req)
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
    where, params = _where(req)
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
    row = await daemon.runs.wait_final(find(daemon, req.job).id)
    await conn.send(JobReply(public(daemon, row)))


@handles(Cancel)
async def cancel(daemon: Context, req: Cancel, conn: Connection) -> None:
    grace = DEFAULT_GRACE_S if req.grace is None else req.grace

    async def one(ref: str, row: Optional[JobRow]) -> CancelResult:
        if row is None:
            return CancelResult(job=ref, ok=False, message=f"no job {ref!r}")
        if row.final:
            return CancelResult(ref, False, f"job {row.id} already ended ({row.state})", row.id, row.state)
        row = await daemon.runs.cancel(row, grace)
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
