"""Handlers of a job's files on the box: listing one of its folders (`tfrun checkpoints`) and reading its files
(`tfrun pull`)."""

from __future__ import annotations

from tfrun.protocol.files import FileList, ListFiles, ReadFile

from ..records import jobfiles
from .base import Connection, Shown, find, handles, invalid


@handles(ListFiles)
async def list_files(daemon: Shown, req: ListFiles, conn: Connection) -> None:
    """Every entry under the path, named from the path's last part down (as `tfrun pull` writes them)."""
    row = find(daemon, req.job)
    try:
        await conn.send(FileList(jobfiles.entries(*jobfiles.resolve(row, req.path))))
    except jobfiles.Refused as exc:
        raise invalid(str(exc)) from None


@handles(ReadFile)
async def read_file(daemon: Shown, req: ReadFile, conn: Connection) -> None:
    row = find(daemon, req.job)
    try:
        f = jobfiles.open_at(row, req.path, req.offset)
    except jobfiles.Refused as exc:
        raise invalid(str(exc)) from None
    with f:
        for chunk in jobfiles.chunks(f, req.offset):
            await conn.send(chunk)
