"""The disk-full rule: the disk that holds the daemon's home (its database, the job folders, every job's log) looked
at every few seconds, and a full one is one alert, the box's own, and a mark on each job it may have cost output.

A job writes its own log (its stdout and stderr are descriptors on it, O_APPEND; no pipe runs through the shim or
the daemon), so a line it could not write on a full disk fails in the job alone, and nothing of tfrun sees it.
What the daemon can see is the disk: while it is full, whatever a running job prints may be lost. So when the
disk has room again, each job that ran meanwhile gets a line appended to its log saying when the disk was full
(`tfrun logs` shows it where the gap is) and a reason (`tfrun status`), and the alert, which could not be stored
while the database's disk was full, is stored then if not before. The daemon's own log says it once when the
disk fills and once when it has room again, not at every write that failed meanwhile (runner/limits.py).

A disk is full when less than FULL_BELOW_BYTES is free for this user (a job's next lines may not fit), and has
room again at ROOM_AGAIN_BYTES, so that a disk at the edge is one incident, not one a look.
"""

from __future__ import annotations

import errno
import logging
import os
import sqlite3
import time
from pathlib import Path
from typing import Callable, NamedTuple, Optional

from tfrun.sizes import shown

from ..records.store import Store
from ..shim import jobdir
from .outbox import Outbox
from .rules import AlertConfig

RULE = "disk-full"
FULL_BELOW_BYTES = 1 << 20
ROOM_AGAIN_BYTES = 8 << 20
_SQLITE_FULL = 13  # SQLITE_FULL: "database or disk is full"

log = logging.getLogger("tfrund")


def is_disk_full(exc: BaseException) -> bool:
    """Whether `exc` is a write refused for want of space (or of quota), by the system or by SQLite."""
    if isinstance(exc, OSError):
        return exc.errno in (errno.ENOSPC, errno.EDQUOT)
    if isinstance(exc, sqlite3.OperationalError):  # sqlite_errorcode from Python 3.11; its text before
        return getattr(exc, "sqlite_errorcode", None) == _SQLITE_FULL or str(exc) == "database or disk is full"
    return False


class Space(NamedTuple):
    """The disk holding a path: where it is mounted, what is free for this user, its size (bytes)."""

    mount: str
    free: int
    total: int


def space(path: Path) -> Space:
    st = os.statvfs(path)
    return Space(_mount_point(path), st.f_bavail * st.f_frsize, st.f_blocks * st.f_frsize)


def _mount_point(path: Path) -> str:
    found = os.path.realpath(path)
    while not os.path.ismount(found):
        found = os.path.dirname(found)
    return found


def describe(path: Path) -> str:
    """'the disk at /data (which holds /data/tfrun) is full: 12 kB free of 16.8 MB', from a look now."""
    disk = space(path)
    holds = f" (which holds {path})" if str(path) != disk.mount else ""
    return f"the disk at {disk.mount}{holds} is full: {shown(disk.free)} free of {shown(disk.total)}"


class DiskWatch:
    """Since when the home's disk has been full (None: it has room), the jobs that ran meanwhile, and what is
    still to be stored about the last time it was (its alert; its jobs' marks and reasons)."""

    def __init__(self, home: Path, store: Store, outbox: Outbox, config: Callable[[], AlertConfig]) -> None:
        self.home = home
        self.store = store
        self.outbox = outbox
        self.config = config  # the daemon's, as it is now (the rule and its URLs)
        self.full_since: Optional[float] = None
        self._jobs: set[int] = set()  # jobs that ran while the disk was full
        self._alert: Optional[tuple[float, str, str]] = None  # (at, summary, body) not stored yet
        self._ended: list[tuple[set[int], float, float]] = []  # (jobs, from, to) whose marks are not made yet

    def look(self, host: str) -> None:
        """Look at the disk once: a disk that filled is logged and alerted; one that has room again is logged,
        and the jobs that ran while it was full are marked. What could not be stored is tried again. A look
        that fails is logged (once: runner/limits.py), never raised: the daemon's loops go on."""
        try:
            self._look(host)
        except Exception:
            log.exception("the look at the disk of %s failed", self.home)

    def _look(self, host: str) -> None:
        disk = space(self.home)
        now = time.time()
        running = {row.id for row in self.store.list(include_final=False) if row.started_at is not None}
        if self.full_since is None and disk.free < FULL_BELOW_BYTES:
            self.full_since, self._jobs = now, set(running)
            log.warning("%s: what running jobs print may be lost until space is freed", describe(self.home))
            self._alert = self._message(host, disk, running)
        elif self.full_since is not None:
            self._jobs |= running
            if disk.free >= ROOM_AGAIN_BYTES:
                log.info("the disk at %s has room again (%s free); it was full for %.0f s",
                         disk.mount, shown(disk.free), now - self.full_since)  # fmt: skip
                self._ended.append((self._jobs, self.full_since, now))
                self.full_since, self._jobs = None, set()
        self._store_what_waits()

    def _message(self, host: str, disk: Space, running: set[int]) -> tuple[float, str, str]:
        summary = f"{host}: {describe(self.home)}"
        jobs = ", ".join(f"job {job_id}" for job_id in sorted(running)) or "none"
        body = (
            f"{summary}\n\nWhile it is full, what running jobs print may be lost, and tfrund cannot record new jobs.\n"
            f"Running jobs: {jobs}\n\nFree some space there (`tfrun df` shows what jobs take, `tfrun prune` removes "
            "old ones).\n"
        )
        return time.time(), summary, body

    def _store_what_waits(self) -> None:
        """Store the alert and the marks that wait, each once; those a full disk refuses wait for the next look."""
        try:
            if self._alert is not None:
                config = self.config()
                if RULE in config.rules:
                    at, summary, body = self._alert
                    self.outbox.record(None, RULE, summary, body, list(config.notify), at)
                self._alert = None
            while self._ended:
                self._mark(*self._ended[0])
                self._ended.pop(0)
        except (OSError, sqlite3.Error) as exc:
            if not is_disk_full(exc):
                raise

    def _mark(self, jobs: set[int], began: float, ended: float) -> None:
        """Say in each job's log and record that the disk was full while it ran."""
        when = f"from {_clock(began)} to {_clock(ended)}"
        for job_id in sorted(jobs):
            row = self.store.get(job_id)
            if row is None:
                continue
            _append_mark(Path(row.job_dir) / jobdir.OUTPUT, f"[tfrun: the disk was full {when}: what the job printed "
                                                            "then may be missing here]")  # fmt: skip
            if row.reason is None:
                self.store.update(job_id, reason=f"output may be missing: the disk was full {when}")


def _append_mark(log_path: Path, mark: str) -> None:
    """Append `mark` as a line of its own to a job's log (O_APPEND, as the job writes it: nothing the job wrote
    is overwritten); never through a link, never made anew."""
    try:
        fd = os.open(log_path, os.O_RDWR | os.O_APPEND | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except FileNotFoundError:
        return
    try:
        size = os.fstat(fd).st_size
        ends_a_line = size == 0 or os.pread(fd, 1, size - 1) == b"\n"
        os.write(fd, (b"" if ends_a_line else b"\n") + mark.encode() + b"\n")
    finally:
        os.close(fd)


def _clock(at: float) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(at))
