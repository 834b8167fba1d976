"""A job's files as `tfrun pull` reaches them: the job's *namespace*, confined to the job's folders.

A path in the namespace is relative: "checkpoints/..." is under the job's checkpoint folder, anything else
under its job folder. Entries are named from the path's last part down, as a pull writes them.

Everything is reached through folder descriptors, never through a symlink: the job's folder is opened with
O_NOFOLLOW and must be a real folder of this user's that no one else may write (a checkpoint folder sits on a
root other users may share: on a root without the sticky bit, another user can rename it and leave a link to
anywhere, or a folder of theirs, in its place), and each part below it is opened the same way, relative to
the one above. So no request reads or lists anything but what the job's own folders hold, whatever is swapped
meanwhile; a symlink the job made is listed as one, never followed. Files are opened O_NONBLOCK, so a FIFO
found in a folder never holds the daemon.
"""

from __future__ import annotations

import errno
import os
import stat
from collections.abc import Iterator
from pathlib import Path, PurePosixPath
from typing import BinaryIO

from tfrun.constants import FILE_CHUNK_BYTES
from tfrun.content import ManifestError, check_relative
from tfrun.protocol.files import FileChunk
from tfrun.protocol.submit import FileEntry

from .job import JobRow

_FOLDER = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_FILE = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC


class Refused(Exception):
    """The path names nothing that may be read here; the message says why, for the client."""


def resolve(row: JobRow, path: str) -> tuple[int, str, PurePosixPath]:
    """(a descriptor of the folder that holds it, its name there, its name as a pull writes it) for `path` in
    the job's namespace; the caller closes the descriptor. "checkpoints" alone is the folder itself: (its
    descriptor, ".")."""
    try:
        parts = check_relative(path.strip("/"))
    except ManifestError as exc:
        raise Refused(str(exc)) from None
    if parts[0] == "checkpoints":
        root, inner, what = Path(row.checkpoint_dir), parts[1:], f"job {row.id}'s checkpoint folder"
    else:
        root, inner, what = Path(row.job_dir), parts, f"job {row.id}'s folder"
    try:
        fd = open_own_folder(root, what)
    except FileNotFoundError:
        raise Refused(f"job {row.id} has no {path}") from None
    try:
        for part in inner[:-1]:
            child = _descend(fd, part, path)
            os.close(fd)
            fd = child
        name = inner[-1] if inner else "."
        os.stat(name, dir_fd=fd, follow_symlinks=False)
    except FileNotFoundError:
        os.close(fd)
        raise Refused(f"job {row.id} has no {path}") from None
    except OSError as exc:  # a name too long for the filesystem, a folder that may not be entered, ...
        os.close(fd)
        raise Refused(f"cannot read {path}: {exc.strerror or exc}") from None
    except BaseException:
        os.close(fd)
        raise
    return fd, name, PurePosixPath(parts[-1])


def open_own_folder(folder: Path, what: str) -> int:
    """A descriptor of `folder`, opened without following a link at its name, if it is a real folder of this
    user's that no one else may write; else Refused naming it and what is there (FileNotFoundError if none)."""
    try:
        fd = os.open(folder, _FOLDER)
    except FileNotFoundError:
        raise
    except OSError as exc:
        found = "a symbolic link" if os.path.islink(folder) else f"something else ({exc.strerror})"
        raise Refused(f"{what} {folder} is not read: {found} is in its place") from None
    st = os.fstat(fd)
    problem = None
    if st.st_uid != os.geteuid():
        problem = f"it belongs to uid {st.st_uid}, not to you"
    elif st.st_mode & 0o022:
        problem = f"other users may write in it (mode {stat.S_IMODE(st.st_mode):04o})"
    if problem is not None:
        os.close(fd)
        raise Refused(f"{what} {folder} is not read: {problem}")
    return fd


def _descend(fd: int, part: str, path: str) -> int:
    """The folder `part` under `fd`, never through a symbolic link."""
    try:
        return os.open(part, _FOLDER, dir_fd=fd)
    except OSError as exc:
        if exc.errno not in (errno.ELOOP, errno.ENOTDIR):
            raise
        raise Refused(f"{path} leads through {part!r}, which is not a folder") from None


def entries(fd: int, name: str, label: PurePosixPath) -> list[FileEntry]:
    """Every entry at `name` under the folder `fd` and below, itself first, named from `label` down; symlinks
    are listed, not followed, and anything else but files and folders is left out. Closes `fd`."""
    found: list[FileEntry] = []

    def add(parent: int, name: str, label: PurePosixPath) -> None:
        st = os.stat(name, dir_fd=parent, follow_symlinks=False)
        if stat.S_ISLNK(st.st_mode):
            found.append(FileEntry(str(label), "symlink", target=os.readlink(name, dir_fd=parent)))
        elif stat.S_ISREG(st.st_mode):
            mode = stat.S_IMODE(st.st_mode)
            found.append(FileEntry(str(label), "file", mode=mode, size=st.st_size, mtime=st.st_mtime))
        elif stat.S_ISDIR(st.st_mode):
            found.append(FileEntry(str(label), "dir", mode=stat.S_IMODE(st.st_mode), mtime=st.st_mtime))
            try:
                folder = os.open(name, _FOLDER, dir_fd=parent)
            except OSError:
                return  # swapped for something else since the stat: listed as it was
            try:
                with os.scandir(folder) as children:
                    names = sorted(child.name for child in children)
                for child in names:
                    add(folder, child, label / child)
            finally:
                os.close(folder)

    try:
        add(fd, name, label)
    finally:
        os.close(fd)
    return found


def open_at(row: JobRow, path: str, offset: int) -> BinaryIO:
    """The regular file at `path` in the job's namespace, open for reading from `offset`."""
    folder, name, _ = resolve(row, path)
    try:
        fd = os.open(name, _FILE, dir_fd=folder)
    except OSError as exc:
        raise Refused(f"cannot read {path}: {exc.strerror}") from None
    finally:
        os.close(folder)
    st = os.fstat(fd)
    problem = None
    if not stat.S_ISREG(st.st_mode):
        problem = f"{path} is not a file"
    elif offset > st.st_size:
        problem = f"offset {offset} is past the end of {path} ({st.st_size} bytes)"
    if problem is not None:
        os.close(fd)  # before os.fdopen, which raises IsADirectoryError on a folder and leaves the fd open
        raise Refused(problem)
    f = os.fdopen(fd, "rb")
    f.seek(offset)
    return f


def chunks(f: BinaryIO, offset: int) -> Iterator[FileChunk]:
    """The rest of `f`, read from `offset` up to where it ended when asked, as the chunks a ReadFile reply sends;
    the last one says so. A file a job keeps writing (its output.log) would otherwise be chased without end."""
    end = os.fstat(f.fileno()).st_size
    while True:
        data = f.read(max(0, min(FILE_CHUNK_BYTES, end - offset)))
        last = not data or offset + len(data) >= end
        yield FileChunk(offset=offset, last=last, data=data)
        offset += len(data)
        if last:
            return
