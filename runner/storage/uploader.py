"""The uploader: every checkpoint of a job with a destination, copied to object storage once it is complete,
verified, and counted only then; retried until it is stored, across outages and daemon restarts.

Every few seconds it looks at the checkpoint folder of each job that runs or ended a moment ago
(runner/storage/complete.py says what is complete), records each new checkpoint in the uploads table
(runner/records/uploads.py) before sending anything, then sends what is due, one file at a time in a thread of
its own, at most `max_bandwidth` bytes a second. A file verified is recorded at once, so a daemon killed
mid-upload sends only what it had not finished; a checkpoint's manifest goes last, and then its row is stored.

A failure waits 2 s, then twice as long each time, up to 5 minutes, for as long as it takes. It is said in
`tfrun checkpoints` at once and, through the `storage` alert rule, once an outage has lasted `alert_after` (at
once for refused credentials or a missing bucket, which no waiting mends); a storage that answers again is
tried at once for everything waiting.

The first row of each job's stored folder is the job's record and snapshot (kind "job"), so that another box
can run it again when this one is gone (`tfrun restart --host`, runner/storage/restore.py).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import json
import logging
import os
import socket
import threading
import time
from collections.abc import Iterable
from pathlib import Path
from typing import Callable, Optional, Protocol

from tfrun.content import ManifestError
from tfrun.storage import stored
from tfrun.storage.place import parse
from tfrun.storage.remote import CHANGED, NO_BUCKET, REFUSED, STORAGE_FAILED, Pace, Remote, StorageError

from ..alerts.outbox import Outbox
from ..alerts.watch import Alerts
from ..records import jobfiles
from ..records.job import JobRow
from ..records.store import Store
from ..records.uploads import JOB_RECORD, STORED, Upload, Uploads
from ..shim import jobdir
from ..workdir.blobs import BlobStore, read_manifest
from .complete import Checkpoint, Looker

log = logging.getLogger("tfrund")

LOOK_S = 2.0  # how often each job's checkpoint folder is looked at
ENDED_LOOK_S = 120.0  # an ended job's folder is still looked at this long (its last save, just before it exited)
FIRST_RETRY_S, MAX_RETRY_S = 2.0, 300.0
STORAGE_RULE = "storage"
LOWEST_NICE = 19  # the uploads thread's niceness: the lowest
STORED_LIST = ".tfrun-stored"  # in a checkpoint folder: the names stored, for tfrun.jobs.Checkpoints' `keep`


class StorageConfig(Protocol):
    """What the uploader reads of the daemon's config (runner/config/settings.py's Config is one)."""

    @property
    def storage_bandwidth(self) -> int: ...  # bytes a second for all uploads; 0: no bound

    @property
    def storage_alert_after(self) -> float: ...  # seconds of failures before the `storage` alert


class Uploader:
    def __init__(self, store: Store, blobs: BlobStore, outbox: Outbox, alerts: Alerts,
                 config: Callable[[], StorageConfig]) -> None:  # fmt: skip
        self.store, self.blobs, self.outbox, self.alerts, self.config = store, blobs, outbox, alerts, config
        self.rows = Uploads(store)
        self._lookers: dict[str, Looker] = {}  # by checkpoint folder
        self._remotes: dict[str, Remote] = {}  # by the job's stored folder
        self._pace: Optional[Pace] = None
        self._thread = concurrent.futures.ThreadPoolExecutor(1, "tfrund-storage", initializer=yield_to_training)
        self.problems: dict[str, str] = {}  # stored folder -> why its uploads fail now (one line)
        self._alerted: set[str] = set()  # stored folders whose current outage was alerted
        self.box = socket.gethostname()
        self.started = time.time()

    async def run(self) -> None:
        """Look and send, forever; a pass that fails is logged, and the next one tries again."""
        while True:
            try:
                await self.pass_once()
            except Exception:
                log.exception("storage: a pass failed; the next one tries again")
            await asyncio.sleep(LOOK_S)

    async def pass_once(self) -> None:
        now = time.time()
        for row in self._jobs(now):
            await self._look(row, now)
        await self._send_due()

    def _jobs(self, now: float) -> list[JobRow]:
        """The jobs whose folders may gain checkpoints: those not ended, and those that ended a moment ago."""
        rows = self.store.list(include_final=False) + self.store.recent_final(50)
        return [r for r in rows if r.spec.checkpoints_to and (not r.final or now - self._ended(r) < ENDED_LOOK_S)]

    def _ended(self, row: JobRow) -> float:
        """When the job ended as far as looking goes: a job that ended while no daemon ran is looked at for a
        while after this one started, so the checkpoint it saved last is not missed."""
        return max(row.finished_at or 0.0, self.started)

    async def _look(self, row: JobRow, now: float) -> None:
        """Record the job's record once, and each checkpoint of its folder found complete since the last look."""
        place = row.spec.checkpoints_to
        assert place is not None
        if row.prepared and not self.rows.known(_record_folder(place)):  # its snapshot's manifest is written
            self.rows.add(row.id, _record_folder(place), place, stored.JOB, JOB_RECORD, [], row.created_at, now)
        looker = self._lookers.setdefault(row.checkpoint_dir, Looker(Path(row.checkpoint_dir)))
        if row.state == "queued" or not os.path.lexists(row.checkpoint_dir):
            return
        try:
            found = await asyncio.get_running_loop().run_in_executor(self._thread, looker.look)
        except (jobfiles.Refused, OSError) as exc:  # a folder swapped, or opened to others: never read
            if self.problems.get(place) != str(exc):
                log.warning("storage: job %d: %s", row.id, exc)
            self.problems[place] = str(exc)
            return
        known = self.rows.known(row.checkpoint_dir)
        for checkpoint in found:
            if (checkpoint.name, checkpoint.saved_at) not in known:
                files = [[f.path, f.size, f.mtime_ns, f.ino] for f in checkpoint.files]
                self.rows.add(row.id, row.checkpoint_dir, place, checkpoint.name, checkpoint.kind, files,
                              checkpoint.saved_at, now)  # fmt: skip

    def restored(self, row: JobRow, checkpoints: Iterable[Checkpoint]) -> None:
        """Record checkpoints fetched from storage into the job's folder as stored: never sent back."""
        now = time.time()
        for c in checkpoints:
            files = [[f.path, f.size, f.mtime_ns, f.ino] for f in c.files]
            self.rows.add(row.id, row.checkpoint_dir, row.spec.checkpoints_to or "", c.name, c.kind, files,
                          c.saved_at, now, state=STORED)  # fmt: skip

    async def _send_due(self) -> None:
        failing: set[str] = set()  # stored folders that failed in this pass: the rest of theirs wait
        for upload in self.rows.due(time.time()):
            if upload.place in failing:
                continue
            try:
                await self._send(upload)
            except StorageError as exc:
                failing.add(upload.place)
                self._failed(upload, exc)
            except (OSError, ManifestError, ValueError) as exc:
                self._failed(upload, StorageError(STORAGE_FAILED, f"{upload.name}: {exc}"))

    async def _send(self, upload: Upload) -> None:
        loop = asyncio.get_running_loop()
        remote = self._remote(upload.place)
        if upload.kind == JOB_RECORD:
            row = self.store.get(upload.job_id)
            if row is None:
                self.rows.gone(upload.id, "the job was removed before its record was stored")
                return
            await loop.run_in_executor(self._thread, self._send_record, remote, row)
            self._stored(upload)
            return
        done = list(upload.done)
        for path, size, mtime_ns, ino in upload.files:
            if any(d[0] == path for d in done):
                continue
            why = _changed(Path(upload.folder) / path, size, mtime_ns, ino)
            if why is not None:
                self.rows.gone(upload.id, why)
                return
            try:
                sent = await loop.run_in_executor(
                    self._thread, remote.put_file, path, f"{upload.folder}/{path}", self._paced()
                )
            except (FileNotFoundError, StorageError) as exc:
                if isinstance(exc, StorageError) and exc.kind != CHANGED:
                    raise
                self.rows.gone(upload.id, _changed(Path(upload.folder) / path, size, mtime_ns, ino) or "changed")
                return
            done.append((path, sent.size, sent.sha256))
            self.rows.file_done(upload.id, done)
        manifest = stored.Manifest(
            upload.name, upload.kind, upload.saved_at, [stored.StoredFile(*d) for d in done], time.time(), self.box
        )
        await loop.run_in_executor(self._thread, remote.put_bytes, stored.manifest_key(upload.name), manifest.to_json())
        self._stored(upload)
        names = sorted({u.name for u in self.rows.of_folder(upload.folder) if u.state == STORED})
        await loop.run_in_executor(self._thread, _write_stored_list, upload.folder, names)

    def _stored(self, upload: Upload) -> None:
        self.rows.stored(upload.id, time.time())
        if self.problems.pop(upload.place, None) is not None:
            log.info("storage: %s answers again", upload.place)
            self.rows.retry_now(upload.place, time.time())
        self._alerted.discard(upload.place)

    def _failed(self, upload: Upload, exc: StorageError) -> None:
        """Wait longer before the next try; say it, and alert once the outage lasted (at once where waiting
        cannot help)."""
        now = time.time()
        wait = min(MAX_RETRY_S, FIRST_RETRY_S * 2 ** min(upload.attempts, 10))
        self.rows.failed(upload, now, now + wait, exc.message)
        self.rows.hold(upload.place, now + wait)  # the others of its folder wait as long: one try a wait
        self._remotes.pop(upload.place, None)  # opened again next time: credentials fixed meanwhile are read
        if self.problems.get(upload.place) != exc.message:
            log.warning("storage: %s: %s; trying again in %.0f s", upload.name, exc.message, wait)
        self.problems[upload.place] = exc.message
        since = upload.failing_since or now
        lasting = now - since >= self.config().storage_alert_after
        if upload.place not in self._alerted and (lasting or exc.kind in (REFUSED, NO_BUCKET)):
            self._alerted.add(upload.place)
            self._alert(upload, exc.message, since)

    def _alert(self, upload: Upload, problem: str, since: float) -> None:
        settings = self.alerts.settings(upload.job_id)
        if STORAGE_RULE not in settings.rules:
            return
        row = self.store.get(upload.job_id)
        label = f"{upload.job_id}" + (f" ({row.name})" if row and row.name else "")
        waiting = sum(1 for u in self.rows.waiting() if u.place == upload.place)
        summary = f"job {label} on {self.alerts.host}: checkpoints not stored: {problem}"
        began = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(since))
        body = (f"{summary}\n\nFailing since {began}; {waiting} upload(s) wait for {upload.place} and are tried "
                "again with backoff. Nothing is lost: the box keeps every checkpoint not yet stored.\n"
                "`tfrun checkpoints JOB` shows each one's state.\n")  # fmt: skip
        self.outbox.record(upload.job_id, STORAGE_RULE, summary, body, settings.urls)

    def _remote(self, place: str) -> Remote:
        if place not in self._remotes:
            self._remotes[place] = Remote(parse(place))
        return self._remotes[place]

    def remote(self, place: str) -> Remote:
        """The bucket folder `place`, opened once for every use (a handler's listing, housekeeping's removal)."""
        return self._remote(place)

    def _paced(self) -> Pace:
        rate = self.config().storage_bandwidth
        if self._pace is None or self._pace.rate != rate:
            self._pace = Pace(rate)
        return self._pace

    def _send_record(self, remote: Remote, row: JobRow) -> None:
        """The job's record and its snapshot (contents the bucket lacks, then the manifest), so that another
        box can run it again: never its --env values (secrets live there), only their names."""
        entries = read_manifest(Path(row.job_dir) / jobdir.FILES)
        have = remote.listing(stored.BLOBS)
        for entry in entries:
            if entry.kind == "file" and entry.digest and f"{stored.BLOBS}{entry.digest}" not in have:
                remote.put_file(f"{stored.BLOBS}{entry.digest}", self.blobs.path(entry.digest), self._paced())
                have[f"{stored.BLOBS}{entry.digest}"] = entry.size
        snapshot = [{k: v for k, v in vars(e).items() if v is not None and k != "mtime"} for e in entries]
        remote.put_bytes(stored.SNAPSHOT, json.dumps(snapshot).encode())
        spec = row.spec
        record = {
            "name": row.name, "script": spec.script, "args": list(spec.args), "env_names": sorted(spec.env),
            "gpus": spec.gpus, "max_restarts": spec.max_restarts, "restart_on": list(spec.restart_on),
            "source": spec.source, "git_commit": spec.git_commit, "git_dirty": spec.git_dirty,
            "python": spec.command[0] if spec.command and spec.command[0] != spec.script else None,
            "box": self.box, "job": row.id, "created_at": row.created_at,
        }  # fmt: skip
        stored.write_record(remote, stored.JOB, record)

    def state_of(self, folder: str) -> list[Upload]:
        return [u for u in self.rows.of_folder(folder) if u.kind != JOB_RECORD]

    def stored_in(self, folder: str) -> set[tuple[str, float]]:
        """(name, saved_at) of each checkpoint of `folder` stored: any other there is not (yet)."""
        return {(u.name, u.saved_at) for u in self.rows.of_folder(folder) if u.state == STORED}


def yield_to_training() -> None:
    """Run the calling thread (the uploads' reading and hashing) at the lowest priority, nice 19: where the
    training keeps every CPU busy it gets about 1.5% of one (CFS's weights: 15 against the training's 1024),
    so the training does not notice it and the uploads still go on. Not the idle class (SCHED_IDLE), under
    which a training that saturates the box stopped them (3 MB/s, bench/storage.py). Linux schedules threads one
    by one: this thread alone is lowered."""
    try:
        os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), LOWEST_NICE)
    except OSError as exc:
        log.info("storage: uploads run at the daemon's priority (%s)", exc.strerror or exc)


def _record_folder(place: str) -> str:
    """The folder name the job record's row is filed under: its stored folder's, marked, one per place."""
    return f"record:{place}"


def _changed(path: Path, size: int, mtime_ns: int, ino: int) -> Optional[str]:
    """Why the file is no longer the one found complete (deleted, or saved again), or None if it still is."""
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return "deleted on the box before it was stored"
    except OSError as exc:
        return f"unreadable on the box: {exc.strerror or exc}"
    if (st.st_size, st.st_mtime_ns, st.st_ino) != (size, mtime_ns, ino):
        return "saved again on the box before it was stored (the newer save is stored instead)"
    return None


def _write_stored_list(folder: str, names: list[str]) -> None:
    """Name the checkpoints stored in a file of the folder (`STORED_LIST`), replaced whole, for
    tfrun.jobs.Checkpoints: its `keep` deletes only those named there."""
    target = Path(folder) / STORED_LIST
    partial = target.with_name(f"{STORED_LIST}.{os.getpid()}.tmp")
    try:
        fd = os.open(partial, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
        with os.fdopen(fd, "w") as f:
            json.dump(names, f)
        os.replace(partial, target)
    except OSError as exc:
        log.warning("storage: cannot write %s: %s", target, exc.strerror or exc)
