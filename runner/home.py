"""The daemon's home and its hold on it: the folders of TFRUN_HOME, made its user's alone (`keep_private`,
`tighten_home`), the flock one daemon holds for its whole life (`acquire_lock`, `lock_holder`), the job side's
and the shim's import paths (`install_job_pythonpath`, `install_shim_pythonpath`), the environment every process
it starts begins with (`inherited_env`), and `HomeWatch`, which tells a daemon that its home, lock file or socket
was removed or replaced under it, so that it stops instead of serving a home nobody can reach.
"""

from __future__ import annotations

import fcntl
import logging
import os
import shutil
import stat
from pathlib import Path
from typing import IO, Callable, Optional

from tfrun.constants import DAEMON_ONLY_ENV, JOB_UMASK_ENV, PRIVATE_DIR_MODE, PRIVATE_UMASK
from tfrun.numerals import is_digits
from tfrun.paths import Layout, package_folder
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
    """Make what tfrund made in its home its user's alone, once: everything under it was readable by every
    user of the box where an older tfrund (or a volume made 0755, TFRUN_HOME=/data/tfrun) left it open.

    tfrund makes all it writes private now (`keep_private`), but a home made before kept its 0644 database and
    spec files and its 0755 folders, shut only by the top folder: open that again (a chmod, a restored
    backup) and they are all readable. So the whole tree tfrund owns loses its bits for group and others,
    walked without following a link (each file opened O_NOFOLLOW, checked to be the file listed, then
    fchmod'ed), except what holds the user's own modes by design (`_OWN_MODES`, behind folders now 0700).
    An entry of another user is left alone and named. The log says once what changed. The walk is done
    once per home (`_TREE_DONE`; a top folder found open again walks it again): 10,000 job folders take a
    second or so, which every start would otherwise pay."""
    top = layout.home.stat().st_mode & 0o777
    done = layout.home / _TREE_DONE
    if top == PRIVATE_DIR_MODE and done.exists():
        return
    walk = _Walk(layout.home)
    fd = os.open(layout.home, os.O_RDONLY | os.O_DIRECTORY)  # the home may be a link the user made; no link in it
    try:
        walk.fix(fd, os.fstat(fd), str(layout.home))
        walk.tree(fd, "")
    finally:
        os.close(fd)
    walk.say()
    done.write_text("tfrund made what it keeps here its user's alone (no access for group or others) once; it "
                    "looks again at its next start if this file is removed.\n")  # fmt: skip


_TREE_DONE = ".private"  # a mark in the home: its whole tree was made private once, not walked again at each start
# Folders whose contents keep the user's modes on purpose: a job's snapshot (work/) and its spare (tree/), the
# copies of tfrun.jobs and of the shim (pythonpath/, shimpath/: public code, made anew at each start), a
# checkpoint folder's files (the job's umask).
_OWN_MODES = frozenset({"work", "tree", "pythonpath", "shimpath"})
_SHOWN = 3  # examples named in the log


class _Walk:
    """One walk of a home in `tighten_home`: what it changed and what it left, for one log line each."""

    def __init__(self, home: Path) -> None:
        self.home = home
        self.changed: list[str] = []
        self.others: list[str] = []

    def tree(self, fd: int, where: str) -> None:
        """Tighten each entry of the folder open at `fd` (`where` in the home), and the folders below."""
        try:
            entries = sorted(os.scandir(fd), key=lambda entry: entry.name)  # the log's examples in order
        except OSError as exc:
            self.others.append(f"{where or '.'} ({exc.strerror})")
            return
        for entry in entries:
            try:
                info = entry.stat(follow_symlinks=False)
            except FileNotFoundError:
                continue  # gone since it was listed
            path = f"{where}{entry.name}"
            if stat.S_ISLNK(info.st_mode) or not (stat.S_ISDIR(info.st_mode) or stat.S_ISREG(info.st_mode)):
                continue  # a link's mode means nothing; a socket or FIFO is never opened
            if info.st_uid != os.geteuid():
                self.others.append(f"{path} (uid {info.st_uid})")
                continue
            folder = stat.S_ISDIR(info.st_mode)
            if not folder and not info.st_mode & 0o077:
                continue  # most files: nothing to open
            flags = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | (os.O_DIRECTORY if folder else 0)
            try:
                child = os.open(entry.name, flags, dir_fd=fd)
            except OSError:
                continue  # gone, or replaced by a link, since it was listed
            try:
                now = os.fstat(child)
                if (now.st_dev, now.st_ino) != (info.st_dev, info.st_ino):
                    continue
                self.fix(child, now, path)
                if folder and entry.name not in _OWN_MODES and not where.startswith("checkpoints/"):
                    self.tree(child, f"{path}/")
            finally:
                os.close(child)

    def fix(self, fd: int, info: os.stat_result, path: str) -> None:
        mode = stat.S_IMODE(info.st_mode)
        if not mode & 0o077:
            return
        try:
            os.fchmod(fd, mode & ~0o077)
        except OSError as exc:  # a read-only mount, an immutable file: said, and the daemon starts
            self.others.append(f"{path} ({exc.strerror})")
            return
        self.changed.append(f"{path} {mode:03o} -> {mode & ~0o077:03o}")

    def say(self) -> None:
        """The log's line on what changed, and one on what was not ours to change, if any."""
        if self.changed:
            log.warning("made %s under %s yours alone (other users of this machine could open them): %s",
                        _entries(self.changed), self.home, _some(self.changed))  # fmt: skip
        if self.others:
            log.warning("%s under %s could not be made yours alone (another user's, or refused), left as "
                        "they are: %s; remove them, or ask their owner to", _entries(self.others), self.home,
                        _some(self.others))  # fmt: skip


def _entries(items: list[str]) -> str:
    return "1 file or folder" if len(items) == 1 else f"{len(items)} files and folders"


def _some(items: list[str]) -> str:
    return ", ".join(items[:_SHOWN]) + (f" and {len(items) - _SHOWN} more" if len(items) > _SHOWN else "")


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
                return int(text) if is_digits(text) else None
            return None
    except FileNotFoundError:
        return None


def inherited_env() -> dict[str, str]:
    """tfrund's environment less its own secrets (TFRUN_NOTIFY): what everything it starts begins with (a
    shim, a job, a service, sbatch and so a batch job), since a job's environment is readable by its code and
    by whoever the job hands it to, and a job that needs alerts asks the daemon (`--notify`)."""
    return {key: value for key, value in os.environ.items() if key not in DAEMON_ONLY_ENV}


# The modules of tfrun/ that runner/shim/ imports (tests/test_layers.py holds the shim to them).
SHIM_CORE_MODULES = ("__init__.py", "constants.py", "numerals.py")


def install_job_pythonpath(layout: Layout) -> None:
    """Make `tfrun.jobs` importable in every job: a folder with only that code, for the job's PYTHONPATH.

    Copied, not linked to this install, so that the job's interpreter never sees the daemon's packages.
    """

    def fill(tfrun: Path) -> None:
        shutil.copy2(package_folder("tfrun") / "__init__.py", tfrun / "__init__.py")
        shutil.copytree(package_folder("tfrun.jobs"), tfrun / "jobs", ignore=shutil.ignore_patterns("__pycache__"))

    _install_pythonpath(layout.job_pythonpath, fill)


def install_shim_pythonpath(layout: Layout) -> None:
    """Make the shim importable by the interpreter that runs it with `-S` (no site, so no editable install's
    finder, and nothing of the daemon's environment): a folder with runner/shim/ and the few tfrun modules it
    needs, for every shim's PYTHONPATH and every Slurm batch script's. Its path stays the same across upgrades,
    so a batch script that waits in Slurm's queue finds the shim of the tfrun installed when it starts."""

    def fill(tfrun: Path) -> None:
        for name in SHIM_CORE_MODULES:
            shutil.copy2(package_folder("tfrun") / name, tfrun / name)
        runner = package_folder("tfrun.runner")
        (tfrun / "runner").mkdir()
        shutil.copy2(runner / "__init__.py", tfrun / "runner" / "__init__.py")
        shutil.copytree(runner / "shim", tfrun / "runner" / "shim", ignore=shutil.ignore_patterns("__pycache__"))

    _install_pythonpath(layout.shim_pythonpath, fill)


def in_shim_pythonpath(shim_path: Path, module_file: str) -> Path:
    """Where the copy of one of runner/shim/'s files is in `shim_path` (install_shim_pythonpath): what a launch
    record names for a file run by its path, so that a job waiting in Slurm's queue across an upgrade finds it."""
    return shim_path / "tfrun" / "runner" / "shim" / Path(module_file).name


def _install_pythonpath(folder: Path, fill: Callable[[Path], None]) -> None:
    """Fill a fresh copy of `folder` (its tfrun/ made by `fill`) beside it, then swap it in with two renames, so
    that the copy a process finds is whole: the old or the new. Between the two renames (microseconds, at a
    daemon's start, before it starts any shim) there is none: only a Slurm batch script that starts in just that
    moment misses it."""
    fresh = folder.with_name(folder.name + ".new")
    shutil.rmtree(fresh, ignore_errors=True)
    (fresh / "tfrun").mkdir(parents=True)
    fill(fresh / "tfrun")
    old = folder.with_name(f"{folder.name}.old.{os.getpid()}")
    if folder.exists():
        os.rename(folder, old)
    os.rename(fresh, folder)
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
