"""What a scheduling pass reads of the store, without decoding rows: ids, stored specs and states, chunked
so that no statement takes more parameters than SQLite allows."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Optional

from tfrun.protocol.fields import JobState

from ..records.job import SERVICE_LIKE, from_json
from ..records.schema import IDS_PER_STATEMENT

if TYPE_CHECKING:
    from ..records.store import Store

_UNFINISHED = f"state NOT IN ({', '.join('?' * len(JobState.FINAL))})"


def waiting_rows(store: Store) -> list[tuple[int, str, Optional[str]]]:
    """(id, spec as stored, waiting reason) of each job `_waiting` says waits, by id."""
    rows = store.db.execute(
        "SELECT id, spec, waiting FROM jobs WHERE state=? AND gpus IS NULL AND prepared != 0 ORDER BY id",
        (JobState.QUEUED,),
    )
    return [(job_id, spec, why) for job_id, spec, why in rows]


def scheduled(store: Store) -> list[tuple[int, list[str]]]:
    """Each unfinished job that was given its devices (maybe none), by id, with them."""
    rows = store.db.execute(
        f"SELECT id, gpus FROM jobs WHERE {_UNFINISHED} AND gpus IS NOT NULL ORDER BY id", JobState.FINAL
    )
    return [(job_id, json.loads(gpus)) for job_id, gpus in rows]


def cpu_jobs(store: Store, scheduled: list[tuple[int, list[str]]]) -> int:
    """How many of the `scheduled` jobs run without GPUs and take a CPU-only job slot: all but services (they
    mostly wait), whose specs alone are decoded (they, and few others, match SERVICE_LIKE)."""
    cpu = [job_id for job_id, devices in scheduled if not devices]
    services = 0
    for start in range(0, len(cpu), IDS_PER_STATEMENT):
        chunk = cpu[start : start + IDS_PER_STATEMENT]
        rows = store.db.execute(
            f"SELECT spec FROM jobs WHERE id IN ({', '.join('?' * len(chunk))}) AND spec LIKE ?", (*chunk, SERVICE_LIKE)
        )
        services += sum(1 for (spec,) in rows if from_json(spec).service is not None)
    return len(cpu) - services


def after_states(store: Store, refs: set[int]) -> dict[int, tuple[str, Optional[int]]]:
    """The state and restart (`restarted_as`) of each job of `refs` there is, and of each restart of one, to
    the last: all that the waiting jobs' `--after` checks need, in a query a few hundred jobs."""
    found: dict[int, tuple[str, Optional[int]]] = {}
    while refs:
        ids = sorted(refs)
        for start in range(0, len(ids), IDS_PER_STATEMENT):
            chunk = ids[start : start + IDS_PER_STATEMENT]
            rows = store.db.execute(
                f"SELECT id, state, restarted_as FROM jobs WHERE id IN ({', '.join('?' * len(chunk))})", chunk
            )
            found.update((job_id, (state, again)) for job_id, state, again in rows)
        refs = {again for ref in refs if ref in found and (again := found[ref][1]) is not None} - found.keys()
    return found
