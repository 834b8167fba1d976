"""Job records and the requests that create, list, wait on, cancel, restart and remove jobs; and a job record
as `tfrun ps --json` prints it (`record_text`), which the daemon sends a long listing as."""

from __future__ import annotations

import functools
import json
import math
import operator
import typing
from collections.abc import Callable
from dataclasses import dataclass, field, fields
from json.encoder import encode_basestring_ascii
from typing import Annotated, Any, Literal, Optional, Union

from tfrun.constants import (
    MAX_CANCEL_JOBS,
    MAX_GRACE_S,
    MAX_NAME,
)
from tfrun.protocol.fields import JobRef, JobState, Limit, Offset, Range, State, Text
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
    checkpoints_to: Optional[str] = None  # its stored folder in object storage (submit --checkpoints-to), else None


@dataclass
class CancelResult:
    """What `Cancel` did to one of the jobs named."""

    job: str
    ok: bool
    message: str
    id: Optional[int] = None
    state: Optional[str] = None


@tagged("job")
@dataclass
class JobReply(Message):
    job: Job


@tagged("jobs")
@dataclass
class JobList(Message):
    """Jobs, oldest first. To a `ListJobs` that asked for `text`: no records, but the JSON text of the list as
    `tfrun ps --json` prints it, in parts of at most MAX_PAYLOAD_BYTES, each but the last with `more`, so that
    a long history streams and costs one encoding a job (a tfrund older than `text` sends the records)."""

    jobs: list[Job] = field(default_factory=list)
    older: Offset = 0  # jobs listed but left out by `ListJobs.last`: all older than these
    more: bool = False  # another part follows
    data: bytes = b""  # a part of the text, ASCII


@tagged("cancelled")
@dataclass
class CancelReply(Message):
    results: list[CancelResult]


@tagged("restart")
@dataclass
class Restart(Request[JobReply]):
    """Run an ended job again as a new job: its snapshot, command and checkpoint folder. Answered by
    `JobReply` with the new job."""

    job: JobRef


@tagged("list")
@dataclass
class ListJobs(Request[JobList]):
    """Jobs that are not final, or every job with `all`; services (TensorBoard, Jupyter) too with `services`;
    with `last`, only the newest `last` of them. An older tfrund ignores `last` and `text` and sends every
    job's record: the client cuts the list itself (protocol 3 either way).

    `before`, `states` and `match` narrow the list in the daemon's query, so that a page of a long history
    (`tfrun ui`'s: the 50 newest failed jobs, then the 50 before those) costs what the page holds. They came
    within protocol 4, which no released tfrund speaks without them."""

    all: bool = False
    services: bool = False
    last: Optional[Offset] = None  # only the newest this many (by id); `JobList.older` counts the others
    text: bool = False  # answered by the list's JSON text in parts (`JobList.data`), not by records
    before: Optional[Offset] = None  # only jobs with a smaller id: the page after one whose oldest job this is
    states: Annotated[list[State], Limit(items=len(JobState.ALL))] = field(default_factory=list)  # only these
    match: Annotated[Text, Limit(chars=MAX_NAME)] = ""  # only the job of this id, or whose name holds this text


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


def record_text(job: Job) -> str:
    """`job` as `json.dumps(records, indent=2)` writes `dataclasses.asdict(job)` as an item of the list: what
    `tfrun ps --json` prints for it, byte for byte (tests/test_protocol.py compares them). In a sixth of the
    time: asdict copies deeply and the indenting encoder is pure Python, which made a history of 10,000
    jobs cost seconds; each string here goes through json's own C encoder."""
    heads, encoders, values = _record_fields()
    return "  {\n" + ",\n".join([h + encode(v) for h, encode, v in zip(heads, encoders, values(job))]) + "\n  }"


Encoder = Callable[[Any], str]


@functools.cache
def _record_fields() -> tuple[tuple[str, ...], tuple[Encoder, ...], Callable[[Job], tuple[Any, ...]]]:
    """`Job`'s fields in order: each key as written (`    "id": `), how each value is written, and what reads
    them all off a job at once."""
    hints = typing.get_type_hints(Job)
    names = [f.name for f in fields(Job)]
    heads = tuple(f"    {encode_basestring_ascii(name)}: " for name in names)
    return heads, tuple(_encoder(hints[name]) for name in names), operator.attrgetter(*names)


def _encoder(tp: Any) -> Encoder:
    """How json.dumps(indent=2) writes a value of type `tp` that is a field of a record in a list: a list or
    a dict one item a line, six spaces in, an empty one as [] or {}."""
    origin = typing.get_origin(tp)
    if origin is Union:
        inner = _encoder(next(arg for arg in typing.get_args(tp) if arg is not type(None)))
        return lambda value: "null" if value is None else inner(value)
    if origin is list:
        item = _encoder(typing.get_args(tp)[0])
        return lambda value: "[\n      " + ",\n      ".join(map(item, value)) + "\n    ]" if value else "[]"
    if origin is dict:
        item = _encoder(typing.get_args(tp)[1])
        return lambda value: (
            "{\n      " + ",\n      ".join([f"{encode_basestring_ascii(k)}: {item(v)}" for k, v in value.items()])
            + "\n    }" if value else "{}"
        )  # fmt: skip
    if tp is bool:
        return lambda value: "true" if value else "false"
    if tp is int:
        return int.__repr__
    if tp is float:
        return _float
    if tp is str or origin is Literal:  # a state is a Literal of strings
        return encode_basestring_ascii
    raise TypeError(f"no JSON text for a field of type {tp!r}")  # a field type added to Job: a case to add here


def _float(value: float) -> str:
    """A float as json writes it: its repr (an int where a float belongs as the checks make it, 5.0)."""
    number = float(value)
    return repr(number) if math.isfinite(number) else json.dumps(number)
