"""The whole wire format between `tfrun` and `tfrund`, in one file.

A connection carries frames. A frame is one line of JSON (the header, at most MAX_HEADER_BYTES) naming
its message type in "type"; a message with a `data: bytes` field sends those bytes raw right after the
header, their length in the header's "size", so log bytes cross without base64 or re-encoding.

A conversation: the client sends `Hello`, the daemon answers `Hello` (or `Error` with code
"version_mismatch"); then the client sends requests, each answered by one response, except `ReadLog`
(any number of `LogChunk` or `LogLines`, then one `LogEnd`) and `ReadFile` (`FileChunk`s, the last one marked). A
submit uploads first: `HaveBlobs` names the contents of the work dir by SHA-256, the daemon answers
with the ones it lacks, the client sends those, small ones packed together in `PutBlobs` and large ones
in `PutBlob` chunks (each frame of `PutBlobs` and each last chunk answered by `Ok`, so the client may
send many before reading), then `Submit` lists the files. Either side may close
after a response. Each request class names what answers it (`class Wait(Request[JobReply])`), and
`Channel.ask` checks every reply against that in one place.

Strings are JSON with non-ASCII escaped, so a file name that is not UTF-8 (held as Python's
surrogate escapes) crosses intact and becomes the same bytes on the other side.

Every message is checked on the way in against the types declared here, so a malformed or hostile frame
is refused with an `Error` instead of reaching a handler. The declarations carry the bounds (see "Field
types" below): a number outside its `Range`, a list or string beyond its `Limit`, a float that is NaN or
infinite, a surrogate escape in a `Text` field (job names and references, patterns, URLs: what SQLite stores
and RE2 compiles) never reaches a handler. An int with no declared range is a signed 64-bit integer.
"""

from __future__ import annotations

import dataclasses
import json
import math
import typing
from dataclasses import dataclass, field
from typing import Annotated, Any, ClassVar, Final, Generic, Literal, Optional, Protocol, TypeVar, Union

from tfrun import __version__
from tfrun.constants import (
    MAX_ALERTS,
    MAX_CANCEL_JOBS,
    MAX_CONFIG_VALUES,
    MAX_CONTEXT,
    MAX_ENV,
    MAX_GRACE_S,
    MAX_HEADER_BYTES,
    MAX_INT64,
    MAX_LIST_ITEMS,
    MAX_NAME,
    MAX_PATTERN_CHARS,
    MAX_PATTERNS,
    MAX_PAYLOAD_BYTES,
    MAX_PRIORITY,
    MAX_REMOVE_JOBS,
    MAX_RESTARTS,
    MAX_STRING,
    MAX_TAIL,
    MAX_TOP_LOSSES,
    MAX_TOP_RECENT,
)

# Bump on any change a peer of the previous version would misread. Both sides refuse a mismatch.
PROTOCOL_VERSION = 2


State = Literal["queued", "running", "succeeded", "failed", "cancelled", "lost"]  # a job's, as the wire spells it


class JobState:
    """The states a job moves through (`State`). The last four are final: the job's processes are all gone."""

    QUEUED: Final[State] = "queued"  # recorded, its shim not yet running
    RUNNING: Final[State] = "running"
    SUCCEEDED: Final[State] = "succeeded"  # exited 0
    FAILED: Final[State] = "failed"  # exited non-zero, was killed by a signal, or could not start
    CANCELLED: Final[State] = "cancelled"  # ended after `tfrun cancel`
    LOST: Final[State] = "lost"  # its shim vanished without recording an exit status (e.g. the machine rebooted)

    ALL: tuple[str, ...] = (QUEUED, RUNNING, SUCCEEDED, FAILED, CANCELLED, LOST)
    FINAL: tuple[str, ...] = (SUCCEEDED, FAILED, CANCELLED, LOST)


class ErrorCode:
    """Machine-readable reasons in `Error.code`; the message says the same to a person."""

    VERSION_MISMATCH = "version_mismatch"
    BAD_REQUEST = "bad_request"
    NO_SUCH_JOB = "no_such_job"
    INVALID_INPUT = "invalid_input"  # well-formed, but cannot be done (missing script, unreadable folder)
    INTERNAL = "internal"
    CANNOT_START = "cannot_start"  # no daemon runs and none could start: `tfrund dial-stdio` answers for it


class ProtocolError(Exception):
    """A frame that cannot be read as a message of this protocol."""


class ConnectionClosed(ProtocolError):
    """The other end hung up before its answer was whole: a daemon that died, a dropped SSH link. Unlike a
    garbled frame, it may be gone for a moment only, so a client that can resume tries again."""


class Message:
    """Base of every message; subclasses are dataclasses registered under their TYPE."""

    TYPE: ClassVar[str] = ""


R = TypeVar("R", bound=Message, covariant=True)


class Request(Message, Generic[R]):
    """A message from client to daemon that names what it is answered with: `class Wait(Request[JobReply])`.
    `REPLIES` holds the reply classes (several for a streamed answer, as `ReadLog`'s), read from that base
    class once, so that `Channel.ask` checks every reply in one place (besides an `Error`, which any request
    may get)."""

    REPLIES: ClassVar[tuple[type[Message], ...]] = ()

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        for base in getattr(cls, "__orig_bases__", ()):
            if typing.get_origin(base) is Request:
                (reply,) = typing.get_args(base)
                cls.REPLIES = typing.get_args(reply) if typing.get_origin(reply) is Union else (reply,)


_REGISTRY: dict[str, type[Message]] = {}
M = TypeVar("M", bound=type[Message])
T = TypeVar("T", bound=Message)


def _message(tag: str) -> typing.Callable[[M], M]:
    """Register a message class under its wire tag."""

    def register(cls: M) -> M:
        cls.TYPE = tag
        _REGISTRY[tag] = cls
        return cls

    return register


# ---------------------------------------------------------------------------------------------------------
# Field types: the bounds a field's values must keep, declared with the field (typing.Annotated)


@dataclass(frozen=True)
class Range:
    """The inclusive bounds of a number: ints for an int field (a float would round 2^63-1 when shown)."""

    low: Union[int, float]
    high: Union[int, float]


@dataclass(frozen=True)
class Limit:
    """At most `items` entries in a list; at most `chars` characters in a string, or in a list's strings
    together (what a request may make the daemon compile or hold)."""

    items: int = MAX_LIST_ITEMS
    chars: Optional[int] = None  # a string: MAX_STRING; a list: no bound of its own


class _Marker:
    """A property of a field's values beyond its bounds; named, so that a field's declaration reads well."""

    def __init__(self, name: str) -> None:
        self.name = name

    def __repr__(self) -> str:
        return self.name


# A plain `str` may hold surrogate escapes (U+DC80 to U+DCFF, as os.fsdecode makes them), so that file names
# and arguments that are not UTF-8 cross intact; no other surrogate, as it stands for no byte.
# A `Text` holds none: it is bound to SQLite, compiled by RE2, or compared with names that are UTF-8.
UTF8 = _Marker("UTF8")
NON_FINITE = _Marker("NON_FINITE")  # a float that may be NaN or infinite (a loss that diverged); others may not

Text = Annotated[str, UTF8]
JobRef = Annotated[str, UTF8, Limit(chars=MAX_NAME)]  # an id (ASCII digits) or a name; see is_job_id
Offset = Annotated[int, Range(0, MAX_INT64)]  # a byte offset or size, a count
Mode = Annotated[int, Range(0, 0o7777)]
Reading = Annotated[float, NON_FINITE]
Patterns = Annotated[list[Text], Limit(items=MAX_PATTERNS, chars=MAX_PATTERN_CHARS)]
Context = Annotated[int, Range(0, MAX_CONTEXT)]


def is_job_id(ref: str) -> bool:
    """Whether `ref` is written as a job id: ASCII digits only ("²" and "١٢" are names, as int() would not
    read them as the user meant)."""
    return ref.isascii() and ref.isdigit()


# ---------------------------------------------------------------------------------------------------------
# Shared records


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
    alert_rules: list[str] = field(default_factory=list)  # the rules that watch it, e.g. "stall=30m"
    notify: list[str] = field(default_factory=list)  # its own alert URLs, secrets masked (never the URLs)
    gpus_requested: int = 0  # GPUs it asked for (submit --gpus)
    gpus: list[str] = field(default_factory=list)  # the devices it was given (CUDA_VISIBLE_DEVICES)
    priority: int = 0  # higher starts first among waiting jobs
    after: list[int] = field(default_factory=list)  # jobs that must succeed before it starts
    waiting: Optional[str] = None  # why a queued job has not started yet
    tty: bool = False  # it runs in a tmux session that `tfrun attach` opens


@dataclass
class FileEntry:
    """One entry of a work dir snapshot, or of a folder listed for `tfrun pull`.

    `path` is relative and '/'-separated, never absolute, never with '..'; the daemon checks again.
    """

    path: str
    kind: str  # "file", "dir" or "symlink"
    mode: Mode = 0o644
    size: Offset = 0
    digest: Optional[Text] = None  # SHA-256 of a file's content, hex
    target: Optional[str] = None  # a symlink's target, as it was
    mtime: Optional[float] = None  # when it was last written (listings only)


FILE_KINDS = ("file", "dir", "symlink")


@dataclass
class CancelResult:
    """What `Cancel` did to one of the jobs named."""

    job: str
    ok: bool
    message: str
    id: Optional[int] = None
    state: Optional[str] = None


@dataclass
class Delivery:
    """One alert's way to one notification URL: `target` is the URL with its secrets masked."""

    target: str
    state: str  # "pending" (will retry), "sent", "expired" (gave up), or for `NotifyTest`: "sent"/"failed"
    attempts: int = 0
    sent_at: Optional[float] = None
    error: Optional[str] = None  # the last failure, secrets masked
    next_at: Optional[float] = None  # when a pending delivery is tried again


@dataclass
class Alert:
    """An alert as the daemon recorded it (before sending it anywhere)."""

    id: int
    rule: str  # oom, spike, stall, failed, done, lost, gpu-memory
    at: float
    summary: str  # one line
    body: str  # the whole message: host, job, the metric context, the last lines of output, checkpoints
    job_id: Optional[int] = None  # None for the box's own alerts (gpu-memory)
    deliveries: list[Delivery] = field(default_factory=list)


@dataclass
class Gpu:
    """One of the box's GPUs as `tfrun gpus` shows it; figures are None where NVML cannot be asked."""

    device: str  # as jobs are given it in CUDA_VISIBLE_DEVICES: an index or a UUID
    name: Optional[str] = None
    memory_used: Optional[int] = None  # bytes
    memory_total: Optional[int] = None
    utilization: Optional[int] = None  # percent
    job: Optional[int] = None  # the unfinished job it is given to


@dataclass
class MetricSample:
    """Metrics at one step of a job: from the tfrun.jobs callback (exact) or read from its log."""

    step: int
    values: dict[str, Reading]
    epoch: Optional[int] = None
    time: Optional[float] = None


@dataclass
class LineReading:
    """One line of a job's output as the daemon reads it for metrics (`tfrun metrics --explain`)."""

    line: str  # the line, ANSI colours removed, cut to 160 characters
    lines: int  # lines of the log of this shape (the same but for their numbers)
    why: str  # how it was read, or why nothing was
    values: dict[str, Reading] = field(default_factory=dict)  # what was read from it
    step: Optional[int] = None
    epoch: Optional[int] = None


@dataclass
class Removal:
    """What `Remove` or `Prune` did (with `dry_run`: would do) to one job."""

    job: str  # the reference as given (for `Prune`, the id)
    ok: bool  # removed (or would be); else `message` says why it stays
    message: str = ""  # why it stays; for a removed job, what could not be deleted, if anything
    id: Optional[int] = None
    bytes: int = 0  # freed on disk: its folder, and its checkpoint folder where that goes too
    checkpoint_dir: Optional[str] = None
    # its checkpoint folder: "removed", "kept" (not asked to), "shared" (a kept job's too), "" (none there)
    checkpoints: str = ""


@dataclass
class FolderUsage:
    """One line of `tfrun df`: bytes on disk as `du` counts them, and regular files."""

    name: str  # jobs (less their logs), logs, blobs, spares, checkpoints, database, other
    path: str
    bytes: int
    files: int


# ---------------------------------------------------------------------------------------------------------
# Handshake


@_message("hello")
@dataclass
class Hello(Message):
    """First frame each way. `role` is "client" or "daemon"; `version` is the package version."""

    protocol: int
    version: Text
    role: Text


# ---------------------------------------------------------------------------------------------------------
# Responses (daemon to client)


@_message("error")
@dataclass
class Error(Message):
    code: str
    message: str


@_message("job")
@dataclass
class JobReply(Message):
    job: Job


@_message("jobs")
@dataclass
class JobList(Message):
    jobs: list[Job]


@_message("cancelled")
@dataclass
class CancelReply(Message):
    results: list[CancelResult]


@_message("log_chunk")
@dataclass
class LogChunk(Message):
    """Bytes of the job's log starting at byte `offset` of the file."""

    offset: int
    data: bytes


@_message("log_lines")
@dataclass
class LogLines(Message):
    """Finished lines that passed the filter, as UTF-8 text each ending in a newline; they lie between
    byte `offset` and `next_offset` of the log, where a follower that reconnects resumes."""

    offset: int
    next_offset: int
    data: bytes


@_message("log_end")
@dataclass
class LogEnd(Message):
    """No more bytes: `offset` is the end of the log; the job's final state when it has ended."""

    offset: int
    state: str
    exit_code: Optional[int] = None
    restarted_as: Optional[int] = None  # the job that carries on after this one failed, if any


@_message("missing_blobs")
@dataclass
class MissingBlobs(Message):
    digests: list[str]


@_message("file_list")
@dataclass
class FileList(Message):
    files: list[FileEntry]


@_message("file_chunk")
@dataclass
class FileChunk(Message):
    offset: int
    last: bool
    data: bytes


@_message("alerts")
@dataclass
class AlertList(Message):
    alerts: list[Alert]


@_message("notify_report")
@dataclass
class NotifyReport(Message):
    results: list[Delivery]


@_message("metrics")
@dataclass
class MetricsReply(Message):
    """`source`: "callback" (tfrun.jobs wrote them), "log" (read from the output), or "none" yet."""

    source: str
    samples: list[MetricSample]


@_message("metrics_explained")
@dataclass
class MetricsExplained(Message):
    """`truncated`: the log is longer than what was read (its first 8 MiB)."""

    readings: list[LineReading]
    truncated: bool = False


@_message("gpus")
@dataclass
class GpuList(Message):
    gpus: list[Gpu]


@_message("top_reply")
@dataclass
class TopReply(Message):
    jobs: list[Job]
    gpus: list[Gpu]
    losses: dict[str, list[Reading]]  # job id -> its last losses, oldest first
    host: str = ""


@_message("attach_reply")
@dataclass
class AttachReply(Message):
    """The command that attaches a terminal to the job's tmux session, to run on the box."""

    command: list[str]


@_message("daemon_info")
@dataclass
class DaemonInfo(Message):
    pid: int
    version: str
    protocol: int
    home: str
    socket: str
    started_at: float
    jobs: dict[str, int]  # count of jobs by state


@_message("ok")
@dataclass
class Ok(Message):
    message: str = ""


@_message("remove_reply")
@dataclass
class RemoveReply(Message):
    results: list[Removal]
    blobs: int = 0  # uploaded contents collected (with dry_run: that would be) once the jobs were gone
    blob_bytes: int = 0
    dry_run: bool = False


@_message("disk_report")
@dataclass
class DiskReport(Message):
    home: str
    folders: list[FolderUsage]
    free: int  # bytes free to the daemon on the filesystem of its home
    jobs: int  # job records
    unneeded: int  # bytes of uploaded contents that no job or spare names: what `tfrun prune` frees


@dataclass
class Setting:
    """One key of the daemon's config as it is in use."""

    key: str  # "notify", or "alerts.cooldown" for a key in a table
    value: str  # JSON; URLs with their secrets masked
    source: str  # "config.toml", "default" (or how the default is found), or the variable that overrides the file


@_message("config")
@dataclass
class ConfigReply(Message):
    path: str  # the daemon's config.toml
    settings: list[Setting]
    changes: list[str] = field(default_factory=list)  # after a reload: each key that changed, and from when


@dataclass
class Check:
    """One line of `tfrun doctor`: `status` is "ok", "warn" (works, but see `advice`) or "fail"."""

    name: str
    status: str
    detail: str
    advice: Optional[str] = None


@_message("doctor_report")
@dataclass
class DoctorReport(Message):
    checks: list[Check]


# ---------------------------------------------------------------------------------------------------------
# Requests (client to daemon)


@_message("have_blobs")
@dataclass
class HaveBlobs(Request[MissingBlobs]):
    """Which of these contents (SHA-256, hex) does the daemon lack? Answered by `MissingBlobs`."""

    digests: list[Text]


@_message("put_blob")
@dataclass
class PutBlob(Request[Ok]):
    """Bytes of one content, from `offset`; the chunk with `last` is answered by `Ok` once stored."""

    digest: Text
    offset: Offset
    last: bool
    data: bytes


@_message("put_blobs")
@dataclass
class PutBlobs(Request[Ok]):
    """Several whole small contents in one frame, their bytes one after another; answered by `Ok`."""

    digests: list[Text]
    sizes: list[Annotated[int, Range(0, MAX_PAYLOAD_BYTES)]]
    data: bytes


@_message("submit")
@dataclass
class Submit(Request[JobReply]):
    """Run `script` from a snapshot made of `files`, whose contents the daemon holds (see `HaveBlobs`).

    `script` is a path among `files`. A `.py` script runs under `python` (the daemon's default job
    interpreter when None); anything else is executed directly.
    """

    files: list[FileEntry]
    script: str
    args: list[str] = field(default_factory=list)
    name: Optional[Text] = None
    env: dict[str, str] = field(default_factory=dict)
    python: Optional[str] = None
    source: Optional[str] = None
    git_commit: Optional[Text] = None
    git_dirty: Optional[bool] = None
    # run it again (same snapshot, same checkpoints) after a failure, up to N times
    max_restarts: Annotated[int, Range(0, MAX_RESTARTS)] = 0
    alerts: list[Text] = field(default_factory=list)  # rules to turn on or tune for this job: "stall=10m", "done"
    no_alerts: list[Text] = field(default_factory=list)  # rules to turn off for this job ("all": every one)
    notify: list[Text] = field(default_factory=list)  # apprise URLs for this job's alerts; secret: never echoed
    metric_patterns: Patterns = field(default_factory=list)  # regexes with named groups for its log's metrics
    gpus: Optional[Offset] = None  # GPUs of its own (None: the daemon's default: 1 where there are GPUs, else 0)
    priority: Annotated[int, Range(-MAX_PRIORITY, MAX_PRIORITY)] = 0  # among waiting jobs, higher starts first
    after: list[JobRef] = field(default_factory=list)  # jobs (ids or names) that must succeed before it starts
    tty: bool = False  # run it in a tmux session on the box that `tfrun attach` opens
    # The client's own id for this submit (a uuid4): the same id again gets the job the first one made, so a
    # client whose daemon died before answering can send it again without running the job twice.
    submission_id: Optional[Annotated[str, UTF8, Limit(chars=MAX_NAME)]] = None


@_message("doctor")
@dataclass
class Doctor(Request[DoctorReport]):
    """Check the box's health for training (runner/doctor.py); answered by `DoctorReport`.
    `python`: the job interpreter to check (default: the one jobs get)."""

    python: Optional[str] = None


@_message("restart")
@dataclass
class Restart(Request[JobReply]):
    """Run an ended job again as a new job: its snapshot, command and checkpoint folder. Answered by
    `JobReply` with the new job."""

    job: JobRef


@_message("list")
@dataclass
class ListJobs(Request[JobList]):
    """Jobs that are not final, or every job with `all`."""

    all: bool = False


@_message("get")
@dataclass
class GetJob(Request[JobReply]):
    """One job by id or name (a name means the newest job of that name)."""

    job: JobRef


@_message("cancel")
@dataclass
class Cancel(Request[CancelReply]):
    """SIGTERM each job's process group, SIGKILL after `grace` seconds; answered once all have ended."""

    jobs: Annotated[list[JobRef], Limit(items=MAX_CANCEL_JOBS)]
    grace: Optional[Annotated[float, Range(0, MAX_GRACE_S)]] = None


@_message("wait")
@dataclass
class Wait(Request[JobReply]):
    """Answered with the job's record once it is final."""

    job: JobRef


@_message("read_log")
@dataclass
class ReadLog(Request[Union[LogChunk, LogLines, LogEnd]]):
    """The job's output from byte `offset`; with `follow`, keep sending until the job ends.

    With no filter the bytes come as they are, in `LogChunk`s. With `patterns`, `tail`, a `since` or
    `timestamps` the daemon reads the log as terminal lines (see runner/lines.py) and sends only the lines
    that pass, in `LogLines`; `offset` must then be a line boundary, as every `LogLines.next_offset` is.
    Times are the box's: seconds since the epoch, from the log's (offset, time) index.
    """

    job: JobRef
    offset: Offset = 0
    follow: bool = False
    patterns: Patterns = field(default_factory=list)  # extended regular expressions, ORed
    invert: bool = False
    ignore_case: bool = False
    fixed: bool = False  # patterns are plain strings
    tail: Optional[Annotated[int, Range(0, MAX_TAIL)]] = None  # only the last N lines (that pass) of what is there now
    after: Context = 0  # lines of context after each match, as grep -A
    before: Context = 0  # and before, as grep -B
    since: Optional[float] = None  # only lines complete at or after this time
    # only lines complete in the last this many seconds (the box's clock)
    since_ago: Optional[Annotated[float, Range(0, math.inf)]] = None
    timestamps: bool = False  # each line starts with the time it was complete, as RFC 3339 in UTC


@_message("list_files")
@dataclass
class ListFiles(Request[FileList]):
    """Entries under `path` of a job's folder (e.g. "work/out", "output.log") or, when `path` starts with
    "checkpoints", of its checkpoint folder. Answered by `FileList`."""

    job: JobRef
    path: str = "checkpoints"


@_message("read_file")
@dataclass
class ReadFile(Request[FileChunk]):
    """A file's bytes from `offset`, in the same namespace as `ListFiles`; answered by `FileChunk`s."""

    job: JobRef
    path: str
    offset: Offset = 0


@_message("list_alerts")
@dataclass
class ListAlerts(Request[AlertList]):
    """Alerts of one job (or of all, newest last), with how their delivery went; answered by `AlertList`."""

    job: Optional[JobRef] = None
    limit: Annotated[int, Range(1, MAX_ALERTS)] = 100


@_message("notify_test")
@dataclass
class NotifyTest(Request[NotifyReport]):
    """Send one test message to `url`, or to each URL the daemon is configured with; answered by
    `NotifyReport` once every attempt is over. Nothing is stored or retried."""

    url: Optional[Text] = None


@_message("get_metrics")
@dataclass
class GetMetrics(Request[MetricsReply]):
    """A job's metrics, the last `last` samples (all when None); answered by `MetricsReply`."""

    job: JobRef
    last: Optional[Annotated[int, Range(1, MAX_INT64)]] = None


@_message("explain_metrics")
@dataclass
class ExplainMetrics(Request[MetricsExplained]):
    """How the daemon reads the job's output for metrics, one line of each shape; answered by
    `MetricsExplained`."""

    job: JobRef
    lines: Annotated[int, Range(1, 1000)] = 30


@_message("list_gpus")
@dataclass
class ListGpus(Request[GpuList]):
    """The box's GPUs, their memory and load, and the job each is given to; answered by `GpuList`."""


@_message("top")
@dataclass
class Top(Request[TopReply]):
    """What `tfrun top` shows, in one round trip: unfinished jobs and the `recent` last ended ones, the
    GPUs, and each shown job's last training losses. Answered by `TopReply`."""

    recent: Annotated[int, Range(0, MAX_TOP_RECENT)] = 5
    losses: Annotated[int, Range(0, MAX_TOP_LOSSES)] = 30


@_message("attach")
@dataclass
class Attach(Request[AttachReply]):
    """How to open a running `--tty` job's session: answered by `AttachReply`."""

    job: JobRef


@_message("daemon_status")
@dataclass
class DaemonStatus(Request[DaemonInfo]):
    """Ask for `DaemonInfo`."""


@_message("shutdown")
@dataclass
class Shutdown(Request[Ok]):
    """Stop the daemon. Jobs keep running; the next daemon re-adopts them."""


@_message("remove")
@dataclass
class Remove(Request[RemoveReply]):
    """Remove ended jobs: their folders and records, their checkpoint folders with `checkpoints` (where no
    kept job shares them), then the uploaded contents no kept job needs (runner/housekeeping.py). With
    `dry_run`, only say what would go. Answered by `RemoveReply`."""

    jobs: Annotated[list[JobRef], Limit(items=MAX_REMOVE_JOBS)]
    checkpoints: bool = False
    dry_run: bool = False


@_message("prune")
@dataclass
class Prune(Request[RemoveReply]):
    """Remove the ended jobs that ended more than `older_than` seconds ago, less the `keep_last` that ended
    last (both given: picked by both; neither: no job), as `Remove` does; answered by `RemoveReply`."""

    older_than: Optional[Annotated[float, Range(0, math.inf)]] = None
    keep_last: Optional[Offset] = None
    checkpoints: bool = False
    dry_run: bool = False


@_message("disk_usage")
@dataclass
class DiskUsage(Request[DiskReport]):
    """What tfrun's folders take on the box; answered by `DiskReport`."""


@_message("get_config")
@dataclass
class GetConfig(Request[ConfigReply]):
    """The daemon's config as it uses it now, secrets masked; answered by `ConfigReply`."""


@_message("reload_config")
@dataclass
class ReloadConfig(Request[ConfigReply]):
    """Read config.toml again and use it from now on, as SIGHUP does; answered by `ConfigReply` with what
    changed. A file the daemon cannot use is refused with an `Error`, and the running config stays."""


@_message("set_config")
@dataclass
class SetConfig(Request[ConfigReply]):
    """Set `key` ("notify", "alerts.cooldown") in config.toml to `values` (one word, or a list's items), or
    remove it with `unset`: the would-be file is loaded first, then only the key's lines are rewritten (every
    comment stays), then it is reloaded. Answered by `ConfigReply` with what changed. `values` may hold
    notify URLs: secret, never echoed."""

    key: Annotated[str, UTF8, Limit(chars=MAX_NAME)]
    values: Annotated[list[Text], Limit(items=MAX_CONFIG_VALUES, chars=MAX_STRING)] = field(default_factory=list)
    unset: bool = False


def client_hello() -> Hello:
    return Hello(protocol=PROTOCOL_VERSION, version=__version__, role="client")


def daemon_hello() -> Hello:
    return Hello(protocol=PROTOCOL_VERSION, version=__version__, role="daemon")


def mismatch_message(client: Hello, daemon: Hello) -> str:
    """One sentence naming both ends' versions and the way out."""
    return (
        f"protocol mismatch: tfrun {client.version} speaks protocol {client.protocol}, "
        f"tfrund {daemon.version} speaks protocol {daemon.protocol}; install the same tfrun version on "
        "both sides (pip install -U tfrun), then restart the daemon with `tfrund stop`"
    )


# ---------------------------------------------------------------------------------------------------------
# Checking values against the declared types


class _Bad(Exception):
    """A value that does not fit its declared type; `where` grows as the error travels out of the value."""

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message
        self.where = ""


Checker = typing.Callable[[Any], Any]
_CHECKERS: dict[Any, Checker] = {}
_PLANS: dict[type[Any], tuple[list[tuple[str, Checker, bool]], Optional[str]]] = {}


def _checker(tp: Any) -> Checker:
    """A function that returns a value converted to `tp` or raises _Bad: built once per type, since
    a manifest of thousands of entries goes through the same few checks thousands of times."""
    found = _CHECKERS.get(tp)
    if found is None:
        found = _CHECKERS[tp] = _make_checker(tp)
    return found


def _make_checker(tp: Any) -> Checker:
    extras: tuple[Any, ...] = ()
    if typing.get_origin(tp) is Annotated:
        tp, *rest = typing.get_args(tp)
        extras = tuple(rest)
    bounds = next((e for e in extras if isinstance(e, Range)), None)
    limit = next((e for e in extras if isinstance(e, Limit)), Limit())
    origin = typing.get_origin(tp)
    if origin is Union:
        inner = _checker(next(o for o in typing.get_args(tp) if o is not type(None)))
        return lambda value: None if value is None else inner(value)
    if origin is Literal:  # a job's state: one of a few words
        allowed = typing.get_args(tp)
        shown = ", ".join(map(str, allowed))
        return lambda value: value if value in allowed else _fail(f"expected one of {shown}")
    if origin is list:
        return _list_checker(_checker(typing.get_args(tp)[0]), limit)
    if origin is dict:
        return _dict_checker(_checker(typing.get_args(tp)[1]))
    if tp is bool:
        return lambda value: value if isinstance(value, bool) else _fail("expected true or false")
    if tp is int:
        return _int_checker(bounds or Range(-MAX_INT64 - 1, MAX_INT64))
    if tp is float:
        return _float_checker(bounds, finite=NON_FINITE not in extras)
    if tp is str:
        return _str_checker(MAX_STRING if limit.chars is None else limit.chars, utf8=UTF8 in extras)
    if dataclasses.is_dataclass(tp) and isinstance(tp, type):
        cls = tp

        def check_record(value: Any) -> Any:
            if not isinstance(value, dict):
                _fail("expected an object")
            return cls(**_kwargs(cls, value))

        return check_record
    raise TypeError(f"unsupported field type {tp!r}")  # a mistake in this file, not in the peer


def _fail(message: str) -> Any:
    raise _Bad(message)


def _int_checker(bounds: Range) -> Checker:
    def check_int(value: Any) -> int:
        if type(value) is not int:
            _fail("expected an integer")
        if not bounds.low <= value <= bounds.high:
            _fail(f"out of range (from {bounds.low} to {bounds.high})")
        return typing.cast(int, value)

    return check_int


def _float_checker(bounds: Optional[Range], finite: bool) -> Checker:
    def check_float(value: Any) -> float:
        if type(value) not in (int, float):
            _fail("expected a number")
        try:
            number = float(value)
        except OverflowError:  # an integer of hundreds of digits
            _fail("out of range")
        if finite and not math.isfinite(number):
            _fail("expected a finite number")
        if bounds is not None and not bounds.low <= number <= bounds.high:
            _fail(f"out of range (from {bounds.low:g} to {bounds.high:g})")
        return number

    return check_float


def _str_checker(chars: int, utf8: bool) -> Checker:
    def check_str(value: Any) -> str:
        if type(value) is not str:
            _fail("expected a string")
        if len(value) > chars:
            _fail(f"longer than {chars} characters")
        if not value.isascii():
            try:
                value.encode("utf-8", "strict" if utf8 else "surrogateescape")
            except UnicodeEncodeError:
                _fail("not UTF-8 text" if utf8 else "a surrogate that stands for no byte")
        return typing.cast(str, value)

    return check_str


_check_str = _str_checker(MAX_STRING, utf8=False)


def _list_checker(item: Checker, limit: Limit) -> Checker:
    def check_list(value: Any) -> list[Any]:
        if not isinstance(value, list):
            _fail("expected a list")
        if len(value) > limit.items:
            _fail(f"more than {limit.items} items")
        out = []
        for i, element in enumerate(value):
            try:
                out.append(item(element))
            except _Bad as exc:
                exc.where = f"[{i}]{exc.where}"
                raise
        if limit.chars is not None and sum(len(e) for e in out) > limit.chars:
            _fail(f"more than {limit.chars} characters together")
        return out

    return check_list


def _dict_checker(item: Checker) -> Checker:
    def check_dict(value: Any) -> dict[str, Any]:
        if not isinstance(value, dict):
            _fail("expected an object")
        if len(value) > MAX_ENV:
            _fail(f"more than {MAX_ENV} entries")
        out = {}
        for key, element in value.items():
            try:
                out[_check_str(key)] = item(element)
            except _Bad as exc:
                exc.where = f".{key}{exc.where}"
                raise
        return out

    return check_dict


def _plan(cls: type[Any]) -> tuple[list[tuple[str, Checker, bool]], Optional[str]]:
    """(name, checker, required) for each field of `cls` but its raw-bytes one, and that one's name."""
    found = _PLANS.get(cls)
    if found is None:
        hints = typing.get_type_hints(cls, include_extras=True)
        fields = [
            (
                f.name,
                _checker(hints[f.name]),
                f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING,
            )
            for f in dataclasses.fields(cls)
            if hints[f.name] is not bytes
        ]
        raw_bytes = next((name for name, tp in hints.items() if tp is bytes), None)
        found = _PLANS[cls] = (fields, raw_bytes)
    return found


def _kwargs(cls: type[Any], raw: dict[str, Any]) -> dict[str, Any]:
    """The checked constructor arguments of `cls` found in `raw`, less any raw-bytes field.

    Unknown keys are ignored, so that a peer may add optional fields without bumping the protocol.
    """
    kwargs: dict[str, Any] = {}
    for name, check, required in _plan(cls)[0]:
        if name in raw:
            try:
                kwargs[name] = check(raw[name])
            except _Bad as exc:
                exc.where = f".{name}{exc.where}"
                raise
        elif required:
            _fail(f"missing field {name!r}")
    return kwargs


def _bytes_field(cls: type[Any]) -> Optional[str]:
    """The name of the class's raw-bytes field, if it has one."""
    return _plan(cls)[1]


def validate_name(name: str) -> Optional[str]:
    """Why `name` cannot name a job, or None. Names must never be mistaken for ids."""
    if not name or len(name) > MAX_NAME:
        return f"a job name has 1 to {MAX_NAME} characters"
    if is_job_id(name):
        return "a job name cannot be all digits (it would read as a job id)"
    if any(c.isspace() or not c.isprintable() for c in name):
        return "a job name cannot contain spaces or control characters"
    return None


# ---------------------------------------------------------------------------------------------------------
# Encoding and decoding frames


def encode(msg: Message) -> bytes:
    """The frame for `msg`: its JSON header line, then its raw bytes if it carries any."""
    body: dict[str, Any] = {"type": msg.TYPE}
    payload = b""
    for f in dataclasses.fields(msg):  # type: ignore[arg-type]
        value = getattr(msg, f.name)
        if isinstance(value, bytes):
            payload = value
            body["size"] = len(value)
        else:
            body[f.name] = plain(value)
    header = json.dumps(body, separators=(",", ":")).encode("ascii") + b"\n"
    return header + payload


def plain(value: Any) -> Any:
    """`value` (a record, a list of them, anything JSON takes) as JSON types, for frames and for files.
    Not dataclasses.asdict: that deep-copies, and a manifest holds thousands of records."""
    if isinstance(value, list):
        return [plain(v) for v in value]
    names = _FIELD_NAMES.get(type(value))
    if names is None and dataclasses.is_dataclass(value) and not isinstance(value, type):
        names = _FIELD_NAMES[type(value)] = tuple(f.name for f in dataclasses.fields(value))
    if names is not None:
        return {name: plain(getattr(value, name)) for name in names}
    return value


_FIELD_NAMES: dict[type, tuple[str, ...]] = {}


def decode_header(line: bytes) -> tuple[type[Message], dict[str, Any], int]:
    """Parse a header line into (class, checked constructor arguments, payload size still to read)."""
    try:
        raw = json.loads(line)
    except (UnicodeDecodeError, ValueError) as exc:
        raise ProtocolError(f"frame is not JSON: {exc}") from None
    except RecursionError:  # nested deeper than any message of this protocol
        raise ProtocolError("frame is nested too deeply") from None
    if not isinstance(raw, dict) or not isinstance(raw.get("type"), str):
        raise ProtocolError("frame has no message type")
    cls = _REGISTRY.get(raw["type"])
    if cls is None:
        raise ProtocolError(f"unknown message type {raw['type'][:64]!r}")
    size = 0
    if _bytes_field(cls):
        size = raw.get("size", 0)
        if not isinstance(size, int) or isinstance(size, bool) or not 0 <= size <= MAX_PAYLOAD_BYTES:
            raise ProtocolError("payload size out of range")
    try:
        return cls, _kwargs(cls, raw), size
    except _Bad as exc:
        raise ProtocolError(f"{cls.TYPE}{exc.where}: {exc.message}") from None


class Reader(Protocol):
    """What both asyncio's StreamReader and asyncssh's SSHReader offer."""

    async def readuntil(self, separator: Any) -> Any: ...

    async def readexactly(self, n: int) -> Any: ...


class Writer(Protocol):
    def write(self, data: bytes) -> None: ...

    async def drain(self) -> None: ...

    def close(self) -> None: ...


async def read_message(reader: Reader) -> Optional[Message]:
    """The next message, or None when the peer closed cleanly between frames."""
    import asyncio  # here, not above: a client that asks over a plain socket (client/syncchannel.py) never loads it

    try:
        line = await reader.readuntil(b"\n")
    except asyncio.IncompleteReadError as exc:
        if exc.partial:
            raise ConnectionClosed("connection closed in the middle of a frame") from None
        return None
    except asyncio.LimitOverrunError:
        raise ProtocolError(f"frame header longer than {MAX_HEADER_BYTES} bytes") from None
    except ValueError as exc:  # StreamReader's way of saying the limit was overrun
        raise ProtocolError(f"bad frame: {exc}") from None
    if len(line) > MAX_HEADER_BYTES:
        raise ProtocolError(f"frame header longer than {MAX_HEADER_BYTES} bytes")
    cls, fields, size = decode_header(line)
    name = _bytes_field(cls)
    if name:
        try:
            fields[name] = await reader.readexactly(size) if size else b""
        except asyncio.IncompleteReadError:
            raise ConnectionClosed("connection closed in the middle of a payload") from None
    return cls(**fields)


async def write_message(writer: Writer, msg: Message) -> None:
    writer.write(encode(msg))
    await writer.drain()


# ---------------------------------------------------------------------------------------------------------
# A conversation, as the client side holds it (the tfrun CLI, and tfrund's own status/stop commands)


class RemoteError(Exception):
    """The daemon answered with an `Error`."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


def checked_hello(mine: Hello, reply: Message) -> Hello:
    """The daemon's hello, if `reply` is one of this protocol's: else ProtocolError, or RemoteError with code
    VERSION_MISMATCH saying which side to upgrade. For Channel and the CLI's plain-socket channel alike."""
    if not isinstance(reply, Hello):
        raise ProtocolError("the other end did not answer like a tfrund")
    if reply.protocol != PROTOCOL_VERSION:
        raise RemoteError(ErrorCode.VERSION_MISMATCH, mismatch_message(mine, reply))
    return reply


def check_reply(request: Union[Request[Any], type[Request[Any]]], reply: type[Message]) -> None:
    """ProtocolError unless a message of class `reply` is one of the answers `request` names."""
    if not issubclass(reply, request.REPLIES):
        expected = " or ".join(repr(cls.TYPE) for cls in request.REPLIES)
        raise ProtocolError(f"expected {expected} in reply to {request.TYPE!r}, got {reply.TYPE!r}")


class Channel:
    """A connection to a daemon after the handshake: requests out, replies in."""

    def __init__(self, reader: Reader, writer: Writer, daemon: Hello) -> None:
        self.reader = reader
        self.writer = writer
        self.daemon = daemon
        self._closers: list[typing.Callable[[], object]] = []

    def on_close(self, closer: typing.Callable[[], object]) -> None:
        """Also call `closer` (e.g. to end the SSH connection under this channel) when it closes."""
        self._closers.append(closer)

    def close(self) -> None:
        self.writer.close()
        for closer in self._closers:
            closer()
        self._closers.clear()

    @classmethod
    async def open(cls, reader: Reader, writer: Writer) -> Channel:
        """Exchange hellos; raise RemoteError with code VERSION_MISMATCH if the versions differ."""
        mine = client_hello()
        await write_message(writer, mine)
        reply = await read_message(reader)
        if reply is None:
            raise ConnectionClosed("the other end closed the connection before answering the hello")
        if isinstance(reply, Error):
            raise RemoteError(reply.code, reply.message)
        return cls(reader, writer, checked_hello(mine, reply))

    @classmethod
    async def connect_unix(cls, path: str) -> Channel:
        """A channel to whatever speaks the protocol on the Unix socket at `path` (a daemon, a keeper)."""
        import asyncio

        reader, writer = await asyncio.open_unix_connection(path, limit=MAX_HEADER_BYTES + 1)
        try:
            return await cls.open(reader, writer)
        except BaseException:
            writer.close()
            raise

    async def ask(self, request: Request[T]) -> T:
        """Send one request and return its one reply, checked as `reply_to` checks it."""
        await self.send(request)
        return await self.reply_to(request)

    async def send(self, request: Request[Any]) -> None:
        """Send a request without waiting for its answer: one streamed back (`ReadLog`, `ReadFile`), or
        one of several sent before their answers are read (`PutBlobs`)."""
        await write_message(self.writer, request)

    async def reply_to(self, request: Union[Request[T], type[Request[T]]]) -> T:
        """The next message, which must be one of the replies `request` (or its class) names: an `Error`
        raises RemoteError, any other message ProtocolError (not an assert: `python -O` drops those)."""
        reply = await self.receive()
        check_reply(request, type(reply))
        return typing.cast(T, reply)

    async def request(self, msg: Message) -> Message:
        """Send one message and return the next one, unchecked (tests that speak the protocol by hand)."""
        await write_message(self.writer, msg)
        return await self.receive()

    async def receive(self) -> Message:
        reply = await read_message(self.reader)
        if reply is None:
            raise ConnectionClosed("tfrund closed the connection without answering")
        if isinstance(reply, Error):
            raise RemoteError(reply.code, reply.message)
        return reply
