"""The client's own files, this user's alone: config.toml (a host's --env values: a token, a TFRUN_HOME),
hosts.json (what was learnt of each box's daemon) and the wheels `hosts install` builds. Another user of this
machine (a login node, a shared workstation) must read none of them, nor leave one for tfrun to trust.

- The folders tfrun owns (~/.config/tfrun, ~/.cache/tfrun) are made 0700, like each missing folder above them
  (as the XDG spec asks); one an older tfrun made with the umask (0755) is made 0700 when it is next used;
  one of another user's is refused, naming its owner (root's is taken where no one else may write it, as
  OpenSSH takes ~/.ssh/config: a dotfiles manager's read-only store).
- A file is written to a fresh name made 0600 with O_EXCL and O_NOFOLLOW in its folder, held open by a
  descriptor (a folder swapped meanwhile changes nothing), then renamed over the old file: never readable by
  others for a moment, never written through a link someone left there.
- A file is read through one open and its fstat: a regular file (O_NONBLOCK: a FIFO in its place never
  blocks the read) of this user's (or root's, as above), made 0600 if it was looser. A link is followed only
  where the user may keep one on purpose (config.toml in a dotfiles repository); what it names is checked
  all the same.
"""

from __future__ import annotations

import contextlib
import os
import stat
from pathlib import Path
from typing import Optional

from tfrun.constants import EXIT_USAGE, PRIVATE_DIR_MODE

from ..errors import TfrunError

PRIVATE_FILE_MODE = 0o600


def cache_dir() -> Path:
    """tfrun's folder in the user's cache folder ($XDG_CACHE_HOME/tfrun, else ~/.cache/tfrun)."""
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "tfrun"


def private_folder(folder: Path) -> Path:
    """`folder`, made (0700) or made 0700 if it was looser, once it is checked to be this user's."""
    try:
        os.close(_open_folder(folder, own=True, make=True))
    except OSError as exc:
        raise TfrunError(f"cannot make {folder}: {exc.strerror or exc}", EXIT_USAGE) from None
    return folder


def write(path: Path, data: bytes, own_folder: bool = True) -> None:
    """Put `data` at `path` (0600) in one rename. `own_folder`: the folder is tfrun's (made or tightened to
    0700 and checked to be this user's); otherwise it is the user's choice (TFRUN_CONFIG), left as it is."""
    try:
        folder = _open_folder(path.parent, own=own_folder, make=True)
        try:
            _write_in(folder, path.name, data)
        finally:
            os.close(folder)
    except OSError as exc:
        raise TfrunError(f"cannot write {path}: {exc.strerror or exc}", EXIT_USAGE) from None


def read(path: Path, follow: bool = False, own_folder: bool = True) -> Optional[bytes]:
    """The contents of `path`, None if there is no such file; anything but a regular file of this user's (see
    `_tighten`), or a link unless `follow`, is refused with a TfrunError that says what to do."""
    try:
        folder = _open_folder(path.parent, own=own_folder, make=False)
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise TfrunError(f"cannot read {path}: {exc.strerror or exc}", EXIT_USAGE) from None
    try:
        return _read_in(folder, path, follow)
    finally:
        os.close(folder)


def _open_folder(folder: Path, own: bool, make: bool) -> int:
    """A descriptor on `folder` (made first if `make`, with each missing folder above it, 0700). `own`: it
    is checked as a file is (`_tighten`), and made 0700 if it was looser."""
    if make:
        for missing in reversed([above for above in (folder, *folder.parents) if not os.path.lexists(above)]):
            with contextlib.suppress(FileExistsError):
                os.mkdir(missing, PRIVATE_DIR_MODE)
    fd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        if own:
            _tighten(fd, folder, PRIVATE_DIR_MODE)
    except BaseException:
        os.close(fd)
        raise
    return fd


def _write_in(folder: int, name: str, data: bytes) -> None:
    tmp = f".{name}.{os.getpid()}.{os.urandom(4).hex()}.tmp"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, PRIVATE_FILE_MODE,
                 dir_fd=folder)  # fmt: skip
    try:
        with os.fdopen(fd, "wb") as out:
            out.write(data)
        os.replace(tmp, name, src_dir_fd=folder, dst_dir_fd=folder)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp, dir_fd=folder)
        raise


def _read_in(folder: int, path: Path, follow: bool) -> Optional[bytes]:
    flags = os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC | (0 if follow else os.O_NOFOLLOW)
    try:
        fd = os.open(path.name, flags, dir_fd=folder)
    except FileNotFoundError:
        return None
    except OSError as exc:
        if not follow and stat.S_ISLNK(os.lstat(path.name, dir_fd=folder).st_mode):
            raise TfrunError(f"{path} is a symbolic link, not a file of yours: remove it", EXIT_USAGE) from None
        raise TfrunError(f"cannot read {path}: {exc.strerror or exc}", EXIT_USAGE) from None
    with os.fdopen(fd, "rb") as file:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise TfrunError(f"{path} is not a regular file: remove it", EXIT_USAGE)
        _tighten(fd, path, stat.S_IMODE(info.st_mode) & PRIVATE_DIR_MODE)
        return file.read()


def _tighten(fd: int, path: Path, mode: int) -> None:
    """Refuse what `fd` holds unless it is this user's, or root's (a dotfiles manager's read-only store, as
    OpenSSH takes ~/.ssh/config) and no one else may write it; one of this user's that others may open is
    given `mode` (no bits for group and others)."""
    info = os.fstat(fd)
    if info.st_uid not in (os.geteuid(), 0):
        raise TfrunError(f"{path} is not yours (owner uid {info.st_uid}): remove it", EXIT_USAGE)
    if info.st_uid != os.geteuid():
        if info.st_mode & 0o022:
            raise TfrunError(f"{path} may be changed by other users (mode {stat.S_IMODE(info.st_mode):04o}, owner "
                             "root): remove it", EXIT_USAGE)  # fmt: skip
    elif info.st_mode & 0o077:
        os.fchmod(fd, mode)
