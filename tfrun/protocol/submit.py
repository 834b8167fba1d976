"""What a submit sends: the snapshot's manifest (`FileEntry`s), the blobs the daemon lacks (`HaveBlobs`, then
`PutBlobs` for small files and `PutBlob` chunks for large ones), then `Submit`, which names the files and the
job's options. A verb that only looks at jobs (`ps`, `status`) never imports this module."""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import Annotated, Any, Optional

from tfrun.arrays import MAX_ARRAY_AXES, MAX_ARRAY_TASKS, MAX_KEY, MAX_VALUE
from tfrun.constants import MAX_NAME, MAX_PAYLOAD_BYTES, MAX_PRIORITY, MAX_RESTARTS, MAX_STORAGE_URL
from tfrun.protocol.fields import CAUSES, UTF8, Cause, JobRef, Limit, Mode, Offset, OsText, Patterns, Range, Text
from tfrun.protocol.jobs import JobList, JobReply
from tfrun.protocol.wire import Message, Ok, Request, tagged


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


@tagged("missing_blobs")
@dataclass
class MissingBlobs(Message):
    digests: list[str]


@tagged("have_blobs")
@dataclass
class HaveBlobs(Request[MissingBlobs]):
    """Which of these contents (SHA-256, hex) does the daemon lack? Answered by `MissingBlobs`."""

    digests: list[Text]


@tagged("put_blob")
@dataclass
class PutBlob(Request[Ok]):
    """Bytes of one content, from `offset`; the chunk with `last` is answered by `Ok` once stored."""

    digest: Text
    offset: Offset
    last: bool
    data: bytes


@tagged("put_blobs")
@dataclass
class PutBlobs(Request[Ok]):
    """Several whole small contents in one frame, their bytes one after another; answered by `Ok`."""

    digests: list[Text]
    sizes: list[Annotated[int, Range(0, MAX_PAYLOAD_BYTES)]]
    data: bytes


@dataclass
class JobOptions:
    """What a submit asks of its job, besides the script and its files: one dataclass for `tfrun submit`'s
    options (client/cli/verbs/submit.py), the API's `submit` (`tfrun.JobOptions`) and the request, whose fields
    these are (`Submit`). Each field's bounds are checked where a request is read, as every request's are."""

    name: Optional[Text] = None
    env: dict[str, str] = field(default_factory=dict)
    python: Optional[OsText] = None  # the interpreter of a .py script (None: the host's, else the daemon's)
    # run it again (same snapshot, same checkpoints) after a failure, up to N times
    max_restarts: Annotated[int, Range(0, MAX_RESTARTS)] = 0
    # the failures that restart it (submit --restart-on); None: tfrun.restarts.DEFAULT (lost, oom, signal)
    restart_on: Optional[Annotated[list[Cause], Limit(items=len(CAUSES))]] = None
    alerts: list[Text] = field(default_factory=list)  # rules to turn on or tune for this job: "stall=10m", "done"
    no_alerts: list[Text] = field(default_factory=list)  # rules to turn off for this job ("all": every one)
    notify: list[Text] = field(default_factory=list)  # apprise URLs for this job's alerts; secret: never echoed
    metric_patterns: Patterns = field(default_factory=list)  # regexes with named groups for its log's metrics
    gpus: Optional[Offset] = None  # GPUs of its own (None: the daemon's default: 1 where there are GPUs, else 0)
    priority: Annotated[int, Range(-MAX_PRIORITY, MAX_PRIORITY)] = 0  # among waiting jobs, higher starts first
    after: list[JobRef] = field(default_factory=list)  # jobs (ids or names) that must succeed before it starts
    tty: bool = False  # run it in a tmux session on the box that `tfrun attach` opens
    # Slurm hosts only (a local daemon refuses them): sbatch --partition, --time (Slurm's forms or 2h), --nodes
    # (1 until multi-node TF_CONFIG exists). None: the [slurm] table's, else Slurm's default.
    partition: Optional[Annotated[str, UTF8, Limit(chars=MAX_NAME)]] = None
    time: Optional[Annotated[str, UTF8, Limit(chars=MAX_NAME)]] = None
    nodes: Optional[Offset] = None
    # object storage its checkpoints are copied to (s3://bucket/prefix; submit --checkpoints-to); None: the
    # daemon's default ([storage] checkpoints_to), else none; "" asks for none whatever the default
    checkpoints_to: Optional[Annotated[str, UTF8, Limit(chars=MAX_STORAGE_URL)]] = None

    def options(self) -> dict[str, Any]:
        """These options by name, to build a `Submit` from (`Submit(files=..., **options.options())`); of a
        `Submit`, its options alone."""
        return {f.name: getattr(self, f.name) for f in fields(JobOptions)}


@dataclass
class SubmitScript:
    """What a submit runs: the script, its arguments and the snapshot's files. `Submit`'s first fields (a
    base class after `JobOptions` in its bases, so that these, which have no defaults, come first)."""

    files: list[FileEntry]
    script: OsText
    args: list[OsText] = field(default_factory=list)


@tagged("submit")
@dataclass
class Submit(JobOptions, SubmitScript, Request[JobReply]):
    """Run `script` from a snapshot made of `files`, whose contents the daemon holds (see `HaveBlobs`), with
    the job's options (`JobOptions`).

    `script` is a path among `files`. A `.py` script runs under `python` (the daemon's default job
    interpreter when None); anything else is executed directly.
    """

    source: Optional[str] = None
    git_commit: Optional[Text] = None
    git_dirty: Optional[bool] = None
    # The client's own id for this submit (a uuid4): the same id again gets the job the first one made, so a
    # client whose daemon died before answering can send it again without running the job twice.
    submission_id: Optional[Annotated[str, UTF8, Limit(chars=MAX_NAME)]] = None


@dataclass
class ArrayAxis:
    """One `submit --array KEY=V1,V2,...`: the key and its values (tfrun/arrays.py says what each task gets)."""

    key: Annotated[str, UTF8, Limit(chars=MAX_KEY)]
    values: Annotated[list[Annotated[str, Limit(chars=MAX_VALUE)]], Limit(items=MAX_ARRAY_TASKS)]


@tagged("submit_array")
@dataclass
class SubmitArray(Request[JobList]):
    """`submit`, as one task per combination of the axes' values, all made in one transaction and answered
    by `JobList` with every task, in index order. A request of its own, not a field of `Submit`: a daemon
    that predates arrays refuses it as an unknown message instead of running one job in their place."""

    submit: Submit
    axes: Annotated[list[ArrayAxis], Limit(items=MAX_ARRAY_AXES)]
