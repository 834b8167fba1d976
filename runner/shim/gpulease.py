"""Box-wide GPU leases: every user's tfrund on a box keeps off a GPU that a job of another tfrund holds, through one
shared folder (GPU_LEASE_DIR, mode 1777 with the sticky bit), in which a hostile user of the box can neither
take a name first, block a daemon nor take a lease away (issue 44).

A lease is an flock (LOCK_EX) on a file of the claimant's own, `gpu-<key>.<random>.lock`, in a folder of its
user's own in the shared one (`uid<N>.<random>`, mode 0755, found again by its owner, not its name). Nobody else
can make, remove or rename a file in it: no name tfrun uses can be squatted, and a lease cannot be swapped for
another file under its holder. The shared folder's owner, who may rename or remove what is in it, can only
rename a user's folder (read by owner, not by name: nothing changes) or remove an empty one; in a flat folder of
lease files, whoever made it first could remove anyone's lease, and another daemon would then hand the GPU out. A
claimant
  1. makes its file 0600 (so nobody else can open it and hold a lock on it first) and locks it;
  2. makes it 0644: from now on anyone who looks sees it held;
  3. looks in every user's folder for a held lease of the same GPU (a plain 0644 file of the folder's owner,
     tried with LOCK_SH|LOCK_NB): if there is one, it removes its own, and the GPU is that holder's.
Of two claimants at once, the later to reach step 2 sees the earlier in step 3, so at most one keeps the GPU (both
may let go: each tries again later). The kernel drops a lock however its holder dies; a file left unheld counts for
nothing, and its user's next look at that GPU removes it. Who holds a lease is told by name: the owner of its
folder, and the pid /proc/locks gives.

Nothing here can block: every open in the shared folder is O_NONBLOCK (a FIFO opens at once and is passed over,
not being a plain file) and O_NOFOLLOW, and what it opened is checked with fstat before it is used. At most
_FOLDERS_PER_USER folders of a user and _FILES_PER_FOLDER lease files of a GPU in one folder are read, so that a
user who makes thousands costs a look little: beyond them only that user's own leases could be missed.

Standard library only, and little of it: the shim imports this.
"""

from __future__ import annotations

import fcntl
import os
import stat
import time

from tfrun.numerals import is_digits

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing (the shim imports this)

if TYPE_CHECKING:
    from typing import Optional, Union

LEASES_ENV = "TFRUN_GPU_LEASES"  # in a job's environment: the lease files its shim holds, os.pathsep-separated
_SAFE = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789-_")
_LOOK = os.O_RDONLY | os.O_NONBLOCK | os.O_NOFOLLOW | os.O_CLOEXEC
_FOLDER = _LOOK | os.O_DIRECTORY
_SHOWN = 0o644  # a lease file others may try: made so only once it is held
_OPEN_FOLDER = 0o755  # a user's folder: others may look in, only its owner writes
_HALF_MADE_S = 60.0  # a 0600 file of one's own this old was left by a claimant killed between steps 1 and 2
_FOLDERS_PER_USER = 4
_FILES_PER_FOLDER = 32


class LeaseError(Exception):
    """The lease folder cannot be trusted or used; the message says which, whose it is and what to do."""


class Lease:
    """A lease held: the descriptor whose lock it is, its folder's (to remove it by name, whatever its folder is
    called by then), and the file's name and path (for the job's environment)."""

    __slots__ = ("fd", "folder_fd", "name", "path")

    def __init__(self, fd: int, folder_fd: int, name: str, path: str) -> None:
        self.fd, self.folder_fd, self.name, self.path = fd, folder_fd, name, path


class Holder:
    """Who holds a GPU's lease: the uid whose folder it is in, and the pid /proc/locks gives (None: it gives none)."""

    __slots__ = ("pid", "uid")

    def __init__(self, uid: int, pid: Optional[int]) -> None:
        self.uid, self.pid = uid, pid


def claim(folder: str, key: str, taking_over: str = "") -> Union[Lease, Holder]:
    """GPU `key`'s lease for this process, or who holds it. `taking_over`: the file name of a lease of this user's
    that this claim replaces (a shim's, its daemon's claim for the job), which is not counted as a holder."""
    top = _open_shared(folder, make=True)
    try:
        lease = _make(top, folder, key)
        try:
            holder = _holder(top, key, skip=(lease.name, taking_over))
        except BaseException:
            release(lease)
            raise
    finally:
        os.close(top)
    if holder is None:
        return lease
    release(lease)
    return holder


def held_by(folder: str, key: str) -> Optional[Holder]:
    """Who holds GPU `key`'s lease now, read without claiming it; None if nobody does (or there is no folder)."""
    try:
        top = _open_shared(folder, make=False)
    except FileNotFoundError:
        return None
    try:
        return _holder(top, key, skip=())
    finally:
        os.close(top)


def release(lease: Lease) -> None:
    """Let a lease go: its file removed while still held (so nobody finds it unheld), then the lock."""
    _remove(lease.name, lease.folder_fd)
    os.close(lease.fd)
    os.close(lease.folder_fd)


def take_over(paths: list[str]) -> Union[list[Lease], str]:
    """(shim) Claim a job's leases for its shim's life, each taking over its daemon's claim at one of `paths`
    (LEASES_ENV); or why not, in words, with none kept. The descriptors stay open until the shim lets them go."""
    leases: list[Lease] = []
    for path in paths:
        name = os.path.basename(path)
        key = name[len("gpu-") : -len(".lock")].rpartition(".")[0]
        try:
            found = claim(os.path.dirname(os.path.dirname(path)), key, taking_over=name)
        except LeaseError:
            for lease in leases:
                release(lease)
            raise
        if isinstance(found, Holder):
            for lease in leases:
                release(lease)
            return f"GPU {key} is held by {describe(found)}"
        leases.append(found)
    return leases


def describe(holder: Holder) -> str:
    """A lease's holder by name, for a waiting job's reason, `tfrun gpus` and a shim's refusal."""
    whose = "another tfrund of yours" if holder.uid == os.geteuid() else _user(holder.uid)
    if holder.pid is None:
        return f"a lease of {whose} whose holder /proc/locks does not show"
    return f"a lease of {whose} that pid {holder.pid} ({_command(holder.pid)}) holds"


def _open_shared(folder: str, make: bool) -> int:
    """The shared folder, opened (never through a link) and checked: a folder, with the sticky bit (the users'
    folders in it do not depend on it, but a shared folder without it is not one tfrun made or would make). Made
    1777 if missing and `make`; FileNotFoundError if missing otherwise. Whoever owns it may rename or remove what
    is in it, which the scheme allows for: it need not be root's."""
    made = False
    if make:
        try:
            os.mkdir(folder, 0o700)
            made = True
        except FileExistsError:
            pass
        except OSError as exc:
            raise LeaseError(f"cannot make the GPU lease folder {folder}: {exc.strerror}") from None
    try:
        fd = os.open(folder, _FOLDER)
    except FileNotFoundError:
        if make:
            raise LeaseError(f"cannot open the GPU lease folder {folder}: it went away as it was made") from None
        raise
    except OSError as exc:
        raise LeaseError(_unusable(folder, exc)) from None
    info = os.fstat(fd)
    if made:
        os.fchmod(fd, 0o1777)  # after mkdir: the umask would take the bits others need
    elif not info.st_mode & stat.S_ISVTX:
        os.close(fd)
        raise LeaseError(
            f"GPU lease folder {folder} lacks the sticky bit, so anyone could rename or remove what others made; "
            f"ask its owner ({_user(info.st_uid)}) or root to run `chmod 1777 {folder}`"
        )
    return fd


def _unusable(folder: str, exc: OSError) -> str:
    """Why the shared folder cannot be opened, naming whose the thing in its place is and what to do."""
    try:
        info = os.lstat(folder)
    except OSError:
        return f"cannot open the GPU lease folder {folder}: {exc.strerror}"
    if not stat.S_ISDIR(info.st_mode):
        kind = "a link" if stat.S_ISLNK(info.st_mode) else "a FIFO" if stat.S_ISFIFO(info.st_mode) else "a file"
        return (
            f"GPU lease folder {folder} is {kind} of {_user(info.st_uid)}, not a folder: ask them or root to remove it"
        )
    return (
        f"cannot open the GPU lease folder {folder} of {_user(info.st_uid)}: {exc.strerror}; "
        f"ask them or root to run `chmod 1777 {folder}`"
    )


def _make(top: int, folder: str, key: str) -> Lease:
    """Steps 1 and 2: a lease file of this process's own, locked, then shown."""
    mine = _own_folder(top, folder)
    name = f"gpu-{_safe(key)}.{os.urandom(8).hex()}.lock"
    try:
        fd = os.open(name, _LOOK | os.O_CREAT | os.O_EXCL, 0o600, dir_fd=mine[0])
    except OSError as exc:
        os.close(mine[0])
        raise LeaseError(f"cannot make a GPU lease in {os.path.join(folder, mine[1])}: {exc.strerror}") from None
    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)  # nobody else can have opened a 0600 file of ours
    os.fchmod(fd, _SHOWN)
    return Lease(fd, mine[0], name, os.path.join(folder, mine[1], name))


def _own_folder(top: int, folder: str) -> tuple[int, str]:
    """This user's folder in the shared one, opened, and its name: the first found, else a new one whose name
    nobody could have taken first."""
    for name, uid in _user_folders(top):
        if uid == os.geteuid():
            fd = _open_user_folder(top, name, uid)
            if fd is not None:
                return fd, name
    name = f"uid{os.geteuid()}.{os.urandom(8).hex()}"
    try:
        os.mkdir(name, 0o700, dir_fd=top)
        fd = os.open(name, _FOLDER, dir_fd=top)
    except OSError as exc:
        owner = _user(os.fstat(top).st_uid)
        raise LeaseError(
            f"cannot make a folder in the GPU lease folder {folder} of {owner}: {exc.strerror}; "
            f"ask them or root to run `chmod 1777 {folder}`"
        ) from None
    os.fchmod(fd, _OPEN_FOLDER)  # after mkdir, for the umask's sake
    return fd, name


def _user_folders(top: int) -> list[tuple[str, int]]:
    """The users' folders in the shared one (0755), with their owners, as lstat sees them (no open); at most
    _FOLDERS_PER_USER of each user."""
    found: list[tuple[str, int]] = []
    count: dict[int, int] = {}
    with os.scandir(top) as entries:
        for entry in entries:
            try:
                info = entry.stat(follow_symlinks=False)
            except OSError:
                continue  # gone meanwhile
            if not stat.S_ISDIR(info.st_mode) or stat.S_IMODE(info.st_mode) != _OPEN_FOLDER:
                continue
            uid = info.st_uid
            count[uid] = count.get(uid, 0) + 1
            if count[uid] <= _FOLDERS_PER_USER:
                found.append((entry.name, uid))
    return found


def _open_user_folder(top: int, name: str, uid: int) -> Optional[int]:
    """A user's folder, opened, if it still is one of `uid`'s that only its owner writes and all may read."""
    try:
        fd = os.open(name, _FOLDER, dir_fd=top)
    except OSError:
        return None
    info = os.fstat(fd)
    if info.st_uid != uid or stat.S_IMODE(info.st_mode) != _OPEN_FOLDER:
        os.close(fd)
        return None
    return fd


def _holder(top: int, key: str, skip: tuple[str, ...]) -> Optional[Holder]:
    """Step 3: who holds a lease of GPU `key` in any user's folder, the files of this user's named in `skip` aside."""
    prefix = f"gpu-{_safe(key)}."
    for folder, uid in _user_folders(top):
        fd = _open_user_folder(top, folder, uid)
        if fd is None:
            continue
        try:
            names = [n for n in os.listdir(fd) if _is_lease(n, prefix) and not (uid == os.geteuid() and n in skip)]
            for name in names[:_FILES_PER_FOLDER]:
                holder = _try(fd, name, uid)
                if holder is not None:
                    return holder
        finally:
            os.close(fd)
    return None


def _is_lease(name: str, prefix: str) -> bool:
    """Whether `name` is a lease file's name for the GPU whose names start with `prefix`: the prefix, 16 hex
    digits, `.lock`."""
    rest = name[len(prefix) :]
    return name.startswith(prefix) and len(rest) == 21 and rest.endswith(".lock") and _is_hex(rest[:16])


def _try(folder: int, name: str, uid: int) -> Optional[Holder]:
    """Whether the lease file `name` in `uid`'s folder is held: tried, never waited for. A file of this user's
    found unheld is removed (its holder is gone)."""
    try:
        fd = os.open(name, _LOOK, dir_fd=folder)
    except OSError:
        return None  # gone, or half made (0600: its maker will see ours once it shows its own)
    try:
        info = os.fstat(fd)
        mine = uid == os.geteuid()
        shown = stat.S_IMODE(info.st_mode) == _SHOWN
        if not stat.S_ISREG(info.st_mode) or info.st_uid != uid:
            return None
        if not (shown or (mine and time.time() - info.st_mtime > _HALF_MADE_S)):
            return None
        try:
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except BlockingIOError:
            return Holder(uid, _locker(info)) if shown else None
        if mine:
            _remove(name, folder)
        return None
    finally:
        os.close(fd)


def _remove(name: str, folder: int) -> None:
    """Remove a lease file of this user's. One gone already (another look of ours removed it), or that cannot be
    (a read-only remount), is no matter: unheld, it counts for nothing. Not contextlib: one import less a job."""
    try:
        os.unlink(name, dir_fd=folder)
    except OSError:
        return


def _locker(info: os.stat_result) -> Optional[int]:
    """The pid holding an flock on the file `info` describes, from /proc/locks (in this pid namespace's numbers)."""
    where = f"{os.major(info.st_dev):02x}:{os.minor(info.st_dev):02x}:{info.st_ino}"
    try:
        with open("/proc/locks") as f:
            lines = f.read().splitlines()
    except OSError:
        return None
    for line in lines:
        fields = line.split()
        if len(fields) > 5 and fields[1] == "FLOCK" and fields[5] == where and is_digits(fields[4]):
            return int(fields[4]) or None  # 0: a process outside this pid namespace
    return None


def _command(pid: int) -> str:
    """A process's command name (printable characters only: its owner chooses it), or '?' if /proc hides it."""
    try:
        with open(f"/proc/{pid}/comm") as f:
            text = f.read(64).strip()
    except OSError:
        return "?"
    return "".join(c if c.isprintable() else "?" for c in text) or "?"


def _user(uid: int) -> str:
    """A uid in words: `user NAME (uid N)`, or `uid N` where the system does not know it."""
    import pwd  # only when something is told: a shim that starts its job never needs it

    try:
        return f"user {pwd.getpwuid(uid).pw_name} (uid {uid})"
    except KeyError:
        return f"uid {uid}"


def _safe(key: str) -> str:
    """A GPU's key (its UUID where NVML has one, else its index) as it appears in lease file names."""
    return "".join(c if c in _SAFE else "_" for c in key)


def _is_hex(text: str) -> bool:
    return all(c in "0123456789abcdef" for c in text)
