"""Calls that free the box's disk (tfrun/protocol/housekeeping.py): remove, prune, and what is used."""

from __future__ import annotations

from typing import Optional

from tfrun.protocol.housekeeping import DiskReport, DiskUsage, Prune, Remove, RemoveReply

from . import Call, whole


def remove(
    jobs: list[str], checkpoints: bool = False, dry_run: bool = False, storage: bool = False
) -> Call[RemoveReply, RemoveReply]:
    """Ended jobs removed (their checkpoint folders too, with `checkpoints`; their stored folders in object
    storage, with `storage`); with `dry_run`, only said."""
    return Call(Remove(jobs=jobs, checkpoints=checkpoints, dry_run=dry_run, storage=storage), whole)


def prune(
    older_than: Optional[float] = None,
    keep_last: Optional[int] = None,
    checkpoints: bool = False,
    dry_run: bool = False,
) -> Call[RemoveReply, RemoveReply]:
    """The ended jobs older than `older_than` s, less the `keep_last` newest, removed as `remove` does."""
    return Call(Prune(older_than=older_than, keep_last=keep_last, checkpoints=checkpoints, dry_run=dry_run), whole)


def disk_usage() -> Call[DiskReport, DiskReport]:
    """What tfrun's folders take on the box."""
    return Call(DiskUsage(), whole)
