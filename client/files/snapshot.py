"""What a submit sends: the work dir's files, as .gitignore and .tfrunignore leave them, named by content.

The same rules hold for the local daemon and for a box over SSH, so a job sees the same files either way.
"""

from __future__ import annotations

import os
import stat
import subprocess
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import TYPE_CHECKING, Callable, Optional

from tfrun.constants import EXIT_USAGE
from tfrun.content import sha256_file
from tfrun.protocol.submit import FileEntry

from ..errors import TfrunError

if TYPE_CHECKING:
    import pathspec

# Never sent: version control internals and caches the job regenerates.
SKIPPED_DIRS = frozenset({".git", ".hg", ".svn", "__pycache__", ".mypy_cache", ".pytest_cache", ".ruff_cache"})
IGNORE_FILES = (".gitignore", ".tfrunignore")


@dataclass
class Snapshot:
    root: Path
    entries: list[FileEntry] = field(default_factory=list)
    sources: dict[str, str] = field(default_factory=dict)  # digest -> a local file with that content
    paths: dict[str, str] = field(default_factory=dict)  # a file entry's path -> the local file
    skipped: list[str] = field(default_factory=list)  # special files and names that cannot be sent
    git_commit: Optional[str] = None
    git_dirty: Optional[bool] = None

    @property
    def total_bytes(self) -> int:
        return sum(e.size for e in self.entries if e.kind == "file")

    def largest(self, n: int = 5) -> list[FileEntry]:
        return sorted((e for e in self.entries if e.kind == "file"), key=lambda e: -e.size)[:n]

    def find(self, path: str) -> Optional[FileEntry]:
        return next((e for e in self.entries if e.path == path), None)

    def hash(self, progress: Callable[[int], None]) -> None:
        """Name every file by its SHA-256 (a second pass, so that a size warning comes before the wait)."""
        for entry in self.entries:
            if entry.kind != "file":
                continue
            path = self.paths[entry.path]
            try:
                entry.digest = sha256_file(path)
            except OSError as exc:
                raise TfrunError(f"cannot read {path}: {exc.strerror or exc}", EXIT_USAGE) from None
            self.sources.setdefault(entry.digest, path)
            progress(entry.size)


class _Ignores:
    """The ignore files that apply to a folder: its own, its parents' within the snapshot or the git repo.

    Each spec is kept with its folder and its file's name, so that a refused script can name the file that
    ignores it. Paths are strings, not Path objects: a snapshot of thousands of files goes through here.
    """

    def __init__(self, specs: list[tuple[str, str, pathspec.GitIgnoreSpec]]) -> None:
        self.specs = specs

    def below(self, folder: str) -> _Ignores:
        found = [(folder, name, spec) for name, spec in _read_specs(Path(folder))]
        return _Ignores(self.specs + found) if found else self

    def ignored(self, path: str, is_dir: bool) -> bool:
        return self.ignored_by(path, is_dir) is not None

    def ignored_by(self, path: str, is_dir: bool) -> Optional[str]:
        """The ignore file (its path) that leaves `path` out, or None."""
        for base, name, spec in self.specs:
            relative = os.path.relpath(path, base) if not path.startswith(base + "/") else path[len(base) + 1 :]
            if spec.match_file(relative + "/" if is_dir else relative):
                return os.path.join(base, name)
        return None


def _read_specs(folder: Path) -> list[tuple[str, pathspec.GitIgnoreSpec]]:
    """(file name, spec) of each ignore file in `folder`."""
    specs = []
    for name in IGNORE_FILES:
        try:
            lines = (folder / name).read_text(errors="replace").splitlines()
        except OSError:
            continue
        import pathspec  # here, not at the top: it costs ~25 ms to import, and many work dirs have no ignore file

        specs.append((name, pathspec.GitIgnoreSpec.from_lines(lines)))
    return specs


def _parent_ignores(root: Path) -> _Ignores:
    """.gitignore files above the work dir, up to the top of its git repo, still apply to it."""
    specs: list[tuple[str, str, pathspec.GitIgnoreSpec]] = []
    for parent in root.parents:
        specs = [(str(parent).rstrip("/") or "/", name, spec) for name, spec in _read_specs(parent)] + specs
        if (parent / ".git").exists():
            return _Ignores(specs)
    return _Ignores([])


def scan(root: Path, local: bool) -> Snapshot:
    """Walk `root` and list what a snapshot holds (contents are named later, by `Snapshot.hash`).

    `local`: the daemon shares this filesystem, so a relative symlink that points out of the work dir is
    made absolute and still resolves from the job."""
    snapshot = Snapshot(root)
    real_root = root.resolve()
    try:
        walk = _Walk(snapshot, real_root, local, _daemon_home())
        walk.folder(str(root), "", _parent_ignores(root).below(str(root)))
    except OSError as exc:
        raise TfrunError(f"cannot read {exc.filename or root}: {exc.strerror or exc}", EXIT_USAGE) from None
    if any((folder / ".git").exists() for folder in (root, *root.parents)):  # no git process outside git
        snapshot.git_commit, snapshot.git_dirty = git_state(root)
    return snapshot


class _Walk:
    """One scan's walk: what it adds to, and what it never enters (the local daemon's home: a work dir that holds
    TFRUN_HOME would send tfrun's own database and logs, written to while they are read)."""

    def __init__(self, snapshot: Snapshot, real_root: Path, local: bool, home: Optional[tuple[int, int]]) -> None:
        self.snapshot = snapshot
        self.real_root = real_root
        self.local = local
        self.home = home

    def folder(self, folder: str, prefix: str, ignores: _Ignores) -> None:
        """Add `folder` (whose entries are named `prefix` + name in the snapshot) and everything below it."""
        snapshot = self.snapshot
        with os.scandir(folder) as it:
            children = sorted(it, key=lambda e: e.name)
        for child in children:
            st = child.stat(follow_symlinks=False)
            is_dir = stat.S_ISDIR(st.st_mode)
            if (is_dir and child.name in SKIPPED_DIRS) or ignores.ignored(child.path, is_dir):
                continue
            if is_dir and (st.st_dev, st.st_ino) == self.home:
                continue
            relative = prefix + child.name
            if _unsendable(relative):
                snapshot.skipped.append(relative)
                continue
            if is_dir:
                snapshot.entries.append(FileEntry(relative, "dir", mode=stat.S_IMODE(st.st_mode)))
                self.folder(child.path, relative + "/", ignores.below(child.path))
            elif stat.S_ISLNK(st.st_mode):
                target = _link_target(Path(child.path), self.real_root, self.local)
                snapshot.entries.append(FileEntry(relative, "symlink", target=target))
            elif stat.S_ISREG(st.st_mode):
                snapshot.paths[relative] = child.path
                snapshot.entries.append(FileEntry(relative, "file", mode=stat.S_IMODE(st.st_mode), size=st.st_size))
            else:
                snapshot.skipped.append(relative)  # FIFOs, sockets, devices: reading one could block forever


def _daemon_home() -> Optional[tuple[int, int]]:
    """The local TFRUN_HOME's (device, inode), if it exists: the folder a snapshot never enters."""
    from tfrun.paths import Layout

    try:
        info = os.stat(Layout.from_env().home)
    except OSError:
        return None
    return info.st_dev, info.st_ino


def _unsendable(relative: str) -> bool:
    """A name the snapshot skips: one with a newline cannot be sent (NUL cannot be in a name at all)."""
    return "\n" in relative or "\0" in relative


def _same_folder(path: str, home: Optional[tuple[int, int]]) -> bool:
    try:
        info = os.stat(path)
    except OSError:
        return False
    return (info.st_dev, info.st_ino) == home


def why_not_sent(root: Path, relative: str) -> str:
    """Why the file `relative` is not in the snapshot of `root`: the reason a user can act on, on one line."""
    if _unsendable(relative):
        return f"{relative!r}: a name with a newline cannot be sent; rename it"
    ignores = _parent_ignores(root).below(str(root))
    folder, parts = str(root), relative.split("/")
    for depth, part in enumerate(parts, 1):
        path, is_dir = os.path.join(folder, part), depth < len(parts)
        if is_dir and part in SKIPPED_DIRS:
            return f"{relative}: it is inside {part}/, which is never sent"
        if is_dir and _same_folder(path, _daemon_home()):
            return f"{relative}: it is inside {part}/, tfrun's own home (TFRUN_HOME), which is never sent"
        ignore_file = ignores.ignored_by(path, is_dir)
        if ignore_file is not None:
            return f"{relative} is ignored by {ignore_file}, so it would not be sent"
        folder, ignores = path, ignores.below(path) if is_dir else ignores
    return f"{relative}: not a file the snapshot can send"


def _link_target(path: Path, real_root: Path, local: bool) -> str:
    target = os.readlink(path)
    if local and not os.path.isabs(target):
        resolved = (path.parent / target).resolve()
        if resolved != real_root and real_root not in resolved.parents:
            return str(resolved)
    return target


def git_state(root: Path) -> tuple[Optional[str], Optional[bool]]:
    """(commit, dirty) of the git work tree holding `root`, or (None, None) outside git."""
    try:
        commit = subprocess.run(
            ["git", "-C", str(root), "rev-parse", "HEAD"], capture_output=True, text=True, timeout=30
        )
        if commit.returncode != 0:
            return None, None
        status = subprocess.run(
            ["git", "-C", str(root), "status", "--porcelain", "--", "."], capture_output=True, text=True, timeout=60
        )
    except (OSError, subprocess.TimeoutExpired):
        return None, None
    return commit.stdout.strip(), bool(status.stdout.strip()) if status.returncode == 0 else None


def relative_script(script: str, workdir: Optional[Path]) -> tuple[Path, str]:
    """(absolute work dir, script path relative to it), or a TfrunError that says what is wrong."""
    path = Path(script).absolute()
    if not path.exists():
        raise TfrunError(f"{script}: no such file", EXIT_USAGE)
    if not path.is_file():
        raise TfrunError(f"{script}: not a file", EXIT_USAGE)
    root = (workdir or path.parent).absolute()
    if not root.is_dir():
        raise TfrunError(f"work dir {root}: not a directory", EXIT_USAGE)
    if not os.access(root, os.R_OK | os.X_OK):
        raise TfrunError(f"work dir {root}: not readable", EXIT_USAGE)
    relative = os.path.relpath(path, root)
    if relative.startswith(".."):
        raise TfrunError(f"{script} is not inside the work dir {root}", EXIT_USAGE)
    return root, PurePosixPath(Path(relative)).as_posix()
