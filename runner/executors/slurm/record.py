"""slurm.json, a job's Slurm record (SlurmRecord): the Slurm id once sbatch gave it, or sbatch's refusal, and what
a cancel or a requeue noted since. This daemon alone writes it (atomically: a temporary file renamed over), so
`Records` keeps each job's in memory once read, and every write goes through it: a poll of a thousand jobs held
in Slurm's queue reads and stats no file (it stat'ed each job's slurm.json five times a second).
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import TypedDict, Union

RECORD = "slurm.json"


class SlurmRecord(TypedDict, total=False):
    """slurm.json: the Slurm id once sbatch gave it, or sbatch's refusal; a cancel's escalation time."""

    slurm_id: str
    submitted_at: float
    error: str
    kill_at: float  # scancel outright if it still runs then (a tfrun cancel's grace has passed)
    requeues: int  # Slurm's requeues of the job reported so far (Requeued)


class Records:
    """The slurm.json of each job folder this daemon has looked at or written, by folder; an unfinished job's is
    read from its folder once (a daemon started afresh), and dropped once the job's end is recorded."""

    def __init__(self) -> None:
        self._by_folder: dict[str, SlurmRecord] = {}
        self._folders: dict[int, str] = {}  # job id -> its folder, for `forget`

    def of(self, job_id: int, job_dir: Union[str, Path]) -> SlurmRecord:
        """The job's record ({} while it has none), kept until `forget(job_id)`; found by the job's id first, so
        that a look at a thousand held jobs builds no Path (that was a third of its time)."""
        key = self._folders.get(job_id)
        record = self._by_folder.get(key) if key is not None else None
        if record is not None:
            return record
        key = self._folders[job_id] = os.fspath(job_dir)
        record = self._by_folder.get(key)
        if record is None:
            record = self._by_folder[key] = _read(Path(job_dir))
        return record

    def read(self, job_dir: Path) -> SlurmRecord:
        """The record in a folder known only by its path (an array's task, at a daemon's start): the one kept,
        else the folder's, not kept (nothing would forget it)."""
        record = self._by_folder.get(os.fspath(job_dir))
        return record if record is not None else _read(job_dir)

    def write(self, job_dir: Path, record: SlurmRecord) -> None:
        """Write the record, atomically (a temporary file, fsynced, renamed over), and keep it."""
        tmp = job_dir / f".{RECORD}.{os.getpid()}.tmp"
        with open(tmp, "w") as f:
            f.write(json.dumps(record))
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, job_dir / RECORD)
        self._by_folder[os.fspath(job_dir)] = record

    def forget(self, job_id: int) -> None:
        """The job's end is recorded: its record is not asked for again."""
        key = self._folders.pop(job_id, None)
        if key is not None:
            self._by_folder.pop(key, None)


def _read(job_dir: Path) -> SlurmRecord:
    """The record as the folder holds it, its fields checked ({} if there is none, or none usable)."""
    try:
        data = json.loads((job_dir / RECORD).read_text())
    except (OSError, ValueError):
        return {}
    if not isinstance(data, dict):
        return {}
    record: SlurmRecord = {}
    if isinstance(data.get("slurm_id"), str):
        record["slurm_id"] = data["slurm_id"]
    if isinstance(data.get("error"), str):
        record["error"] = data["error"]
    for key in ("submitted_at", "kill_at"):
        if isinstance(data.get(key), (int, float)):
            record[key] = float(data[key])
    if isinstance(data.get("requeues"), int):
        record["requeues"] = data["requeues"]
    return record
