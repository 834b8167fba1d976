"""Moving file bytes: a snapshot's contents up to the daemon, and a job's files back down (`tfrun pull`)."""

from __future__ import annotations

import hashlib
import os
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Callable, Optional

from tfrun.constants import EXIT_FAILURE, EXIT_USAGE, FILE_CHUNK_BYTES
from tfrun.content import ManifestError, check_relative
from tfrun.protocol.channel import Channel
from tfrun.protocol.submit import FILE_KINDS, FileEntry, HaveBlobs, PutBlob, PutBlobs
from tfrun.protocol.wire import ProtocolError

from ..errors import TfrunError
from .snapshot import Snapshot

if TYPE_CHECKING:
    from rich.progress import Progress, TaskID

    from ..link.syncchannel import SyncChannel
    from .landing import Landing

_PROGRESS_AFTER_S = 1.0  # a transfer shorter than this shows no bar
_PACK_BELOW = 256 << 10  # contents up to this size travel packed several to a frame
# The most an upload sends over the CLI's plain socket (`upload_here`), in contents of up to _PACK_BELOW each: a
# few frames, sent one after the other, where a bigger upload streams its frames while their acknowledgements
# come back, and shows its progress.
PLAIN_UPLOAD_BYTES = 4 << 20
_REFUSALS_SHOWN = 5  # a pull's error names this many of the entries it refused, and counts the rest


class LazyProgress:
    """A progress bar on stderr that appears only once the work has taken more than a second."""

    def __init__(self, total: int, label: str) -> None:
        self.total = total
        self.label = label
        self.done = 0
        self.started = time.monotonic()
        self.bar: Optional[Progress] = None
        self.task: Optional[TaskID] = None

    def advance(self, n: int) -> None:
        self.done += n
        if self.bar is None and sys.stderr.isatty() and time.monotonic() - self.started > _PROGRESS_AFTER_S:
            from rich.progress import BarColumn, DownloadColumn, Progress, TransferSpeedColumn

            self.bar = Progress(
                "[progress.description]{task.description}",
                BarColumn(),
                DownloadColumn(),
                TransferSpeedColumn(),
                transient=True,
            )
            self.bar.start()
            self.task = self.bar.add_task(self.label, total=self.total, completed=self.done)
        elif self.bar is not None and self.task is not None:
            self.bar.update(self.task, completed=self.done)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.stop()


async def upload(
    channel: Channel, snapshot: Snapshot, confirm: Optional[Callable[[int, int], None]] = None
) -> tuple[int, int]:
    """Send the contents the daemon lacks; return (files sent, bytes sent). `confirm(files, bytes)` is told
    what will be sent before anything is, and may stop it by raising."""
    import asyncio

    missing = (await channel.ask(HaveBlobs(sorted(snapshot.sources)))).digests
    sizes, small, large = _sorted_by_size(snapshot, missing)
    if confirm is not None:
        confirm(len(missing), sum(sizes.get(d, 0) for d in missing))
    progress = LazyProgress(sum(sizes.get(d, 0) for d in missing), "uploading")

    async def send() -> int:
        sent = 0
        for frame in _pack_frames(snapshot, small, sizes):
            await channel.send(frame)
            sent += len(frame.data)
            progress.advance(len(frame.data))
        for digest in large:
            with open(_source(snapshot, digest), "rb") as f:
                offset = 0
                hashing = hashlib.sha256()
                while True:
                    data = f.read(FILE_CHUNK_BYTES)
                    last = len(data) < FILE_CHUNK_BYTES
                    hashing.update(data)
                    if last and hashing.hexdigest() != digest:
                        raise _changed(snapshot, digest)
                    await channel.send(PutBlob(digest, offset, last, data))
                    offset += len(data)
                    sent += len(data)
                    progress.advance(len(data))
                    if last:
                        break
        return sent

    async def acknowledged() -> None:
        expected = len(large) + sum(1 for _ in _packs(small, sizes))
        for _ in range(expected):
            await channel.reply_to(PutBlobs)  # an `Ok`, as for a `PutBlob`

    try:
        sent, _ = await asyncio.gather(send(), acknowledged())
    finally:
        progress.close()
    return len(missing), sent


def upload_here(
    channel: SyncChannel, snapshot: Snapshot, confirm: Optional[Callable[[int, int], None]] = None
) -> Optional[tuple[int, int]]:
    """`upload`, over the CLI's plain socket to a daemon up on this machine, when what the daemon lacks is
    small files of PLAIN_UPLOAD_BYTES in all at most; None, having sent nothing, when it is more."""
    missing = channel.ask(HaveBlobs(sorted(snapshot.sources))).digests
    sizes, small, large = _sorted_by_size(snapshot, missing)
    total = sum(sizes.get(d, 0) for d in missing)
    if large or total > PLAIN_UPLOAD_BYTES:
        return None
    if confirm is not None:
        confirm(len(missing), total)
    for frame in _pack_frames(snapshot, small, sizes):
        channel.ask(frame)
    return len(missing), total


def _sorted_by_size(snapshot: Snapshot, missing: list[str]) -> tuple[dict[str, int], list[str], list[str]]:
    """Each content's size, and the `missing` ones that travel packed (small) and those sent in chunks."""
    sizes = {e.digest: e.size for e in snapshot.entries if e.digest}
    small = [d for d in missing if sizes.get(d, 0) <= _PACK_BELOW]
    large = [d for d in missing if sizes.get(d, 0) > _PACK_BELOW]
    return sizes, small, large


def _pack_frames(snapshot: Snapshot, small: list[str], sizes: dict[str, int]) -> Iterator[PutBlobs]:
    """The small contents as frames of several, each read (and checked against its digest) when its turn comes."""
    for batch in _packs(small, sizes):
        contents = [_checked(snapshot, digest, _read(snapshot, digest)) for digest in batch]
        yield PutBlobs(batch, [len(c) for c in contents], b"".join(contents))


def _packs(digests: list[str], sizes: dict[str, int]) -> Iterator[list[str]]:
    """Small contents grouped into frames of about FILE_CHUNK_BYTES."""
    batch: list[str] = []
    total = 0
    for digest in digests:
        if batch and total + sizes.get(digest, 0) > FILE_CHUNK_BYTES:
            yield batch
            batch, total = [], 0
        batch.append(digest)
        total += sizes.get(digest, 0)
    if batch:
        yield batch


def _source(snapshot: Snapshot, digest: str) -> str:
    path = snapshot.sources.get(digest)
    if path is None:
        raise ProtocolError(f"daemon asked for unknown content {digest[:12]}")
    return path


def _read(snapshot: Snapshot, digest: str) -> bytes:
    with open(_source(snapshot, digest), "rb") as f:
        return f.read()


def _checked(snapshot: Snapshot, digest: str, content: bytes) -> bytes:
    """`content`, if it is still what the snapshot named: a file written to while a submit sends it (a log in
    the work dir, a daemon's own files) would otherwise be refused by the daemon as bytes of an unknown file."""
    if hashlib.sha256(content).hexdigest() != digest:
        raise _changed(snapshot, digest)
    return content


def _changed(snapshot: Snapshot, digest: str) -> TfrunError:
    """The one line for a file whose content changed between the snapshot and its upload."""
    path = next((rel for rel, local in snapshot.paths.items() if local == snapshot.sources.get(digest)), digest[:12])
    return TfrunError(
        f"{path} changed while it was being sent; submit again, or leave it out with a .tfrunignore line", EXIT_USAGE
    )


async def pull(channel: Channel, job: str, paths: list[str], dest: Path) -> tuple[int, int]:
    """Copy `paths` of the job's folder into `dest`; return (files, bytes). Each path lands as `dest`/NAME, NAME
    its last part, and whatever the daemon lists, nothing is written elsewhere (client/files/landing.py): an entry
    not under the NAME of the path it was listed for, a name that is not plain, or a place in `dest` that
    holds a link or another user's file is left out, and once the rest is written, PullRefused names it."""
    from tfrun.protocol.files import ListFiles  # here: a submit, which imports this module too, never pulls

    from .landing import Landing, NotHere

    wanted: dict[str, tuple[FileEntry, str]] = {}  # local relative path -> (its entry, the path to ask for)
    refused: list[str] = []
    for path in paths:
        top = pulled_name(path)
        base = os.path.dirname(path.strip("/"))
        for entry in (await channel.ask(ListFiles(job=job, path=path))).files:
            why = _not_pulled(entry, top, wanted)
            if why is not None:
                refused.append(f"{entry.path!r} ({why})")
            elif entry.kind != "symlink":  # links are not copied
                wanted[entry.path] = (entry, f"{base}/{entry.path}" if base else entry.path)
    progress = LazyProgress(sum(e.size for e, _ in wanted.values() if e.kind == "file"), "pulling")
    files = total = 0
    landing = Landing(dest)
    try:
        for local in sorted(wanted, key=lambda p: (p.count("/"), p)):  # parents first
            entry, remote = wanted[local]
            try:
                if entry.kind == "dir":
                    os.close(landing.folder(local.split("/")))
                else:
                    total += await _fetch(channel, job, remote, entry, landing, progress)
                    files += 1
            except NotHere as exc:
                refused.append(f"{entry.path!r} ({exc})")
    finally:
        landing.close()
        progress.close()
    if refused:
        raise PullRefused(files, total, landed(dest, paths), refused)
    return files, total


class PullRefused(TfrunError):
    """A pull that wrote what it could and left out what the daemon listed that it may not write."""

    def __init__(self, files: int, total: int, where: str, refused: list[str]) -> None:
        from ..views.render import size

        more = len(refused) - _REFUSALS_SHOWN
        shown = ", ".join(refused[:_REFUSALS_SHOWN]) + (f" and {more} more" if more > 0 else "")
        super().__init__(
            f"pulled {files} file(s), {size(total)}, into {where}, and refused {len(refused)} of what the daemon "
            f"listed: {shown}",
            EXIT_FAILURE,
        )
        self.files, self.total, self.refused = files, total, refused


def pulled_name(path: str) -> str:
    """The name `path` lands under in the destination: its last part. A path that is not plain relative
    (empty, '.', '..') is refused here, before the daemon is asked."""
    try:
        return check_relative(path.strip("/"))[-1]
    except ManifestError as exc:
        raise TfrunError(f"cannot pull {exc}", EXIT_USAGE) from None


def landed(dest: Path, paths: list[str]) -> str:
    """Where a pull of `paths` into `dest` puts them, as the user would type it: "./checkpoints"."""
    return ", ".join(dict.fromkeys(os.path.join(str(dest), pulled_name(path)) for path in paths))


def _not_pulled(entry: FileEntry, top: str, wanted: dict[str, tuple[FileEntry, str]]) -> Optional[str]:
    """Why a listed entry is not written, or None: it must be a plain relative path at or under `top`, the
    name the path asked for lands under, of a known kind, listed once."""
    try:
        check_relative(entry.path)
    except ManifestError:
        return "not a plain relative path"
    if entry.path != top and not entry.path.startswith(f"{top}/"):
        return f"not under {top}"
    if entry.kind not in FILE_KINDS:
        return f"unknown kind {entry.kind!r}"
    if entry.path in wanted:
        return "listed twice"
    return None


async def _fetch(
    channel: Channel, job: str, path: str, entry: FileEntry, landing: Landing, progress: LazyProgress
) -> int:
    """Stream one file into a new temporary sibling of its place, then rename it over (never through a link)."""
    from tfrun.protocol.files import ReadFile

    from .landing import new_file

    parts = entry.path.split("/")
    folder = landing.folder(parts[:-1])
    try:
        landing.check_replaceable(folder, parts)
        fd, tmp = new_file(folder, parts[-1], entry.mode)
        size = 0
        try:
            with os.fdopen(fd, "wb") as out:
                request = ReadFile(job=job, path=path)
                await channel.send(request)
                while True:
                    chunk = await channel.reply_to(request)
                    if chunk.offset != size:
                        raise ProtocolError("file chunks out of order")
                    out.write(chunk.data)
                    size += len(chunk.data)
                    progress.advance(len(chunk.data))
                    if chunk.last:
                        break
            os.replace(tmp, parts[-1], src_dir_fd=folder, dst_dir_fd=folder)
        except BaseException:
            os.unlink(tmp, dir_fd=folder)
            raise
    finally:
        os.close(folder)
    return size
