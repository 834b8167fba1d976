"""Calls on checkpoints in object storage (tfrun/protocol/storage.py): what a job's checkpoints became, and a job
resumed on a box from its stored folder."""

from __future__ import annotations

from typing import Optional

from tfrun.protocol.jobs import Job, JobReply
from tfrun.protocol.storage import ListStored, Resume, StoredReply

from . import Call, whole


def stored(job: str) -> Call[StoredReply, StoredReply]:
    """Each of the job's checkpoints, on the box and in storage, and what keeps its uploads back, if anything."""
    return Call(ListStored(job=job), whole)


def resume(place: str, env: dict[str, str], gpus: Optional[int], python: Optional[str]) -> Call[JobReply, Job]:
    """A new job on the box from the stored folder `place`, its newest checkpoint restored first."""
    return Call(Resume(place=place, env=env, gpus=gpus, python=python), lambda reply: reply.job)
