"""The uploads table (schema migration 10): each checkpoint found complete, until it is stored. The daemon's
storage uploader (runner/storage/uploader.py) is its only writer; `tfrun checkpoints` and housekeeping read it.

The queue is the record: a row is written before anything is sent, as an alert is before it is delivered, and
a row's move to `stored` comes after its manifest is in the bucket. A daemon killed anywhere in between finds
the row waiting and sends it again; files it verified already (`done`) are not sent twice.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, Optional

from .store import Store

WAITING = "waiting"  # an upload's states: not stored yet (tried again at next_at)
STORED = "stored"  # uploaded, verified, its manifest written
GONE = "gone"  # deleted or saved again on the box before it was stored
JOB_RECORD = "job"  # the kind of the row that stores the job's record and snapshot, for a restart elsewhere


@dataclass(frozen=True)
class Upload:
    id: int
    job_id: int
    folder: str
    place: str
    name: str
    kind: str
    files: list[tuple[str, int, int, int]]  # path, size, mtime_ns, inode as found complete
    saved_at: float
    state: str
    attempts: int
    next_at: float
    failing_since: Optional[float]
    stored_at: Optional[float]
    done: list[tuple[str, int, str]]  # path, size, sha256 of the files already verified in storage
    error: Optional[str]


_COLUMNS = ("id", "job_id", "folder", "place", "name", "kind", "files", "saved_at", "state", "attempts", "next_at",
            "failing_since", "stored_at", "done", "error")  # fmt: skip


def _upload(row: Any) -> Upload:
    values = dict(zip(_COLUMNS, row))
    values["files"] = [tuple(f) for f in json.loads(values["files"])]
    values["done"] = [tuple(f) for f in json.loads(values["done"])]
    return Upload(**values)


class Uploads:
    """The uploads table of `store`'s database, read and written on the daemon's event loop."""

    def __init__(self, store: Store) -> None:
        self.store = store

    def add(self, job_id: int, folder: str, place: str, name: str, kind: str, files: list[Any], saved_at: float,
            now: float, state: str = WAITING) -> bool:  # fmt: skip
        """Record a checkpoint found complete; False if it is recorded already (same folder, name and time)."""
        cur = self.store.db.execute(
            "INSERT OR IGNORE INTO uploads (job_id, folder, place, name, kind, files, saved_at, state, next_at, "
            "stored_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
            (job_id, folder, place, name, kind, json.dumps(files), saved_at, state, now,
             now if state == STORED else None),
        )  # fmt: skip
        return cur.rowcount > 0

    def due(self, now: float, limit: int = 20) -> list[Upload]:
        """Waiting uploads whose time has come, oldest checkpoint first (the job record before its checkpoints)."""
        rows = self.store.db.execute(
            f"SELECT {', '.join(_COLUMNS)} FROM uploads WHERE state=? AND next_at<=? "
            "ORDER BY kind<>?, saved_at, id LIMIT ?",
            (WAITING, now, JOB_RECORD, limit),
        ).fetchall()
        return [_upload(r) for r in rows]

    def of_folder(self, folder: str) -> list[Upload]:
        rows = self.store.db.execute(
            f"SELECT {', '.join(_COLUMNS)} FROM uploads WHERE folder=? ORDER BY saved_at, id", (folder,)
        ).fetchall()
        return [_upload(r) for r in rows]

    def waiting(self) -> list[Upload]:
        rows = self.store.db.execute(
            f"SELECT {', '.join(_COLUMNS)} FROM uploads WHERE state=? ORDER BY id", (WAITING,)
        ).fetchall()
        return [_upload(r) for r in rows]

    def known(self, folder: str) -> set[tuple[str, float]]:
        """(name, saved_at) of every checkpoint of `folder` recorded, whatever became of it."""
        rows = self.store.db.execute("SELECT name, saved_at FROM uploads WHERE folder=?", (folder,)).fetchall()
        return {(name, saved_at) for name, saved_at in rows}

    def file_done(self, upload_id: int, done: list[tuple[str, int, str]]) -> None:
        self.store.db.execute("UPDATE uploads SET done=? WHERE id=?", (json.dumps(done), upload_id))

    def stored(self, upload_id: int, now: float) -> None:
        self.store.db.execute(
            "UPDATE uploads SET state=?, stored_at=?, error=NULL, failing_since=NULL WHERE id=?",
            (STORED, now, upload_id),
        )

    def gone(self, upload_id: int, why: str) -> None:
        self.store.db.execute("UPDATE uploads SET state=?, error=? WHERE id=?", (GONE, why, upload_id))

    def failed(self, upload: Upload, now: float, retry_at: float, error: str) -> None:
        self.store.db.execute(
            "UPDATE uploads SET attempts=attempts+1, next_at=?, error=?, failing_since=? WHERE id=?",
            (retry_at, error, upload.failing_since or now, upload.id),
        )

    def hold(self, place: str, until: float) -> None:
        """Let no waiting upload to `place` be tried before `until` (its storage just failed)."""
        self.store.db.execute(
            "UPDATE uploads SET next_at=max(next_at, ?) WHERE place=? AND state=?", (until, place, WAITING)
        )

    def retry_now(self, place: str, now: float) -> None:
        """Try every waiting upload to `place` at the next pass (its storage answered again)."""
        self.store.db.execute("UPDATE uploads SET next_at=? WHERE place=? AND state=?", (now, place, WAITING))

    def forget(self, folders: list[str]) -> None:
        """Drop the rows of checkpoint folders that are gone from the box (removed with their jobs)."""
        for folder in folders:
            self.store.db.execute("DELETE FROM uploads WHERE folder=?", (folder,))
