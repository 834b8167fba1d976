"""Copying a work dir into a job's folder, so later edits never change a queued or running job."""

from __future__ import annotations

import os
import shutil
import stat
from pathlib import Path

# Never part of a snapshot: version control internals and caches that the job regenerates.
SKIPPED_DIRS = frozenset({".git", ".hg", ".svn", "__pycache__", ".mypy_cache", ".pytest_cache", ".ruff_cache"})


class SnapshotError(Exception):
    """The work dir cannot be copied; the message names the path that failed."""


def take(src: Path, dest: Path) -> int:
    """Copy `src` into `dest` (created here, must not exist) and return the number of bytes copied.

    Regular files keep their mode bits; symlinks stay symlinks (a symlinked data set is not copied), made
    absolute when they point outside `src`, so they still resolve from the job's folder. Sockets, FIFOs
    and devices are skipped: reading a FIFO would block forever. The copy goes to a temporary name and is
    renamed into place, so a crash never leaves a half snapshot at `dest`.
    """
    if not src.is_dir():
        raise SnapshotError(f"work dir {src} is not a directory")
    if not os.access(src, os.R_OK | os.X_OK):
        raise SnapshotError(f"work dir {src} is not readable")
    partial = dest.with_name(dest.name + ".partial")
    shutil.rmtree(partial, ignore_errors=True)
    total = 0
    try:
        for root, dirs, files in os.walk(src, onerror=_raise):
            dirs[:] = sorted(d for d in dirs if d not in SKIPPED_DIRS)
            rel = Path(root).relative_to(src)
            target_dir = partial / rel
            target_dir.mkdir(parents=True, exist_ok=True)
            for name in [*files, *(d for d in dirs if (Path(root) / d).is_symlink())]:
                total += _copy_entry(src, Path(root) / name, target_dir / name)
            dirs[:] = [d for d in dirs if not (Path(root) / d).is_symlink()]
    except OSError as exc:
        shutil.rmtree(partial, ignore_errors=True)
        where = exc.filename or src
        raise SnapshotError(f"cannot copy work dir: {where}: {exc.strerror or exc}") from None
    os.rename(partial, dest)
    return total


def _copy_entry(src_root: Path, path: Path, target: Path) -> int:
    st = path.lstat()
    if stat.S_ISLNK(st.st_mode):
        link = os.readlink(path)
        resolved = (path.parent / link).resolve()
        if not os.path.isabs(link) and not _inside(resolved, src_root.resolve()):
            link = str(resolved)
        os.symlink(link, target)
        return 0
    if not stat.S_ISREG(st.st_mode):
        return 0
    shutil.copy2(path, target, follow_symlinks=False)
    return st.st_size


def _inside(path: Path, root: Path) -> bool:
    return path == root or root in path.parents


def _raise(exc: OSError) -> None:
    raise exc
