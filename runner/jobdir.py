"""The files of one job's folder, shared by the daemon and the shim. Standard library only.

    spec.json     what to run (written by the daemon before the shim starts; read by the shim)
    files.json    the snapshot's manifest, from which a restart builds the same work/ again
    work/         the snapshot of the user's work dir, the job's cwd
    output.log    stdout and stderr of the job, appended by the job itself (O_APPEND)
    output.idx    (offset, time) records of the log's growth, appended by the shim (runner/logindex.py)
    shim.json     the shim's and the job's identities, its cgroup's OOM-kill count (written once the job runs)
    cancel.json   a cancel request with its grace period (written by the daemon, read by the shim)
    exit.json     how the job ended (written by the shim once nothing of the job is left)
                  (where the folder takes no more writes, the shim fills the spare record the daemon
                  reserved for it outside the folder instead: Layout.spare_exit)
    shim.log      the shim's own complaints, if any
    metrics.jsonl per-step metrics the job writes through tfrun.jobs (TFRUN_METRICS_FILE)
    logmetrics.jsonl  metrics the daemon read from the log, for jobs that write no metrics.jsonl

Every JSON file is written to a temporary name and renamed, so a reader sees all of it or nothing.
"""

from __future__ import annotations

import json
import os

from tfrun.constants import SPARE_EXIT_BYTES

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing (the shim imports this)

if TYPE_CHECKING:  # the shim imports this: no pathlib or typing at run time, ~15 ms less a job
    from typing import Any, Optional, Union

    PathLike = Union[str, os.PathLike[str]]

SPEC = "spec.json"
FILES = "files.json"
METRICS = "metrics.jsonl"
LOG_METRICS = "logmetrics.jsonl"
WORK = "work"
OUTPUT = "output.log"
INDEX = "output.idx"
SHIM = "shim.json"
CANCEL = "cancel.json"
EXIT = "exit.json"
SHIM_LOG = "shim.log"


def write_json(path: PathLike, data: dict[str, Any]) -> None:
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


def read_json(path: PathLike, blank_is_missing: bool = False) -> Optional[dict[str, Any]]:
    """The object in `path`; None if the file is missing (or, if asked, still blank as `reserve` left it).
    Raises ValueError if it is not a JSON object."""
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


def fill(path: PathLike, data: dict[str, Any]) -> None:
    """Write `data` over the start of a file made by `reserve`; the blanks after it are JSON whitespace."""
    encoded = json.dumps(data).encode()
    fd = os.open(path, os.O_WRONLY)
    try:
        os.pwrite(fd, encoded, 0)
        os.fsync(fd)
    finally:
        os.close(fd)
