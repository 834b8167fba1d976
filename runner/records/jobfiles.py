"""A job's files as `tfrun pull` reaches them: the job's *namespace*, confined to the job's folders.

A path in the namespace is relative: "checkpoints/..." is under the job's checkpoint folder, anything else
under its job folder. It resolves only to something inside the folder it names, symlinks followed, so no
request reads or lists a file of another job or of the box. Entries are named from the path's last part
down, as a pull writes them.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Iterator
from pathlib import Path, PurePosixPath
from typing import BinaryIO

from tfrun.constants import FILE_CHUNK_BYTES
from tfrun.content import ManifestError, check_relative
from tfrun.protocol.files import FileChunk
from tfrun.protocol.submit import FileEntry
from tfrun.runner.records.job import JobRow


class Refused(Exception):
    """The path names nothing that may be read here; the message says why, for the client."""


def resolve(row: JobRow, path: str) -> tuple[Path, PurePosixPath]:
    """(the file, its name as a pull writes it) for `path` in the job's namespace."""
    try:
        parts = check_relative(path.strip("/"))
    except ManifestError as exc:
        raise Refused(str(exc)) from None
    if parts[0] == "checkpoints":
        root, inner = Path(row.checkpoint_dir), parts[1:]
    else:
        root, inner = Path(row.job_dir), parts
    target = root.joinpath(*inner)
    real_root = os.path.realpath(root)
    real = os.path.realpath(target)
    if real != real_root and not real.startswith(real_root + os.sep):
        raise Refused(f"{path} leads out of job {row.id}'s folders")
    if not os.path.lexists(target):
        raise Refused(f"job {row.id} has no {path}")
    return target, PurePosixPath(parts[-1])


def entries(target: Path, name: PurePosixPath) -> list[FileEntry]:
    """Every entry under `target`, itself first, named from `name` down; symlinks are listed, not followed."""
    found: list[FileEntry] = []

    def add(path: Path, label: PurePosixPath) -> None:
        st = path.lstat()
        if stat.S_ISLNK(st.st_mode):
            found.append(FileEntry(str(label), "symlink", target=os.readlink(path)))
        elif stat.S_ISDIR(st.st_mode):
            found.append(FileEntry(str(label), "dir", mode=stat.S_IMODE(st.st_mode), mtime=st.st_mtime))
            for child in sorted(path.iterdir()):
                add(child, label / child.name)
        elif stat.S_ISREG(st.st_mode):
            found.append(
                FileEntry(str(label), "file", mode=stat.S_IMODE(st.st_mode), size=st.st_size, mtime=st.st_mtime)
            )

    add(target, name)
    return found


def open_at(row: JobRow, path: str, offset: int) -> BinaryIO:
    """The regular file at `path` in the job's namespace, open for reading from `offset`; never through a
    symlink at its last part."""
    target, _ = resolve(row, path)
    try:
        fd = os.open(target, os.O_RDONLY | os.O_NOFOLLOW)
    except OSError as exc:
        raise Refused(f"cannot read {path}: {exc.strerror}") from None
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
    """The rest of `f`, read from `offset`, as the chunks a ReadFile reply sends; the last one says so."""
    while True:
        data = f.read(FILE_CHUNK_BYTES)
        last = len(data) < FILE_CHUNK_BYTES
        yield FileChunk(offset=offset, last=last, data=data)
        offset += len(data)
        if last:
            return
