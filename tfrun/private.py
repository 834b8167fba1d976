"""Folders and peers of this user's alone: what tfrun trusts on a box shared with other users.

A socket in a folder that another user can write, or made, is theirs to replace: they bind one of their own where
tfrun connects, and read what it sends (the code, the environment's secrets, the alert URLs) or answer in tfrund's
place. So every folder tfrun makes for its sockets and locks is made here (mode 0700) and checked with lstat each
time it is used: a real folder, not a symlink, owned by this user, with no access for group or others (OpenSSH
refuses a ControlPath in such a folder for the same reason). And a client checks, before it sends a byte, that
the peer of a Unix socket runs as this user (SO_PEERCRED): a socket tfrun did not expect is refused, never told.

Without XDG_RUNTIME_DIR (su, cron, containers, many SSH logins) the sockets go under `/tmp/tfrun-UID`, a name any
user can guess and take first. A user who finds it taken (another user's folder, a symlink, a file, a folder open
to others) still gets a working tfrun: the sockets go into a private folder under the user's cache folder
(~/.cache/tfrun/run), which only the user can make; the taken name is never used, and nothing is waited for.
"""

from __future__ import annotations

import contextlib
import os
import socket
import stat
import struct
from pathlib import Path

from tfrun.constants import CACHE_RUNTIME_DIR, PRIVATE_DIR_MODE, SHARED_RUNTIME_ROOT

_PEERCRED = struct.Struct("3i")  # struct ucred: pid, uid, gid
_RUNTIME_FIX = "remove it, or set XDG_RUNTIME_DIR to a folder of your own"


class NotPrivate(Exception):
    """A folder or a socket's peer that is not this user's alone; the message names it and says the fix."""

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


def private_dir(base: Path, *names: str, fix: str = "remove it") -> Path:
    """`base`/`names`, each name a folder made 0700 if missing and checked (`check_private`) either way, so that
    a folder another user made first, or swapped since, is refused before anything is put in it. `base` itself
    is not tfrun's: it must only be safe to make names in (see `_check_base`)."""
    _check_base(base, fix)
    folder = base
    for name in names:
        folder = folder / name
        with contextlib.suppress(FileExistsError):
            folder.mkdir(mode=PRIVATE_DIR_MODE)
        check_private(folder, fix)
    return folder


def check_private(folder: Path, fix: str = "remove it") -> None:
    """Refuse `folder` unless it is a real folder (lstat: a symlink is refused, wherever it points), owned by
    this user, with no bits for group or others; `fix` ends the message."""
    info = folder.lstat()
    if stat.S_ISLNK(info.st_mode):
        raise NotPrivate(f"{folder} is a symbolic link, not a folder of yours: {fix}")
    if not stat.S_ISDIR(info.st_mode):
        raise NotPrivate(f"{folder} is not a folder: {fix}")
    if info.st_uid != os.geteuid():
        raise NotPrivate(f"{folder} is not yours (owner uid {info.st_uid}): {fix}")
    if info.st_mode & 0o077:
        raise NotPrivate(f"{folder} is open to other users (mode {stat.S_IMODE(info.st_mode):04o}): {fix}")


def _check_base(base: Path, fix: str) -> None:
    """A folder that tfrun makes names in must be root's or this user's, and no one else may rename what is in
    it: not writable by group or others, unless sticky (/tmp: others make names there, never take ours)."""
    info = base.stat()
    if info.st_uid not in (0, os.geteuid()):
        raise NotPrivate(f"{base} is not yours (owner uid {info.st_uid}): {fix}")
    if info.st_mode & 0o022 and not info.st_mode & stat.S_ISVTX:
        raise NotPrivate(f"{base} may be written by other users (mode {stat.S_IMODE(info.st_mode):04o}): {fix}")


def runtime_dir() -> Path:
    """The folder for this user's keeper sockets: XDG_RUNTIME_DIR (the session's own, made by the login) when
    it is this user's and no one else may write in it, else `shared_runtime_dir`. After `su` the variable
    still names the first user's folder: tfrun then works as without it, never in another user's folder."""
    explicit = os.environ.get("XDG_RUNTIME_DIR")
    if explicit:
        folder = Path(explicit)
        with contextlib.suppress(OSError):
            folder.mkdir(mode=PRIVATE_DIR_MODE, parents=True, exist_ok=True)
            info = folder.stat()
            if info.st_uid == os.geteuid() and not info.st_mode & 0o022:
                return folder
    return shared_runtime_dir()


def shared_runtime_dir() -> Path:
    """`/tmp/tfrun-UID`, made or checked; where another user took that name first, the private folder under
    the user's cache folder. One answer for every process of the user with the same HOME whatever its session
    (a local daemon's short socket lives here, and its client must find it without XDG_RUNTIME_DIR)."""
    try:
        return private_dir(Path(SHARED_RUNTIME_ROOT), f"tfrun-{os.getuid()}", fix=_RUNTIME_FIX)
    except NotPrivate as taken:
        cache = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache").absolute()
        *above, name = CACHE_RUNTIME_DIR
        base = cache.joinpath(*above)
        try:
            base.mkdir(mode=PRIVATE_DIR_MODE, parents=True, exist_ok=True)
            return private_dir(base, name)
        except (NotPrivate, OSError) as exc:
            why = exc.message if isinstance(exc, NotPrivate) else f"{base / name}: {exc.strerror or exc}"
            raise NotPrivate(f"{taken.message}; the fallback failed too ({why})") from None


def check_peer(sock: socket.socket, path: str) -> None:
    """Refuse the socket at `path` unless the process serving it runs as this user: called after the connect,
    before the first byte, so another user's socket learns nothing but that someone knocked."""
    pid, uid = _peer(sock)
    if uid != os.geteuid():
        raise NotPrivate(
            f"{path} is served by another user (uid {uid}, pid {pid}), not by you: tfrun sent it nothing; "
            "remove that socket"
        )


def peer_is_self(sock: socket.socket) -> bool:
    """Whether the process at the other end of `sock` runs as this user (for servers: a keeper, tfrund)."""
    return _peer(sock)[1] == os.geteuid()


def _peer(sock: socket.socket) -> tuple[int, int]:
    """The pid and uid of the process at the other end of `sock`, as the kernel saw them at its connect."""
    pid, uid, _ = _PEERCRED.unpack(sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, _PEERCRED.size))
    return pid, uid


def private_key(path: Path, size: int) -> bytes:
    """The secret of `size` random bytes kept (as hex) in `path`, a file of this user's alone in a private
    folder: made on first use, and made anew, by a rename over it, if what is there is not such a file (a
    link, a FIFO, another's, open to others, cut short by a crash). Opened without following a link or
    blocking on a FIFO, and checked on the open descriptor."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError:
        return _new_key(path, size)  # missing, or a link (ELOOP): replaced
    try:
        info = os.fstat(fd)
        usable = stat.S_ISREG(info.st_mode) and info.st_uid == os.geteuid() and not info.st_mode & 0o077
        text = os.read(fd, 2 * size + 1) if usable and info.st_nlink == 1 else b""
    finally:
        os.close(fd)
    try:
        key = bytes.fromhex(text.decode("ascii"))
    except ValueError:  # not hex (nor ASCII: UnicodeDecodeError is a ValueError)
        key = b""
    return key if len(key) == size else _new_key(path, size)


def _new_key(path: Path, size: int) -> bytes:
    """A fresh secret written to a new 0600 file beside `path`, then renamed onto it."""
    import secrets

    key = secrets.token_bytes(size)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    with contextlib.suppress(FileNotFoundError):
        tmp.unlink()
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    try:
        os.write(fd, key.hex().encode("ascii"))
        os.fsync(fd)
    finally:
        os.close(fd)
    os.replace(tmp, path)
    return key
