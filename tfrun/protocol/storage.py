"""Checkpoints in object storage (tfrun/storage/, runner/storage/): what a job's checkpoints became there
(`ListStored`, answered by `StoredReply`, as `tfrun checkpoints` shows it), and a job resumed on this box from its
stored folder (`Resume`, answered by `JobReply`, as `tfrun restart --host` asks another box)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Annotated, Optional

from tfrun.constants import MAX_STORAGE_URL
from tfrun.protocol.fields import UTF8, JobRef, Limit, Offset, OsText
from tfrun.protocol.jobs import JobReply
from tfrun.protocol.wire import Message, Request, tagged


@dataclass
class StoredState:
    """One checkpoint, on the box and in storage."""

    name: str  # a TensorFlow prefix ("ckpt-5") or a file's path in the checkpoint folder
    kind: str  # "tensorflow" or "file"
    saved_at: float
    bytes: int
    on_box: bool  # its files are in the checkpoint folder now
    # "stored" (uploaded and verified), "waiting" (not yet: `error` says why when it failed), "gone" (deleted on
    # the box before it was stored), "" (not for storage: the job has no destination)
    storage: str
    stored_at: Optional[float] = None
    error: Optional[str] = None
    step: Optional[int] = None  # the step its name ends with (ckpt-1200, weights.03.h5), where it has one


@tagged("stored_reply")
@dataclass
class StoredReply(Message):
    checkpoints: list[StoredState]
    place: Optional[str] = None  # the job's stored folder; None: its checkpoints stay on the box
    problem: Optional[str] = None  # one line when storage cannot be used now (unreachable, refused, no bucket)
    failing_since: Optional[float] = None  # when the uploads began to fail (an outage's start)


@tagged("list_stored")
@dataclass
class ListStored(Request[StoredReply]):
    """Each checkpoint of a job: in its folder on the box, in storage, or both. Answered by `StoredReply`."""

    job: JobRef


@tagged("resume")
@dataclass
class Resume(Request[JobReply]):
    """Make a job on this box from a job's stored folder (its record, snapshot and newest checkpoint, put
    there by the box it ran on), restored before its script starts; it goes on storing to the same folder.
    `env` gives the job's --env values again: storage keeps their names, never their values."""

    place: Annotated[str, UTF8, Limit(chars=MAX_STORAGE_URL)]
    env: dict[str, str] = field(default_factory=dict)
    gpus: Optional[Offset] = None
    python: Optional[OsText] = None  # the interpreter of a .py script on this box (None: its job_python)
