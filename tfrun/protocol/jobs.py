"""Job records and the requests that create, list, wait on, cancel, restart and remove jobs."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Annotated, Optional

from tfrun.constants import (
    MAX_CANCEL_JOBS,
    MAX_GRACE_S,
    MAX_REMOVE_JOBS,
)
from tfrun.protocol.fields import JobRef, Limit, Offset, Range, State
from tfrun.protocol.wire import Message, Request, tagged


@dataclass
class Job:
    """Everything a client may see of a job. Secrets never go here: `env` holds what the user passed."""

    id: int
    state: State
    script: str
    args: list[str]
    command: list[str]  # the argv the shim runs
    workdir: str  # the snapshot the job runs in
    job_dir: str
    log_path: str
    checkpoint_dir: str
    created_at: float
    name: Optional[str] = None
    env: dict[str, str] = field(default_factory=dict)
    started_at: Optional[float] = None
    finished_at: Optional[float] = None
    exit_code: Optional[int] = None  # as a shell reports it: the code, or 128+N for signal N
    signal: Optional[int] = None
    pid: Optional[int] = None
    reason: Optional[str] = None  # why it failed to start, was lost, or was cancelled
    source: Optional[str] = None  # the work dir it was snapshotted from, on the client's machine
    git_commit: Optional[str] = None
    git_dirty: Optional[bool] = None
    files: int = 0  # entries in the snapshot
    bytes: int = 0  # bytes in the snapshot
    restart_of: Optional[int] = None  # the job this one runs again (same snapshot, same checkpoint folder)
    restarted_as: Optional[int] = None  # the job that runs this one again
    restarts_left: int = 0  # automatic restarts still allowed after a failure (submit --max-restarts)
    restart_on: list[str] = field(default_factory=list)  # the causes that restart it (submit --restart-on)
    restarts: int = 0  # automatic restarts before this job in its chain: 0 for a submit's
    # why it failed or was lost, as --restart-on names causes (tfrun/restarts.py): lost, oom, signal, error;
    # None while it runs, once it succeeded or was cancelled, or if it ended under a tfrund without causes
    cause: Optional[str] = None
    alert_rules: list[str] = field(default_factory=list)  # the rules that watch it, e.g. "stall=30m"
    notify: list[str] = field(default_factory=list)  # its own alert URLs, secrets masked (never the URLs)
    gpus_requested: int = 0  # GPUs it asked for (submit --gpus)
    gpus: list[str] = field(default_factory=list)  # the devices it was given (CUDA_VISIBLE_DEVICES)
    priority: int = 0  # higher starts first among waiting jobs
    after: list[int] = field(default_factory=list)  # jobs that must succeed before it starts
    waiting: Optional[str] = None  # why a queued job has not started yet
    tty: bool = False  # it runs in a tmux session that `tfrun attach` opens
    array_id: Optional[int] = None  # a task of an array (submit --array): the array's id, its first task's
    array_index: Optional[int] = None  # its index in the array, 0 to N-1
    service: Optional[str] = None  # a service's kind (tensorboard, jupyter: tfrun/protocol/services.py), else None
    port: Optional[int] = None  # the box port a service listens on (its 127.0.0.1)


@dataclass
class CancelResult:
    """What `Cancel` did to one of the jobs named."""

    job: str
    ok: bool
    message: str
    id: Optional[int] = None
    state: Optional[str] = None


@dataclass
class Removal:
    """What `Remove` or `Prune` did (with `dry_run`: would do) to one job."""

    job: str  # the reference as given (for `Prune`, the id)
    ok: bool  # removed (or would be); else `message` says why it stays
    message: str = ""  # why it stays; for a removed job, what could not be deleted, if anything
    id: Optional[int] = None
    bytes: int = 0  # freed on disk: its folder, and its checkpoint folder where that goes too
    checkpoint_dir: Optional[str] = None
    # its checkpoint folder: "removed", "kept" (not asked to), "shared" (a kept job's too), "foreign" (not one
    # this daemon made: never deleted, runner/checkpoints.py), "" (none there)
    checkpoints: str = ""


@tagged("job")
@dataclass
class JobReply(Message):
    job: Job


@tagged("jobs")
@dataclass
class JobList(Message):
    jobs: list[Job]


@tagged("cancelled")
@dataclass
class CancelReply(Message):
    results: list[CancelResult]


@tagged("attach_reply")
@dataclass
class AttachReply(Message):
    """The command that attaches a terminal to the job's tmux session, to run on the box."""

    command: list[str]


@tagged("remove_reply")
@dataclass
class RemoveReply(Message):
    results: list[Removal]
    blobs: int = 0  # uploaded contents collected (with dry_run: that would be) once the jobs were gone
    blob_bytes: int = 0
    dry_run: bool = False


@tagged("restart")
@dataclass
class Restart(Request[JobReply]):
    """Run an ended job again as a new job: its snapshot, command and checkpoint folder. Answered by
    `JobReply` with the new job."""

    job: JobRef


@tagged("list")
@dataclass
class ListJobs(Request[JobList]):
    """Jobs that are not final, or every job with `all`; services (TensorBoard, Jupyter) too with `services`."""

    all: bool = False
    services: bool = False


@tagged("get")
@dataclass
class GetJob(Request[JobReply]):
    """One job by id or name (a name means the newest job of that name)."""

    job: JobRef


@tagged("cancel")
@dataclass
class Cancel(Request[CancelReply]):
    """SIGTERM each job's process group, SIGKILL after `grace` seconds; answered once all have ended."""

    jobs: Annotated[list[JobRef], Limit(items=MAX_CANCEL_JOBS)]
    grace: Optional[Annotated[float, Range(0, MAX_GRACE_S)]] = None


@tagged("wait")
@dataclass
class Wait(Request[JobReply]):
    """Answered with the job's record once it is final."""

    job: JobRef


@tagged("attach")
@dataclass
class Attach(Request[AttachReply]):
    """How to open a running `--tty` job's session: answered by `AttachReply`."""

    job: JobRef


@tagged("remove")
@dataclass
class Remove(Request[RemoveReply]):
    """Remove ended jobs: their folders and records, their checkpoint folders with `checkpoints` (where no
    kept job shares them), then the uploaded contents no kept job needs (runner/housekeeping.py). With
    `dry_run`, only say what would go. Answered by `RemoveReply`."""

    jobs: Annotated[list[JobRef], Limit(items=MAX_REMOVE_JOBS)]
    checkpoints: bool = False
    dry_run: bool = False


@tagged("prune")
@dataclass
class Prune(Request[RemoveReply]):
    """Remove the ended jobs that ended more than `older_than` seconds ago, less the `keep_last` that ended
    last (both given: picked by both; neither: no job), as `Remove` does; answered by `RemoveReply`."""

    older_than: Optional[Annotated[float, Range(0, math.inf)]] = None
    keep_last: Optional[Offset] = None
    checkpoints: bool = False
    dry_run: bool = False
