"""The daemon's home and its hold on it: the folders of TFRUN_HOME, made its user's alone (`keep_private`,
`tighten_home`), the flock one daemon holds for its whole life (`acquire_lock`, `lock_holder`), the job side's
import path (`install_job_pythonpath`), and `HomeWatch`, which tells a daemon that its home, lock file or
socket was removed or replaced under it, so that it stops instead of serving a home nobody can reach.
"""

from __future__ import annotations

import fcntl
import logging
import os
import shutil
from pathlib import Path
from typing import IO, Optional

import tfrun
from tfrun.constants import JOB_UMASK_ENV, PRIVATE_DIR_MODE, PRIVATE_UMASK
from tfrun.paths import Layout
from tfrun.private import NotPrivate, private_dir

log = logging.getLogger("tfrund")
Identity = tuple[int, int]  # a file's (device, inode): the same path may come to name another file


class DaemonError(Exception):
    """The daemon cannot start; the message says why and what to do."""


class AlreadyRunning(DaemonError):
    pass


def prepare_dirs(layout: Layout) -> None:
    """Create the home and the 0700 socket folder; refuse a socket folder that is not this user's alone."""
    layout.home.mkdir(mode=0o700, parents=True, exist_ok=True)
    try:  # each made 0700 and checked with lstat (tfrun/private.py): no other user's folder holds our socket
        for folder in {layout.run_dir, layout.socket.parent}:
            private_dir(folder.parent, folder.name, fix="remove it, or point TFRUN_HOME elsewhere")
    except NotPrivate as exc:
        raise DaemonError(exc.message) from None
    layout.spare_exits_dir.mkdir(mode=0o700, exist_ok=True)


def keep_private() -> None:
    """Make all that tfrund and its shims create from now on private (umask 077), before anything is made.

    A box is shared: the database and its WAL hold the alert URLs, spec.json a job's whole environment. The
    umask the daemon was started with is kept in its environment (JOB_UMASK_ENV) for the shims to give each
    job: a job's own outputs follow its user's habit, in folders that are the user's alone anyway.
    """
    started_with = os.umask(PRIVATE_UMASK)
    os.environ.setdefault(JOB_UMASK_ENV, f"{started_with:03o}")


def tighten_home(layout: Layout) -> None:
    """Make a TFRUN_HOME that others may enter 0700 (one made before, or by hand: TFRUN_HOME=/data/tfrun, a
    volume made 0755), saying so in the log: everything under it was readable by every user of the box."""
    mode = layout.home.stat().st_mode & 0o777
    if mode != PRIVATE_DIR_MODE:
        layout.home.chmod(PRIVATE_DIR_MODE)
        log.warning("%s was mode %03o, open to other users of this machine; made it %03o", layout.home, mode,
                    PRIVATE_DIR_MODE)  # fmt: skip


def acquire_lock(layout: Layout) -> IO[str]:
    """Take the home's lock and write our pid into it, or raise AlreadyRunning naming the holder."""
    handle = open(layout.lock, "a+")  # noqa: SIM115 - held open for the daemon's life
    try:
        fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        handle.seek(0)
        holder = handle.read().strip() or "?"
        handle.close()
        raise AlreadyRunning(f"tfrund (pid {holder}) is already running for {layout.home}") from None
    handle.seek(0)
    handle.truncate()
    handle.write(f"{os.getpid()}\n")
    handle.flush()
    return handle


def lock_holder(layout: Layout) -> Optional[int]:
    """The pid of the daemon holding the lock, or None if no daemon holds it."""
    try:
        with open(layout.lock) as handle:
            try:
                fcntl.flock(handle, fcntl.LOCK_SH | fcntl.LOCK_NB)
            except BlockingIOError:
                text = handle.read().strip()
                return int(text) if text.isdigit() else None
            return None
    except FileNotFoundError:
        return None


def install_job_pythonpath(layout: Layout) -> None:
    """Make `tfrun.jobs` importable in every job: a folder with only that code, for the job's PYTHONPATH.

    Copied, not linked to this install, so that the job's interpreter never sees the daemon's packages.
    """
    package = Path(tfrun.__file__).parent
    fresh = layout.job_pythonpath.with_name(layout.job_pythonpath.name + ".new")
    shutil.rmtree(fresh, ignore_errors=True)
    (fresh / "tfrun").mkdir(parents=True)
    shutil.copy2(package / "__init__.py", fresh / "tfrun" / "__init__.py")
    shutil.copytree(package / "jobs", fresh / "tfrun" / "jobs", ignore=shutil.ignore_patterns("__pycache__"))
    old = layout.job_pythonpath.with_name(f"{layout.job_pythonpath.name}.old.{os.getpid()}")
    if layout.job_pythonpath.exists():
        os.rename(layout.job_pythonpath, old)
    os.rename(fresh, layout.job_pythonpath)
    shutil.rmtree(old, ignore_errors=True)


def identity(path: Path) -> Optional[Identity]:
    """What file `path` names now, or None if it names none."""
    try:
        st = os.stat(path)
    except OSError:
        return None
    return st.st_dev, st.st_ino


class HomeWatch:
    """Whether this daemon still serves its home: the home, its lock file and its socket are the files it
    took at start. The lock's flock holds only the file it was taken on: once that file is unlinked (the
    home removed, or the lock file alone), the next verb finds no lock and no socket, starts a second
    daemon, and this one serves nobody. A stat of each, every few seconds, costs nothing beside the jobs."""

    def __init__(self, layout: Layout, lock: IO[str]) -> None:
        self.layout = layout
        self.home = identity(layout.home)
        held = os.fstat(lock.fileno())
        self.lock: Identity = (held.st_dev, held.st_ino)
        self.socket: Optional[Identity] = None  # once it is bound

    def bound(self) -> None:
        """Note the socket this daemon listens on, just bound."""
        self.socket = identity(self.layout.socket)

    def owns_socket(self) -> bool:
        """Whether the socket's path still names the socket this daemon bound (not one of a later daemon)."""
        return self.socket is not None and identity(self.layout.socket) == self.socket

    def lost(self) -> Optional[str]:
        """Why this daemon no longer serves its home, in words, or None while it does."""
        if identity(self.layout.home) != self.home:
            return f"its home {self.layout.home} was removed or replaced"
        if identity(self.layout.lock) != self.lock:
            return f"its lock file {self.layout.lock} was removed or replaced"
        if self.socket is not None and not self.owns_socket():
            return f"its socket {self.layout.socket} was removed or replaced"
        return None
