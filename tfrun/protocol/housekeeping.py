"""Housekeeping's messages: `Remove` (`tfrun rm`) and `Prune` (`tfrun prune`), which remove ended jobs and collect the
uploaded contents no job needs, each answered by a `RemoveReply`; `DiskUsage` (`tfrun df`), answered by what
tfrun's folders take (`DiskReport`)."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Annotated, Optional

from tfrun.constants import (
    MAX_REMOVE_JOBS,
)
from tfrun.protocol.fields import JobRef, Limit, Offset, Range
from tfrun.protocol.wire import Message, Request, tagged


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
    # this daemon made: never deleted, runner/workdir/checkpoints.py), "waiting" (it holds checkpoints not yet
    # in object storage: kept until they are), "" (none there)
    checkpoints: str = ""
    # its stored folder in object storage: "removed" (with `storage`), "kept" (not asked to), "shared" (a kept
    # job's too), "" (none); `stored_at` names it
    storage: str = ""
    stored_at: Optional[str] = None


@tagged("remove_reply")
@dataclass
class RemoveReply(Message):
    results: list[Removal]
    blobs: int = 0  # uploaded contents collected (with dry_run: that would be) once the jobs were gone
    blob_bytes: int = 0
    dry_run: bool = False


@tagged("remove")
@dataclass
class Remove(Request[RemoveReply]):
    """Remove ended jobs: their folders and records, their checkpoint folders with `checkpoints` (where no
    kept job shares them), then the uploaded contents no kept job needs (runner/housekeeping.py). With
    `dry_run`, only say what would go. Answered by `RemoveReply`."""

    jobs: Annotated[list[JobRef], Limit(items=MAX_REMOVE_JOBS)]
    checkpoints: bool = False
    dry_run: bool = False
    storage: bool = False  # remove their stored folders in object storage too (rm --storage)


@tagged("prune")
@dataclass
class Prune(Request[RemoveReply]):
    """Remove the ended jobs that ended more than `older_than` seconds ago, less the `keep_last` that ended
    last (both given: picked by both; neither: no job), as `Remove` does; answered by `RemoveReply`."""

    older_than: Optional[Annotated[float, Range(0, math.inf)]] = None
    keep_last: Optional[Offset] = None
    checkpoints: bool = False
    dry_run: bool = False


@dataclass
class FolderUsage:
    """One line of `tfrun df`: bytes on disk as `du` counts them, and regular files."""

    name: str  # jobs (less their logs), logs, blobs, spares, checkpoints, database, other
    path: str
    bytes: int
    files: int


@tagged("disk_report")
@dataclass
class DiskReport(Message):
    home: str
    folders: list[FolderUsage]
    free: int  # bytes free to the daemon on the filesystem of its home
    jobs: int  # job records
    unneeded: int  # bytes of uploaded contents that no job or spare names: what `tfrun prune` frees


@tagged("disk_usage")
@dataclass
class DiskUsage(Request[DiskReport]):
    """What tfrun's folders take on the box; answered by `DiskReport`."""
