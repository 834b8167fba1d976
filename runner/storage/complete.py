"""When a checkpoint is complete: the rule that decides what the daemon uploads (docs/how-to/checkpoints.md says it to
users).

A job writes its checkpoints however its library does; the daemon never asks it. It looks at the job's
checkpoint folder every few seconds and takes as a checkpoint:

- a TensorFlow checkpoint: a prefix's `.index` file and every `.data-NNNNN-of-MMMMM` shard it names, once the
  folder's `checkpoint` state file (which tf.train.CheckpointManager and Keras write after the data) names the
  prefix; with no state file (tf.train.Checkpoint.write), once the index and all shards are there;
- any other file (a Keras `.keras` or `.weights.h5`, a `torch.save` file, a pickle) on its own;

and a checkpoint is complete when every file of it is unchanged (size, modification time, inode) since the
previous look, was last written more than `QUIET_S` ago, and is open for writing by no process of this user.
Names that say a file is not finished are never taken: starting with a dot, ending in .tmp, .temp, .part,
.partial or ~, or inside a folder named *_temp or .*(TensorFlow's and Keras's temporary folders). So a file
being written, and one renamed into place a moment ago, wait; a file written in place and then closed is
taken at the next look after it settled.
"""

from __future__ import annotations

import os
import re
import stat
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

from tfrun.storage.stored import TF_STATE

from ..records import jobfiles

QUIET_S = 2.0  # a file last written more recently than this may still be written: it waits for the next look
_UNFINISHED = re.compile(r"^\.|(\.tmp|\.temp|\.part|\.partial|~)$", re.IGNORECASE)
_TEMP_FOLDER = re.compile(r"^\.|_temp$|_temp_|^tmp", re.IGNORECASE)
_SHARD = re.compile(r"^(?P<prefix>.+)\.data-(?P<index>\d{5})-of-(?P<count>\d{5})$")
_FOLDER = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_FILE = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
_STATE_LINE = re.compile(r'^(?:model_checkpoint_path|all_model_checkpoint_paths):\s*"(?P<path>[^"]*)"\s*$')


@dataclass(frozen=True)
class FileStat:
    path: str  # relative to the checkpoint folder
    size: int
    mtime_ns: int
    ino: int


@dataclass(frozen=True)
class Checkpoint:
    """A complete checkpoint as found: its name, kind ("tensorflow" or "file") and files."""

    name: str
    kind: str
    files: tuple[FileStat, ...]

    @property
    def saved_at(self) -> float:
        return max(f.mtime_ns for f in self.files) / 1e9


class Looker:
    """Looks at one checkpoint folder again and again; each look returns the checkpoints that became complete
    since the previous one (a checkpoint saved again under its name is new again). It keeps what the previous
    look saw, since "unchanged since the previous look" is half of the rule, and what it returned, so that /proc
    is read only for checkpoints not yet told of."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        self._before: dict[str, FileStat] = {}
        self._told: set[tuple[str, tuple[FileStat, ...]]] = set()

    def look(self, now: Optional[float] = None) -> list[Checkpoint]:
        now = time.time() if now is None else now
        walked = _walk(self.folder)
        files = walked.files
        settled = {
            path for path, st in files.items()
            if self._before.get(path) == st and now - st.mtime_ns / 1e9 >= QUIET_S
        }  # fmt: skip
        self._before = files
        candidates = [
            c for c in _group(walked)
            if (c.name, c.files) not in self._told and all(f.path in settled for f in c.files)
        ]  # fmt: skip
        if not candidates:
            return []
        writing = _open_for_writing({f.ino for c in candidates for f in c.files}, walked.device)
        complete = [c for c in candidates if not any(f.ino in writing for f in c.files)]
        self._told.update((c.name, c.files) for c in complete)
        return complete


def on_box(folder: Path, what: str = "the checkpoint folder") -> list[Checkpoint]:
    """The checkpoints in `folder` now, complete or being written (what `tfrun checkpoints` lists); Refused for
    a folder that is not this user's alone (runner/records/jobfiles.py)."""
    return _group(_walk(folder, what), named_only=False)


@dataclass
class _Walked:
    """What one walk of a checkpoint folder found: its files by relative path, the text of each TensorFlow
    state file by the folder it is in ("" the top, else "sub/"), and the folder's device."""

    files: dict[str, FileStat]
    states: dict[str, str]
    device: int


def _walk(folder: Path, what: str = "the checkpoint folder") -> _Walked:
    """Every regular file under `folder` whose name does not say it is unfinished, by relative path, read
    through descriptors: the folder itself only if it is this user's alone, and no link followed anywhere (a
    link in a job's folder leads anywhere the job likes, and a folder swapped for one is refused)."""
    top = jobfiles.open_own_folder(folder, what)
    walked = _Walked({}, {}, os.fstat(top).st_dev)
    pending = [("", top)]
    while pending:
        rel, fd = pending.pop()
        try:
            with os.scandir(fd) as listing:
                entries = list(listing)
            for entry in entries:
                _take(walked, pending, rel, fd, entry)
        except OSError:
            continue
        finally:
            os.close(fd)
    return walked


def _take(walked: _Walked, pending: list[tuple[str, int]], rel: str, fd: int, entry: os.DirEntry[str]) -> None:
    """One entry of a folder being walked: a folder to enter, a file found (a state file read too), or nothing."""
    name = f"{rel}{entry.name}"
    try:
        st = entry.stat(follow_symlinks=False)
        if stat.S_ISDIR(st.st_mode) and not _TEMP_FOLDER.search(entry.name):
            pending.append((f"{name}/", os.open(entry.name, _FOLDER, dir_fd=fd)))
        elif stat.S_ISREG(st.st_mode) and not _UNFINISHED.search(entry.name):
            walked.files[name] = FileStat(name, st.st_size, st.st_mtime_ns, st.st_ino)
            if entry.name == TF_STATE:
                state = os.open(entry.name, _FILE, dir_fd=fd)
                with os.fdopen(state, "rb") as f:
                    walked.states[rel] = f.read(1 << 20).decode(errors="replace")
    except OSError:
        return  # gone meanwhile, or swapped for a link: not taken


def _group(walked: _Walked, named_only: bool = True) -> list[Checkpoint]:
    """The checkpoints the files make up: TensorFlow's by prefix (with `named_only`, once whole and named in
    their state file), the rest one a file."""
    files = walked.files
    taken: set[str] = set()
    found = []
    for path in sorted(files):
        if not path.endswith(".index"):
            continue
        prefix = path[: -len(".index")]
        shards = [p for p in files if (m := _SHARD.match(p)) and m.group("prefix") == prefix]
        counts = {int(m.group("count")) for p in shards if (m := _SHARD.match(p))}
        taken.update([path, *shards])
        whole = len(counts) == 1 and len(shards) == counts.pop()
        if named_only and not (whole and _named_in_state(prefix, walked.states)):
            continue
        found.append(Checkpoint(prefix, "tensorflow", tuple(files[p] for p in sorted([path, *shards]))))
    for path, st in sorted(files.items()):
        orphan_shard = _SHARD.match(path) is not None
        if path in taken or orphan_shard or path.rsplit("/", 1)[-1] == TF_STATE:
            continue
        found.append(Checkpoint(path, "file", (st,)))
    return found


def _named_in_state(prefix: str, states: dict[str, str]) -> bool:
    """Whether TensorFlow's state file beside `prefix` names it; True where there is no state file (a
    checkpoint written by tf.train.Checkpoint.write, which has none)."""
    parent, slash, base = prefix.rpartition("/")
    text = states.get(f"{parent}{slash}")
    if text is None:
        return True
    named = {m.group("path").rsplit("/", 1)[-1] for line in text.splitlines() if (m := _STATE_LINE.match(line))}
    return base in named


def _open_for_writing(inodes: set[int], device: int) -> set[int]:
    """Which of `inodes` (on file system `device`) a process of this user has open for writing, read from
    /proc: each process's open files, and the access mode of those that are among them."""
    writing: set[int] = set()
    me = os.getuid()
    for pid in os.listdir("/proc"):
        if not pid.isascii() or not pid.isdecimal():
            continue
        fds = f"/proc/{pid}/fd"
        try:
            if os.stat(f"/proc/{pid}").st_uid != me:
                continue
            names = os.listdir(fds)
        except OSError:
            continue
        for fd in names:
            try:
                st = os.stat(f"{fds}/{fd}")
            except OSError:
                continue
            if st.st_ino in inodes and st.st_dev == device and _writable(pid, fd):
                writing.add(st.st_ino)
    return writing


def _writable(pid: str, fd: str) -> bool:
    try:
        with open(f"/proc/{pid}/fdinfo/{fd}") as f:
            for line in f:
                if line.startswith("flags:"):
                    return int(line.split()[1], 8) & os.O_ACCMODE in (os.O_WRONLY, os.O_RDWR)
    except (OSError, ValueError, IndexError):
        return False
    return False
