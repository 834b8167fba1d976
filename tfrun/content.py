"""Content addressing and path confinement, shared by both sides of an upload or a pull.

Whoever writes files that the other side named checks the names here first: the daemon building a
job's work dir from a client's manifest, and the client writing what `tfrun pull` brings back.
"""

from __future__ import annotations

import hashlib
import os
import re
from pathlib import Path

from tfrun.protocol.submit import FILE_KINDS, FileEntry

_DIGEST = re.compile(r"[0-9a-f]{64}")


class ManifestError(Exception):
    """A list of files that cannot be written safely; the message names the entry."""


def sha256_file(path: str | Path) -> str:
    """The file's SHA-256. Reads 64 KiB at a time with os.read: a 1 MiB buffer per read costs more than
    hashing the few kB of a typical source file, and a snapshot hashes thousands of them."""
    digest = hashlib.sha256()
    fd = os.open(path, os.O_RDONLY)
    try:
        while chunk := os.read(fd, 1 << 16):
            digest.update(chunk)
    finally:
        os.close(fd)
    return digest.hexdigest()


def valid_digest(digest: str) -> bool:
    """A SHA-256 in lower-case hex. A regular expression: a submit checks thousands, several times."""
    return _DIGEST.fullmatch(digest) is not None


def check_relative(path: str) -> list[str]:
    """The parts of `path`, a plain relative path (no '..', '.', empty parts, NUL or leading '/'), or
    ManifestError. String operations only: a manifest of thousands of entries goes through here."""
    parts = path.split("/")
    if not path or "\0" in path or any(part in ("", ".", "..") for part in parts):
        raise ManifestError(f"{path!r}: not a plain relative path")
    return parts


def check_manifest(files: list[FileEntry]) -> list[FileEntry]:
    """The entries in creation order (parents first), or ManifestError for any entry that could escape.

    Every parent of an entry must itself be a "dir" entry, so nothing is ever written through a symlink,
    a file, or a folder the list did not create. (Checking the immediate parent is enough: that parent
    is an entry too, whose own parent is checked in turn.)
    """
    kinds: dict[str, str] = {}
    for entry in files:
        if entry.kind not in FILE_KINDS:
            raise ManifestError(f"{entry.path!r}: unknown kind {entry.kind!r}")
        check_relative(entry.path)
        if entry.path in kinds:
            raise ManifestError(f"{entry.path!r}: listed twice")
        if entry.kind == "file" and entry.digest is not None and not valid_digest(entry.digest):
            raise ManifestError(f"{entry.path!r}: not a SHA-256 digest")
        if entry.kind == "symlink" and (not entry.target or "\0" in entry.target):
            raise ManifestError(f"{entry.path!r}: a symlink needs a target")
        kinds[entry.path] = entry.kind
    for entry in files:
        parent = entry.path.rpartition("/")[0]
        if parent and kinds.get(parent) != "dir":
            raise ManifestError(f"{entry.path!r}: its folder {parent!r} is not a listed folder")
    return sorted(files, key=lambda e: (e.path.count("/"), e.path))
