"""A small disk of a test's own: a tmpfs mounted on a folder (root only), and a way to fill it."""

from __future__ import annotations

import contextlib
import errno
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest


@contextlib.contextmanager
def small_disk(folder: Path, size: str = "32m") -> Iterator[Path]:
    """`folder`, a tmpfs of `size` for as long as the block runs: a disk that a test can fill. Skips the test
    where it cannot be mounted (not root, no mount)."""
    if os.geteuid() != 0:
        pytest.skip("needs root to mount a tmpfs")
    folder.mkdir(parents=True, exist_ok=True)
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(folder)], capture_output=True)
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {mounted.stderr.decode().strip()}")
    try:
        yield folder
    finally:
        subprocess.run(["umount", "-l", str(folder)], check=True)


def fill_up(disk: Path) -> Path:
    """Write a file until `disk` has no space left; the file, to free the space again."""
    filler = disk / "filler"
    fd = os.open(filler, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    try:
        while True:
            os.write(fd, b"\0" * (1 << 16))
    except OSError as exc:
        assert exc.errno == errno.ENOSPC
    try:
        while True:  # the last blocks, a smaller write at a time
            os.write(fd, b"\0" * 512)
    except OSError as exc:
        assert exc.errno == errno.ENOSPC
    finally:
        os.close(fd)
    return filler
