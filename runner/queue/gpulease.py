"""Box-wide GPU leases: one lock file per GPU in a sticky folder every user's tfrund shares, so two users'
daemons (or two daemons of one user) never hand out the same GPU.

A lease is an flock (LOCK_EX) on `gpu-<uuid or index>.lock`, held by the job's shim for the job's whole life:
the kernel drops it when the shim dies, however it dies, so a crash frees the GPU and nothing is left to clean.
The files are 0644: taking an flock needs only a readable descriptor, and the folder's sticky bit keeps any
other user from deleting or replacing a file they did not make. Who holds a lease is read from /proc/locks
(the holder's pid, and that pid's owner), never from a record the holder could leave stale.

A daemon hands GPUs out holding the folder's hand-out lock (`handout.lock`): it tries each lease (takes and
drops it), gives the job the free ones, and its shim takes them for real before the daemon lets go, so no other
daemon tests a lease between the two. A shim that finds its lease taken anyway does not run the job.

Standard library only, and little of it: the shim imports this.
"""

from __future__ import annotations

import fcntl
import os
import stat

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing (the shim imports this)

if TYPE_CHECKING:
    from typing import Optional

LEASES_ENV = "TFRUN_GPU_LEASES"  # in a job's environment: the lease files its shim holds, os.pathsep-separated
HANDOUT = "handout.lock"
_SAFE = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789-_.")


class LeaseError(Exception):
    """The lease folder or a lease file cannot be trusted or used; the message says which and what to do."""


def ensure_folder(folder: str) -> None:
    """Make the shared lease folder (mode 1777) if missing; refuse one that is not a real folder (a link could
    send our lease files anywhere) or lacks the sticky bit (anyone could delete or replace a lease). Whoever made
    it owns it, and its owner could delete leases: no more than that user can do by running on a GPU directly,
    which no lease stops (root can make it first: the container's setup does)."""
    try:
        os.mkdir(folder, 0o700)
        os.chmod(folder, 0o1777)  # after mkdir: the umask would take the bits others need
    except FileExistsError:
        pass
    except OSError as exc:
        raise LeaseError(f"cannot make the GPU lease folder {folder}: {exc.strerror}") from None
    info = os.lstat(folder)
    if not stat.S_ISDIR(info.st_mode):
        raise LeaseError(f"GPU lease folder {folder} is not a folder; remove it so tfrund can make it")
    if not info.st_mode & stat.S_ISVTX:
        raise LeaseError(
            f"GPU lease folder {folder} lacks the sticky bit, so anyone could delete a lease in it; "
            f"ask its owner (uid {info.st_uid}) or root to run `chmod 1777 {folder}`"
        )


def lease_path(folder: str, key: str) -> str:
    """The lease file of the GPU known as `key` (its UUID where NVML has one, else its index)."""
    return os.path.join(folder, "gpu-" + "".join(c if c in _SAFE else "_" for c in key) + ".lock")


def try_take(path: str) -> Optional[int]:
    """The lease held (an open descriptor, closed on exec: a job does not inherit it), or None if it is
    someone else's."""
    fd = _open(path)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        return None
    return fd


def is_free(path: str) -> bool:
    """Whether nobody holds the lease now (tried: taken and dropped at once). Only under the hand-out lock,
    or a shim taking the lease meanwhile might find it held by this test."""
    fd = try_take(path)
    if fd is None:
        return False
    os.close(fd)
    return True


def holder(path: str) -> Optional[tuple[int, Optional[int]]]:
    """Who holds the lease, from /proc/locks without taking it: (pid, its uid or None if /proc hides it);
    None if nobody does (or the file is not there yet)."""
    try:
        info = os.stat(path)
        with open("/proc/locks") as f:
            lines = f.read().splitlines()
    except OSError:
        return None
    where = f"{os.major(info.st_dev):02x}:{os.minor(info.st_dev):02x}:{info.st_ino}"
    for line in lines:
        fields = line.split()
        if len(fields) > 5 and fields[1] == "FLOCK" and fields[5] == where and fields[4].isdigit():
            pid = int(fields[4])
            try:
                return pid, os.stat(f"/proc/{pid}").st_uid
            except OSError:
                return pid, None
    return None


def take_all(paths: list[str]) -> Optional[str]:
    """(shim) Take every lease of a job for its life; the first one already held, if any (none is kept then)."""
    fds: list[int] = []
    for path in paths:
        fd = try_take(path)
        if fd is None:
            for held in fds:
                os.close(held)
            return path
        fds.append(fd)
    return None  # the descriptors stay open until the shim exits, which is the point


def _open(path: str) -> int:
    """A read-only descriptor on the lease file, made 0644 by whoever needs it first. Never O_CREAT on a file
    that exists (Linux's protected_regular refuses it in a sticky folder for a file of another user's)."""
    flags = os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC
    while True:
        try:
            fd = os.open(path, flags)
        except FileNotFoundError:
            try:
                fd = os.open(path, flags | os.O_CREAT | os.O_EXCL, 0o644)
                os.fchmod(fd, 0o644)  # the umask may have taken the read bit others need
            except FileExistsError:
                continue  # made by someone else meanwhile: open theirs
            except OSError as exc:
                raise LeaseError(f"cannot make the GPU lease {path}: {exc.strerror}") from None
        except OSError as exc:
            raise LeaseError(f"cannot open the GPU lease {path}: {exc.strerror}") from None
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            os.close(fd)
            raise LeaseError(f"GPU lease {path} is not a plain file; ask root to remove it")
        return fd
