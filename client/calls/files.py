"""Calls on a job's files (tfrun/protocol/files.py) that are not a copy: the listing of a folder."""

from __future__ import annotations

from tfrun.protocol.files import FileList, ListFiles
from tfrun.protocol.submit import FileEntry

from . import Call


def files(job: str, path: str = "checkpoints") -> Call[FileList, list[FileEntry]]:
    """The entries under `path` of the job's folder, or of its checkpoint folder (`checkpoints...`)."""
    return Call(ListFiles(job=job, path=path), lambda reply: reply.files)
