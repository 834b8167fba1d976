"""Where `tfrun pull` writes what a daemon names: only under the folder the user gave, never through a link.

What a daemon lists is not trusted (it may be another user's listener, issue 44): `Landing` opens the
destination once and every folder below it relative to the one above, with O_NOFOLLOW, so a symbolic link in
the destination's existing tree (or one put there during the pull) is never followed, and a folder or a file
that another user owns is never written in or replaced. A file arrives in a new temporary file of its folder
(O_EXCL), made with the listed mode's permission bits and masked by the umask as any new file is (no setuid,
setgid or sticky bit), then renamed over its name: what stood there is replaced, never written through.
"""

from __future__ import annotations

import contextlib
import errno
import os
import pwd
import secrets
import stat
from pathlib import Path

_FOLDER = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_NEW_FILE = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC


class NotHere(Exception):
    """What is in the destination where an entry would go does not take it; the message says what."""


class Landing:
    """The destination of a pull, open; `close` when done."""

    def __init__(self, dest: Path) -> None:
        self.dest = dest
        self.fd = os.open(dest, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)  # the user's choice: a link is fine

    def close(self) -> None:
        os.close(self.fd)

    def folder(self, parts: list[str]) -> int:
        """A descriptor of the folder `parts` under the destination, each part made if missing (mode 0777 less
        the umask, as mkdir makes folders), the caller to close it; NotHere for a link, a non-folder or another
        user's folder on the way."""
        fd = os.dup(self.fd)
        for i, part in enumerate(parts):
            fd = self._enter(fd, part, parts[: i + 1])
        return fd

    def _enter(self, fd: int, part: str, shown: list[str]) -> int:
        """The folder `part` under `fd` (which is closed), made if missing."""
        try:
            with contextlib.suppress(FileExistsError):
                os.mkdir(part, 0o777, dir_fd=fd)
            child = os.open(part, _FOLDER, dir_fd=fd)
        except OSError as exc:
            if exc.errno not in (errno.ELOOP, errno.ENOTDIR):
                raise
            link = stat.S_ISLNK(os.stat(part, dir_fd=fd, follow_symlinks=False).st_mode)
            raise NotHere(f"{self.named(shown)} is {'a symbolic link' if link else 'not a folder'}") from None
        finally:
            os.close(fd)
        owner = os.fstat(child).st_uid
        if owner != os.geteuid():
            os.close(child)
            raise NotHere(f"{self.named(shown)} belongs to {_user(owner)}")
        return child

    def check_replaceable(self, folder: int, parts: list[str]) -> None:
        """NotHere unless the name `parts[-1]` in `folder` is free or a regular file of this user's."""
        try:
            st = os.stat(parts[-1], dir_fd=folder, follow_symlinks=False)
        except FileNotFoundError:
            return
        if stat.S_ISLNK(st.st_mode):
            raise NotHere(f"{self.named(parts)} is a symbolic link")
        if not stat.S_ISREG(st.st_mode):
            raise NotHere(f"{self.named(parts)} is not a file")
        if st.st_uid != os.geteuid():
            raise NotHere(f"{self.named(parts)} belongs to {_user(st.st_uid)}")

    def named(self, parts: list[str]) -> str:
        """The local path of `parts`, as the user would type it."""
        return os.path.join(str(self.dest), *parts)


def new_file(folder: int, name: str, mode: int) -> tuple[int, str]:
    """(a descriptor open for writing, its name) of a new hidden file in `folder` beside `name`: its mode the
    permission bits of `mode`, masked by the umask, and at least readable and writable by its owner."""
    tmp = f".{name}.{secrets.token_hex(4)}.tfrun-pull"
    return os.open(tmp, _NEW_FILE, (mode & 0o777) | 0o600, dir_fd=folder), tmp


def _user(uid: int) -> str:
    try:
        return pwd.getpwuid(uid).pw_name
    except KeyError:
        return f"uid {uid}"
