"""Handlers that move bytes: uploads of contents (blobs), a job's files (pull) and its log (runner/logstream.py)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Callable, Protocol, TypeVar

from tfrun.content import ManifestError
from tfrun.protocol.fields import ErrorCode
from tfrun.protocol.files import FileList, ListFiles, ReadFile
from tfrun.protocol.logs import ReadLog
from tfrun.protocol.submit import HaveBlobs, MissingBlobs, PutBlob, PutBlobs
from tfrun.protocol.wire import Ok, encode
from tfrun.runner import jobfiles, logstream
from tfrun.runner.handlers.base import Connection, RequestError, Shown, find, handles, invalid
from tfrun.runner.lines import PatternError

if TYPE_CHECKING:
    from tfrun.runner.blobs import BlobStore
    from tfrun.runner.executor import Executor
    from tfrun.runner.loggrowth import LogGrowth

T = TypeVar("T")


class Context(Shown, Protocol):
    """What uploads, pulls and logs need of the daemon (runner/daemon.py's Daemon is one)."""

    blobs: BlobStore
    executor: Executor
    log_growth: LogGrowth

    async def off_loop(self, work: Callable[[], T]) -> T: ...


@handles(ReadLog)
async def read_log(daemon: Context, req: ReadLog, conn: Connection) -> None:
    """Send the log (the job's, or one task's) from `offset`; when following, until the job is final and all is
    sent (runner/logstream.py)."""
    row = find(daemon, req.job)
    try:
        chosen = await logstream.selection(req)
    except PatternError as exc:
        raise invalid(str(exc)) from None
    settle = daemon.executor.capabilities.log_settle_s
    try:
        await logstream.stream(
            req, chosen, row, lambda: daemon.store.get(row.id) or row, daemon.log_growth, conn.send, settle
        )
    except logstream.PastTheEnd as exc:
        raise RequestError(ErrorCode.BAD_REQUEST, str(exc)) from None
    except logstream.NoSuchLog as exc:
        raise invalid(str(exc)) from None


@handles(HaveBlobs)
async def have_blobs(daemon: Context, req: HaveBlobs, conn: Connection) -> None:
    """The contents not stored, looked up (a stat each) and encoded in a worker thread: a request may name
    100,000 of them, which took the event loop from every other client for most of a second."""

    def work() -> bytes:
        return encode(MissingBlobs(daemon.blobs.missing(req.digests, holder=conn.key)))

    try:
        await conn.send_frame(await daemon.off_loop(work))
    except ManifestError as exc:
        raise invalid(str(exc)) from None


@handles(PutBlobs)
async def put_blobs(daemon: Context, req: PutBlobs, conn: Connection) -> None:
    """Contents packed in one frame (4 MB of small files), hashed and written in a worker thread."""
    try:
        await daemon.off_loop(lambda: daemon.blobs.write_many(conn.key, req.digests, req.sizes, req.data))
    except ManifestError as exc:
        raise invalid(str(exc)) from None
    await conn.send(Ok())


@handles(PutBlob)
async def put_blob(daemon: Context, req: PutBlob, conn: Connection) -> None:
    """A chunk of one content, written (and on the last, hashed) in a worker thread; a connection's chunks
    still follow each other, as the daemon reads its next request once this one is done."""
    try:
        await daemon.off_loop(lambda: daemon.blobs.write_chunk(conn.key, req.digest, req.offset, req.data, req.last))
    except ManifestError as exc:
        raise invalid(str(exc)) from None
    if req.last:
        await conn.send(Ok())


@handles(ListFiles)
async def list_files(daemon: Context, req: ListFiles, conn: Connection) -> None:
    """Every entry under the path, named from the path's last part down (as `tfrun pull` writes them)."""
    row = find(daemon, req.job)
    try:
        await conn.send(FileList(jobfiles.entries(*jobfiles.resolve(row, req.path))))
    except jobfiles.Refused as exc:
        raise invalid(str(exc)) from None


@handles(ReadFile)
async def read_file(daemon: Context, req: ReadFile, conn: Connection) -> None:
    row = find(daemon, req.job)
    try:
        f = jobfiles.open_at(row, req.path, req.offset)
    except jobfiles.Refused as exc:
        raise invalid(str(exc)) from None
    with f:
        for chunk in jobfiles.chunks(f, req.offset):
            await conn.send(chunk)
