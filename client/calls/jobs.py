"""Calls on jobs (tfrun/protocol/jobs.py): their list, one job's record, cancel, restart, wait."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Optional

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
)

from . import Call, whole

if TYPE_CHECKING:
    from tfrun.protocol.fields import State


def job_list(
    all: bool = False,
    last: Optional[int] = None,
    services: bool = False,
    text: bool = False,
    before: Optional[int] = None,
    states: Sequence[State] = (),
    match: str = "",
) -> Call[JobList, JobList]:
    """The jobs that have not ended (`all`: every one; `last`: the newest `last`; `services`: TensorBoard and
    Jupyter too), as the whole reply: an older tfrund sends every job, and `joblist.newest` cuts it. With
    `text`, the list comes as JSON text in parts (`ps --json`), for `each`. `before` (an id), `states` and
    `match` (an id, or part of a name) narrow it on the box: a page of `tfrun ui`'s jobs table."""
    return Call(
        ListJobs(all=all, services=services, last=last, text=text, before=before, states=list(states), match=match),
        whole,
    )


def services() -> Call[JobList, list[Job]]:
    """The services (TensorBoard, Jupyter) that have not ended."""
    return Call(ListJobs(services=True), lambda reply: [job for job in reply.jobs if job.service])


def job(ref: str) -> Call[JobReply, Job]:
    """One job's record, by id or name (a name means the newest job of that name)."""
    return Call(GetJob(job=ref), _job)


def cancel(jobs: list[str], grace: Optional[float] = None) -> Call[CancelReply, list[CancelResult]]:
    """SIGTERM the jobs, SIGKILL after `grace` s; answered once all have ended, a result a job."""
    return Call(Cancel(jobs=jobs, grace=grace), lambda reply: reply.results)


def restart(ref: str) -> Call[JobReply, Job]:
    """An ended job run again as a new job; the new job's record."""
    return Call(Restart(job=ref), _job)


def wait(ref: str) -> Call[JobReply, Job]:
    """The job's record once it has ended (a restarted one names its restart: `restarted_as`)."""
    return Call(Wait(job=ref), _job)


def _job(reply: JobReply) -> Job:
    return reply.job
