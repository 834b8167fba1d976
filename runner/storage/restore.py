"""A job resumed from its stored folder on a box it never ran on: its record and snapshot fetched into this
daemon's content store (`fetch_job`), then, when it is built, its newest stored checkpoint fetched into its own
checkpoint folder before its script starts (`restore_newest`), so that `tfrun.jobs.Checkpoints`, a plain
CheckpointManager or ModelCheckpoint finds it where it looks."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any, Optional

from tfrun.content import ManifestError
from tfrun.protocol.submit import FileEntry
from tfrun.storage import stored
from tfrun.storage.remote import STORAGE_FAILED, Remote, StorageError

from ..workdir.blobs import BlobStore
from .complete import Checkpoint, FileStat

_HOLDER = "restore"  # the partial contents' key in the content store (a connection's, for a submit)


def fetch_job(remote: Remote, blobs: BlobStore) -> tuple[dict[str, Any], list[FileEntry]]:
    """The job's record and its snapshot's entries, with every content the store lacks fetched and verified."""
    record = stored.read_record(remote, stored.JOB)
    try:
        raw = json.loads(remote.get_bytes(stored.SNAPSHOT))
        files = [FileEntry(**entry) for entry in raw]
    except (ValueError, TypeError) as exc:
        raise StorageError(
            STORAGE_FAILED, f"{remote.place.child(stored.SNAPSHOT)} is not a snapshot of tfrun's: {exc}"
        ) from None
    for entry in files:
        if entry.kind == "file" and entry.digest and not blobs.has(entry.digest):
            _fetch_blob(remote, blobs, entry.digest, entry.size)
    return record, files


class _BlobWriter:
    """A file-like that appends what it is given to a partial content of the store, verified when it ends."""

    def __init__(self, blobs: BlobStore, digest: str) -> None:
        self.blobs, self.digest, self.offset = blobs, digest, 0

    def write(self, data: Any) -> None:
        self.blobs.write_chunk(_HOLDER, self.digest, self.offset, bytes(data), False)
        self.offset += len(data)


def _fetch_blob(remote: Remote, blobs: BlobStore, digest: str, size: int) -> None:
    writer = _BlobWriter(blobs, digest)
    try:
        remote.get_into(f"{stored.BLOBS}{digest}", writer, size, digest)
        blobs.write_chunk(_HOLDER, digest, writer.offset, b"", True)
    except ManifestError as exc:
        raise StorageError(STORAGE_FAILED, f"a content of the stored snapshot is damaged: {exc}") from None
    finally:
        blobs.discard(_HOLDER)


def restore_newest(remote: Remote, folder: Path) -> Optional[tuple[stored.Manifest, list[Checkpoint]]]:
    """Fetch the newest stored checkpoint into `folder` when the folder holds none (a restart of the resumed
    job on this box finds its own there, newer); the manifest restored and the checkpoint as the folder now
    has it, or None when nothing was fetched."""
    if any(not name.startswith(".") for name in os.listdir(folder)):
        return None
    manifests = stored.stored_checkpoints(remote)
    if not manifests:
        return None
    newest = manifests[-1]
    stored.restore(remote, newest, folder)
    stats = []
    for f in newest.files:
        st = os.lstat(folder / f.path)
        stats.append(FileStat(f.path, st.st_size, st.st_mtime_ns, st.st_ino))
    return newest, [Checkpoint(newest.name, newest.kind, tuple(stats))]
