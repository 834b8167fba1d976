"""The daemon's content store and the snapshots it builds from it.

Work dir files arrive once, named by their SHA-256: a re-submit of an unchanged work dir sends no file
bytes at all. A job's `work/` is then built from the store by copying (not linking: a job that rewrites
one of its files must never change the stored content another job will get).

Everything a client names is checked before anything is written: paths are relative, without `..` or
empty parts, and nothing is ever written through a symlink, so no name in a manifest can make the daemon
write outside the job's folder.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import stat
from pathlib import Path

from tfrun.content import ManifestError, check_manifest, sha256_file, valid_digest
from tfrun.protocol import FileEntry


class BlobStore:
    def __init__(self, root: Path) -> None:
        self._root = str(root)  # paths as strings: thousands are made per submit, and Path is slow
        self.incoming = root / "incoming"
        self.incoming.mkdir(parents=True, exist_ok=True)

    def path(self, digest: str) -> str:
        return os.path.join(self._root, digest[:2], digest)

    def has(self, digest: str) -> bool:
        return os.path.isfile(self.path(digest))

    def missing(self, digests: list[str]) -> list[str]:
        bad = [d for d in digests if not valid_digest(d)]
        if bad:
            raise ManifestError(f"not a SHA-256 digest: {bad[0][:80]!r}")
        return sorted({d for d in digests if not self.has(d)})

    def write_chunk(self, key: str, digest: str, offset: int, data: bytes, last: bool) -> None:
        """Append a chunk to the partial content `key` (one per connection); on the last, verify and keep it.

        A content that fits in one chunk (most source files) is checked in memory and written once.
        """
        if not valid_digest(digest):
            raise ManifestError(f"not a SHA-256 digest: {digest[:80]!r}")
        partial = self.incoming / f"{digest}.{key}"
        if offset == 0 and last:
            if hashlib.sha256(data).hexdigest() != digest:
                raise ManifestError(f"content of {digest[:12]} does not match its digest")
            partial.write_bytes(data)
        else:
            if offset == 0:
                partial.unlink(missing_ok=True)
            elif not partial.exists() or partial.stat().st_size != offset:
                raise ManifestError(f"chunk of {digest[:12]} at byte {offset} does not follow what was received")
            with open(partial, "ab") as f:
                f.write(data)
            if not last:
                return
            if sha256_file(partial) != digest:
                partial.unlink()
                raise ManifestError(f"content of {digest[:12]} does not match its digest")
        target = self.path(digest)
        os.makedirs(os.path.dirname(target), exist_ok=True)
        os.replace(partial, target)

    def write_many(self, digests: list[str], sizes: list[int], data: bytes) -> None:
        """Keep several whole contents that arrived packed in one frame."""
        if len(digests) != len(sizes) or sum(sizes) != len(data) or any(s < 0 for s in sizes):
            raise ManifestError("packed contents do not add up to the bytes sent")
        offset = 0
        for digest, size in zip(digests, sizes):
            self.write_chunk("packed", digest, 0, data[offset : offset + size], True)
            offset += size

    def discard(self, key: str) -> None:
        """Forget the partial contents of a connection that went away."""
        for partial in self.incoming.glob(f"*.{key}"):
            partial.unlink(missing_ok=True)

    def build(self, files: list[FileEntry], dest: Path) -> None:
        """Create `dest` (must not exist) holding `files`; atomically, via a temporary sibling."""
        entries = check_manifest(files)
        if any(e.kind == "file" and not e.digest for e in entries):
            raise ManifestError("every file of a snapshot needs its SHA-256 digest")
        lacking = self.missing([e.digest for e in entries if e.kind == "file" and e.digest])
        if lacking:
            raise ManifestError(f"{len(lacking)} file content(s) were never uploaded, e.g. {lacking[0][:12]}")
        partial = dest.with_name(dest.name + ".partial")
        shutil.rmtree(partial, ignore_errors=True)
        partial.mkdir()
        try:
            for entry in entries:
                target = partial / entry.path
                if entry.kind == "dir":
                    target.mkdir(mode=0o755)
                elif entry.kind == "symlink":
                    os.symlink(entry.target or "", target)
                else:
                    assert entry.digest is not None
                    _copy_new(self.path(entry.digest), target, entry.mode)
        except OSError:
            shutil.rmtree(partial, ignore_errors=True)
            raise
        os.rename(partial, dest)


def _copy_new(source: str, target: Path, mode: int) -> None:
    """Copy to a file that must not exist yet (O_EXCL | O_NOFOLLOW: never through a link), in the kernel."""
    mode = stat.S_IMODE(mode) & 0o777 | 0o600  # the daemon's user keeps read and write access
    out = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, mode)
    try:
        src = os.open(source, os.O_RDONLY)
        try:
            size = os.fstat(src).st_size
            offset = 0
            while offset < size:
                sent = os.sendfile(out, src, offset, size - offset)
                if sent == 0:
                    break
                offset += sent
        finally:
            os.close(src)
        os.fchmod(out, mode)
    finally:
        os.close(out)
