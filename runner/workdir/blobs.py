"""The daemon's content store and the snapshots it builds from it.

Work dir files arrive once, named by their SHA-256: a re-submit of an unchanged work dir sends no file
bytes at all. A job's `work/` is then built from the store by copying (not linking: a job that rewrites
one of its files must never change the stored content another job will get).

Copying a thousand files costs more than sending the one that changed, so after each submit the daemon
prepares, in the background, a spare copy of that snapshot (`Spares`). The next submit from the same
folder takes the spare, patches the few entries that differ, and renames it into place: a private copy
still, at the cost of the change only.

Everything a client names is checked before anything is written: paths are relative, without `..` or
empty parts, and nothing is ever written through a symlink, so no name in a manifest can make the daemon
write outside the job's folder.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import math
import os
import shutil
import stat
import threading
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Optional

from tfrun.constants import SPARE_COUNT, SPARE_MAX_BYTES, WORK_FILE_MODE_MASK
from tfrun.content import ManifestError, check_manifest, sha256_file, valid_digest
from tfrun.protocol.submit import FileEntry
from tfrun.protocol.wire import plain
from tfrun.shorten import shorten


class BlobStore:
    def __init__(self, root: Path) -> None:
        self._root = str(root)  # paths as strings: thousands are made per submit, and Path is slow
        self.incoming = root / "incoming"
        self.incoming.mkdir(parents=True, exist_ok=True)
        self._known: set[str] = set()  # digests seen stored (a collection forgets those it removes)
        # Collections (runner/housekeeping.py) against submits in flight: a content a connection was told of
        # (`missing` with a holder) is held until it hangs up, and one it let go of after a collection began is
        # left to the next (that one may have read the jobs' manifests before the submit made its job).
        self._lock = threading.Lock()  # guards the three below, and each removal
        self._holds: dict[str, set[str]] = {}  # connection key -> digests it was told of
        self._seen: dict[str, float] = {}  # digest -> when a connection let go of it (monotonic)
        self._collections: list[float] = []  # when each collection under way began
        self._collecting = threading.Lock()  # one collection at a time

    def path(self, digest: str) -> str:
        return os.path.join(self._root, digest[:2], digest)

    def has(self, digest: str) -> bool:
        if digest in self._known:
            return True
        if os.path.isfile(self.path(digest)):
            self._known.add(digest)
            return True
        return False

    def missing(self, digests: list[str], holder: Optional[str] = None) -> list[str]:
        """The digests not stored, once each, in the order given. With `holder` (a connection's key), the
        connection holds all of them until it hangs up (`discard`): a content it was told is here stays here
        until its submit has made its job. They are held before they are looked up, so no collection removes
        one between its look and the answer: the looks (100,000 stats) run outside the lock, which the event
        loop takes when a connection ends. Not sorted: sorting 100,000 digests held the GIL for 40 ms."""
        bad = [d for d in digests if not valid_digest(d)]
        if bad:
            raise ManifestError(f"not a SHA-256 digest: {shorten(bad[0], 80)!r}")
        with self._lock:
            if holder is None:
                return [d for d in dict.fromkeys(digests) if not self.has(d)]
            self._holds.setdefault(holder, set()).update(digests)
        return [d for d in dict.fromkeys(digests) if not self.has(d)]  # held: no removal races these looks

    def write_chunk(self, key: str, digest: str, offset: int, data: bytes, last: bool) -> None:
        """Append a chunk to the partial content `key` (one per connection); on the last, verify and keep it.

        A content that fits in one chunk (most source files) is checked in memory and written once.
        """
        if not valid_digest(digest):
            raise ManifestError(f"not a SHA-256 digest: {shorten(digest, 80)!r}")
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

    def write_many(self, key: str, digests: list[str], sizes: list[int], data: bytes) -> None:
        """Keep several whole contents that arrived packed in one frame, through the partials of connection
        `key`: two submits of the same file at once each write their own (one shared name let the second
        rename find nothing)."""
        if len(digests) != len(sizes) or sum(sizes) != len(data) or any(s < 0 for s in sizes):
            raise ManifestError("packed contents do not add up to the bytes sent")
        offset = 0
        for digest, size in zip(digests, sizes):
            self.write_chunk(key, digest, 0, data[offset : offset + size], True)
            offset += size

    def discard(self, key: str) -> None:
        """Forget the partial contents of a connection that went away, and let go of what it held."""
        for partial in self.incoming.glob(f"*.{key}"):
            partial.unlink(missing_ok=True)
        with self._lock:
            held = self._holds.pop(key, ())
            if self._collections:  # only a collection under way can have read the manifests before its job
                now = time.monotonic()
                self._seen.update(dict.fromkeys(held, now))

    def build(self, files: list[FileEntry], dest: Path) -> None:
        """Create `dest` (must not exist) holding `files`; atomically, via a temporary sibling."""
        entries = self.checked(files)
        partial = dest.with_name(dest.name + ".partial")
        shutil.rmtree(partial, ignore_errors=True)
        partial.mkdir()
        try:
            for entry in entries:
                self.create(entry, partial / entry.path)
        except OSError:
            shutil.rmtree(partial, ignore_errors=True)
            raise
        os.rename(partial, dest)

    def checked(self, files: list[FileEntry]) -> list[FileEntry]:
        """The entries in creation order, once every name is safe and every content is here."""
        entries = check_manifest(files)
        if any(e.kind == "file" and not e.digest for e in entries):
            raise ManifestError("every file of a snapshot needs its SHA-256 digest")
        lacking = self.missing([e.digest for e in entries if e.kind == "file" and e.digest])
        if lacking:
            raise ManifestError(f"{len(lacking)} file content(s) were never uploaded, e.g. {lacking[0][:12]}")
        return entries

    def begin_collection(self) -> float:
        """Note that a collection starts now, before the caller reads which contents the jobs name: what a
        connection lets go of from now on is kept by it (its submit may have made a job after that read)."""
        with self._lock:
            start = time.monotonic()
            self._collections.append(start)
            return start

    def collect(
        self,
        start: float,
        needed: Callable[[], set[str]],
        grace: float,
        limit: Optional[int] = None,
        dry_run: bool = False,
    ) -> Collected:
        """Remove the contents that `needed()` does not name, oldest first: all of them, or with `limit` only
        until the store takes at most `limit` bytes. Never one that arrived less than `grace` seconds ago, one
        a connection holds, or one let go of since `start` (from `begin_collection`). Sizes are bytes on
        disk, as `du` counts them."""
        try:
            with self._collecting:
                keep = needed()
                contents = sorted(self.contents())
                total = sum(size for _, _, size in contents)
                removed = freed = 0
                now = time.time()
                for mtime, digest, size in contents:
                    if limit is not None and total - freed <= limit:
                        break
                    if digest in keep or now - mtime < grace or not self._remove(digest, start, dry_run):
                        continue
                    removed += 1
                    freed += size
                return Collected(removed, freed, total - freed)
        finally:
            with self._lock:
                self._collections.remove(start)
                oldest = min(self._collections, default=time.monotonic())
                self._seen = {d: t for d, t in self._seen.items() if t >= oldest}

    def contents(self) -> Iterator[tuple[float, str, int]]:
        """(time it arrived, digest, bytes on disk) of each stored content."""
        with os.scandir(self._root) as folders:
            for folder in folders:
                if len(folder.name) != 2 or not folder.is_dir(follow_symlinks=False):
                    continue  # incoming/: partial uploads, which their connection discards
                with os.scandir(folder.path) as files:
                    for entry in files:
                        if valid_digest(entry.name):
                            with contextlib.suppress(FileNotFoundError):
                                st = entry.stat(follow_symlinks=False)
                                yield st.st_mtime, entry.name, st.st_blocks * 512

    def _remove(self, digest: str, start: float, dry_run: bool) -> bool:
        """Remove one content unless a connection holds it or let go of it since `start`."""
        with self._lock:
            if self._seen.get(digest, -math.inf) >= start or any(digest in held for held in self._holds.values()):
                return False
            if dry_run:
                return True
            try:
                os.unlink(self.path(digest))
            except FileNotFoundError:
                return False
            self._known.discard(digest)
            return True

    def create(self, entry: FileEntry, target: Path) -> None:
        """One entry of a snapshot at `target`, which must not exist; never through a link."""
        if entry.kind == "dir":
            target.mkdir(mode=0o755)
        elif entry.kind == "symlink":
            os.symlink(entry.target or "", target)
        else:
            assert entry.digest is not None
            _copy_new(self.path(entry.digest), target, entry.mode)


class Spares:
    """A ready copy of the latest snapshot of each source folder, for the next submit from there to patch.

    `spares/<key>/tree` is a snapshot exactly as `BlobStore.build` makes it and `spares/<key>/files.json`
    its manifest; `<key>` names the client's folder. Only the daemon writes here, and a spare is renamed
    out before it is patched, so two submits never share one. At most SPARE_COUNT spares are kept (the
    least recently made go first), none of a snapshot over SPARE_MAX_BYTES.
    """

    def __init__(self, root: Path, blobs: BlobStore) -> None:
        self.root = root
        self.blobs = blobs
        self._lock = threading.Lock()  # builds run in worker threads: taking and installing are atomic
        root.mkdir(parents=True, exist_ok=True)
        for stale in root.glob("*.partial"):  # a build a stopped daemon left half done
            shutil.rmtree(stale, ignore_errors=True)

    def build(self, files: list[FileEntry], dest: Path, source: Optional[str]) -> None:
        """Create `dest` holding `files`: from the spare of `source`, patched, if there is one."""
        entries = self.blobs.checked(files)
        taken = None if source is None else self._take(source, dest.with_name(dest.name + ".partial"))
        if taken is not None:
            tree, before = taken
            try:
                self._patch(tree, before, entries)
                os.rename(tree, dest)
                return
            except OSError:
                shutil.rmtree(tree, ignore_errors=True)  # e.g. a full disk: try once more from scratch
        self.blobs.build(files, dest)

    def prepare(self, files: list[FileEntry], source: Optional[str]) -> None:
        """Make the spare of `source` for its next submit: the same snapshot as `files`. In the background."""
        if source is None or sum(e.size for e in files if e.kind == "file") > SPARE_MAX_BYTES:
            return
        key = _spare_key(source)
        partial = self.root / f"{key}.{threading.get_ident()}.partial"
        shutil.rmtree(partial, ignore_errors=True)
        partial.mkdir()
        try:
            self.blobs.build(files, partial / "tree")
            write_manifest(partial / "files.json", files)
        except (OSError, ManifestError):
            shutil.rmtree(partial, ignore_errors=True)
            return
        with self._lock:
            old = self.root / key
            if old.exists():
                os.rename(old, self.root / f"{key}.old.{threading.get_ident()}.partial")
            os.rename(partial, old)
            spares = sorted((p for p in self.root.iterdir() if "." not in p.name), key=lambda p: p.stat().st_mtime)
            doomed = [p.rename(p.with_name(p.name + ".evicted.partial")) for p in spares[:-SPARE_COUNT]]
        for folder in [*self.root.glob(f"{key}.old.*.partial"), *doomed]:
            shutil.rmtree(folder, ignore_errors=True)

    def _take(self, source: str, where: Path) -> Optional[tuple[Path, dict[str, FileEntry]]]:
        """Move the spare of `source` to `where` and return it with its manifest; None if there is none."""
        spare = self.root / _spare_key(source)
        with self._lock:
            try:
                before = {e.path: e for e in read_manifest(spare / "files.json")}
                shutil.rmtree(where, ignore_errors=True)
                os.rename(spare / "tree", where)
            except (OSError, ValueError, TypeError):
                return None
            finally:
                shutil.rmtree(spare, ignore_errors=True)
        return where, before

    def _patch(self, tree: Path, before: dict[str, FileEntry], entries: list[FileEntry]) -> None:
        """Turn `tree`, a snapshot of `before`, into one of `entries`, touching only what differs."""
        after = {e.path: e for e in entries}
        for path in sorted(before, reverse=True):  # children before their folder
            if not _same(before[path], after.get(path)):
                target = tree / path
                if before[path].kind == "dir":
                    os.rmdir(target)
                else:
                    os.unlink(target)
        for entry in entries:  # folders before their children
            if not _same(before.get(entry.path), entry):
                self.blobs.create(entry, tree / entry.path)


def write_manifest(path: Path, files: list[FileEntry]) -> None:
    """Keep a snapshot's manifest (a job's, to build it again for a restart; a spare's, to patch it).
    Through a temporary file and a rename: a daemon killed half way leaves none, which a restart writes
    again, rather than a torn one that it would trust. json.dumps, not json.dump: dump streams through the
    pure-Python encoder, ~10x slower."""
    partial = path.with_name(path.name + ".partial")
    with open(partial, "w") as f:
        f.write(json.dumps(plain(files)))
    os.replace(partial, path)


def read_manifest(path: Path) -> list[FileEntry]:
    """A manifest kept by write_manifest; OSError, ValueError or TypeError if it is missing or damaged."""
    with open(path) as f:
        return [FileEntry(**entry) for entry in json.load(f)]


@dataclass
class Collected:
    """What a collection of the blob store removed, and what the store takes after it (bytes on disk)."""

    removed: int
    freed: int
    left: int


def manifest_digests(paths: Iterable[Path]) -> set[str]:
    """The contents that the manifests at `paths` name. A missing or damaged manifest names none: the job
    it belongs to can never be built again from it (`tfrun restart` says so), so it needs no content."""
    found: set[str] = set()
    for path in paths:
        try:
            with open(path) as f:
                entries = json.load(f)
        except (OSError, ValueError):
            continue
        for entry in entries if isinstance(entries, list) else []:
            digest = entry.get("digest") if isinstance(entry, dict) else None
            if isinstance(digest, str):
                found.add(digest)
    return found


def _same(a: Optional[FileEntry], b: Optional[FileEntry]) -> bool:
    """Whether an entry of a built snapshot can stay as it is for another entry of the same path."""
    if a is None or b is None or a.kind != b.kind:
        return False
    if a.kind == "dir":
        return True  # folders are made 0755 whatever the manifest says
    return a.digest == b.digest and a.mode == b.mode and a.target == b.target


def _spare_key(source: str) -> str:
    return hashlib.sha256(source.encode("utf-8", "surrogateescape")).hexdigest()[:24]


def _copy_new(source: str, target: Path, mode: int) -> None:
    """Copy to a file that must not exist yet (O_EXCL | O_NOFOLLOW: never through a link), in the kernel."""
    # The daemon's user keeps read and write access; no one else ever writes (a file sent with mode 0777 in a
    # job's copy or a spare would let another user change what the user's next job runs).
    mode = stat.S_IMODE(mode) & WORK_FILE_MODE_MASK | 0o600
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
