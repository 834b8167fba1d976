"""The files of one job's folder, and the records in them that the daemon and the shim pass each other.
Standard library only, and no typing at run time: the shim imports this.

    spec.json     the launch record: what the shim runs, where, with what environment (LaunchRecord;
                  written by the daemon before the shim starts; not the job's spec, runner/records/job.py)
    files.json    the snapshot's manifest, from which a restart builds the same work/ again
    work/         the snapshot of the user's work dir, the job's cwd
    output.log    stdout and stderr of the job, appended by the job itself (O_APPEND)
    output.idx    (offset, time) records of the log's growth, appended by the shim (runner/shim/logindex.py)
    shim.json     the shim's and the job's identities, its cgroup's OOM-kill count (ShimRecord; written by
                  the shim once the job runs)
    cancel.json   a cancel request with its grace period (CancelRequest; written by the daemon)
    exit.json     how the job ended (ExitRecord; written by the shim once nothing of the job is left)
                  (where the folder takes no more writes, the shim fills the spare record the daemon
                  reserved for it outside the folder instead: Layout.spare_exit)
    shim.log      the shim's own complaints, if any
    metrics.jsonl per-step metrics the job writes through tfrun.jobs (TFRUN_METRICS_FILE)
    logmetrics.jsonl  metrics the daemon read from the log, for jobs that write no metrics.jsonl
    gpus.jsonl    the memory and load of the GPUs the job holds, sampled by the daemon (runner/gpus/history.py)
    tensorboard/  TFRUN_TENSORBOARD_DIR: the job's own TensorBoard runs, and printed/, the metrics the daemon
                  read from its log as TensorBoard scalars (runner/metrics/eventfile.py)

Every JSON file is written to a temporary name and renamed, so a reader sees all of it or nothing. The
records' keys are defined once, by the TypedDicts below (mypy checks each use); what a reader gets is a
file's JSON object as written, which a reader from the other side checks before it trusts a value.
"""

from __future__ import annotations

import json
import os

from tfrun.constants import SPARE_EXIT_BYTES

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing (the shim imports this)

if TYPE_CHECKING:  # the shim imports this: no pathlib or typing at run time, ~15 ms less a job
    from typing import Any, Optional, TypedDict, Union

    PathLike = Union[str, os.PathLike[str]]

    class _Launch(TypedDict):
        command: list[str]
        cwd: str
        env: dict[str, str]

    class LaunchRecord(_Launch, total=False):
        """spec.json. `grace` and `spare_exit` are absent from one written by an older tfrund."""

        grace: float  # the cancel grace period when cancel.json gives none
        spare_exit: str  # where the exit record goes if the job folder takes no writes (Layout.spare_exit)
        # A stop's SIGTERM goes to the job's first process alone, which stops the rest (a multi-node job's
        # launcher, runner/shim/slurmtask.py: srun answers a SIGTERM with SIGKILL); the SIGKILL after the
        # grace to all.
        term_leader_only: bool

    class ShimRecord(TypedDict, total=False):
        """shim.json. Every value may be None (an identity /proc did not give) or, to a reader, missing."""

        shim_pid: int
        shim_start: Optional[int]
        boot_id: Optional[str]
        job_pid: int
        job_start: Optional[int]
        started_at: float
        oom_file: Optional[str]  # the cgroup's OOM-kill counter file (runner/shim/cgroup.py)
        oom_kills: Optional[int]  # its count just before the job started
        slurm_restarts: int  # (Slurm) the run of the Slurm job: how often Slurm had requeued it (SLURM_RESTART_COUNT)

    class ExitRecord(TypedDict, total=False):
        """exit.json, or the spare exit record. `finished_at`: when the job's leader ended; `ended_at`: when
        the last of its processes did."""

        exit_code: int
        signal: Optional[int]
        started_at: float
        finished_at: float
        ended_at: float
        cancelled: bool
        stopped: bool  # (Slurm) Slurm's own SIGTERM stopped it (time limit, preemption, requeue): Slurm says more
        error: Optional[str]

    class CancelRequest(TypedDict, total=False):
        """cancel.json."""

        grace: float
        requested_at: float


LAUNCH = "spec.json"  # the launch record (the file keeps the name older tfrunds gave it)
FILES = "files.json"
METRICS = "metrics.jsonl"
LOG_METRICS = "logmetrics.jsonl"
GPU_USE = "gpus.jsonl"
TENSORBOARD = (
    "tensorboard"  # TFRUN_TENSORBOARD_DIR: the job's TensorBoard runs (runner/metrics/eventfile.py writes one)
)
WORK = "work"
OUTPUT = "output.log"
INDEX = "output.idx"
SHIM = "shim.json"
CANCEL = "cancel.json"
EXIT = "exit.json"
SHIM_LOG = "shim.log"


def write_json(path: PathLike, data: Union[LaunchRecord, ShimRecord, ExitRecord, CancelRequest]) -> None:
    """Atomically replace `path` with `data`: write a temporary file, fsync it, rename it over. On failure
    (a full disk) the temporary file goes, so it holds no space that the caller's fallback may need."""
    folder, name = os.path.split(os.fspath(path))
    tmp = os.path.join(folder, f".{name}.{os.getpid()}.tmp")
    try:
        with open(tmp, "w") as f:
            f.write(json.dumps(data))  # dumps, not dump: dump streams through the pure-Python encoder
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except OSError:
        try:  # noqa: SIM105 - no contextlib: the shim imports this module
            os.unlink(tmp)
        except OSError:
            pass  # never made (a read-only folder), or the folder takes no change at all
        raise


def _read_json(path: PathLike, blank_is_missing: bool = False) -> Any:
    """The object in `path`, as the record the caller knows it to be; None if the file is missing (or, if
    asked, still blank as `reserve` left it). Raises ValueError if it is not a JSON object."""
    try:
        with open(path, "rb") as f:
            raw = f.read()
        if blank_is_missing and not raw.strip():
            return None
        data = json.loads(raw)
    except FileNotFoundError:
        return None
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ValueError(f"{path}: {exc}") from None
    if not isinstance(data, dict):
        raise ValueError(f"{path}: not a JSON object")
    return data


def reserve(path: PathLike) -> None:
    """Create `path` as blanks, their space taken now, while there is room: `fill` overwrites them in place,
    so the record it writes later needs no free space (a full disk) and no job folder. No fsync: the space
    is taken at write() (a delayed allocation is reserved then), and a job starts ~1 ms sooner without."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        os.write(fd, b" " * SPARE_EXIT_BYTES)
    finally:
        os.close(fd)


def fill(path: PathLike, data: ExitRecord) -> None:
    """Write `data` over the start of a file made by `reserve`; the blanks after it are JSON whitespace."""
    encoded = json.dumps(data).encode()
    fd = os.open(path, os.O_WRONLY)
    try:
        os.pwrite(fd, encoded, 0)
        os.fsync(fd)
    finally:
        os.close(fd)


def read_launch(path: PathLike) -> Optional[LaunchRecord]:
    record: Optional[LaunchRecord] = _read_json(path)
    return record


def read_shim(path: PathLike) -> Optional[ShimRecord]:
    record: Optional[ShimRecord] = _read_json(path)
    return record


def read_exit(path: PathLike, blank_is_missing: bool = False) -> Optional[ExitRecord]:
    record: Optional[ExitRecord] = _read_json(path, blank_is_missing)
    return record


def read_cancel(path: PathLike) -> Optional[CancelRequest]:
    record: Optional[CancelRequest] = _read_json(path)
    return record
