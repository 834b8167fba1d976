"""What a job's stored folder holds besides the checkpoint files themselves, and restoring from it.

    s3://bucket/prefix/JOB/ckpt-5.index              the files, as they are in the job's checkpoint folder
    s3://bucket/prefix/JOB/ckpt-5.data-00000-of-00001
    s3://bucket/prefix/JOB/.tfrun/checkpoints/ckpt-5.json   its manifest: written last, once all are verified
    s3://bucket/prefix/JOB/.tfrun/job.json           the job's record (script, arguments; never --env values)
    s3://bucket/prefix/JOB/.tfrun/snapshot.json      its snapshot's manifest, whose contents are under blobs/
    s3://bucket/prefix/JOB/.tfrun/blobs/SHA256

A checkpoint is in storage when its manifest is: a reader never takes files whose upload did not finish. A
restore takes the newest manifest (by when the checkpoint was saved), fetches each file into a temporary name
beside its place, checks size and SHA-256, and only then renames it into place.
"""

from __future__ import annotations

import json
import os
import re
import urllib.parse
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Optional

from .remote import STORAGE_FAILED, Remote, StorageError

META = ".tfrun"
CHECKPOINTS = f"{META}/checkpoints/"
JOB = f"{META}/job.json"
SNAPSHOT = f"{META}/snapshot.json"
BLOBS = f"{META}/blobs/"
TENSORFLOW = "tensorflow"  # a checkpoint's kind: a TF prefix's index and shards (else "file": one file on its own)
TF_STATE = "checkpoint"  # the file TensorFlow's CheckpointManager names its checkpoints in


@dataclass(frozen=True)
class StoredFile:
    path: str  # relative to the job's checkpoint folder, as on the box
    size: int
    sha256: str


@dataclass(frozen=True)
class Manifest:
    """One checkpoint in storage: its files, when it was saved on the box and when it was stored."""

    name: str  # a TF checkpoint's prefix ("ckpt-5"), or the file's path ("weights/epoch03.keras")
    kind: str
    saved_at: float  # the newest of its files' modification times, on the box
    files: list[StoredFile] = field(default_factory=list)
    stored_at: float = 0.0
    box: str = ""  # the name of the box that stored it

    @property
    def step(self) -> Optional[int]:
        return step_of(self.name)

    @property
    def size(self) -> int:
        return sum(f.size for f in self.files)

    def to_json(self) -> bytes:
        return json.dumps(asdict(self), sort_keys=True).encode()

    @classmethod
    def from_json(cls, data: bytes) -> Manifest:
        raw = json.loads(data)
        files = [StoredFile(safe_path(f["path"]), int(f["size"]), str(f["sha256"])) for f in raw["files"]]
        return cls(safe_path(raw["name"]), str(raw["kind"]), float(raw["saved_at"]), files,
                   float(raw.get("stored_at", 0)), str(raw.get("box", "")))  # fmt: skip


def step_of(name: str) -> Optional[int]:
    """The step a checkpoint's name ends with, its extensions aside: ckpt-5, weights.03.h5, epoch03.keras,
    state-4.json; None for model.weights.h5 (the 5 is the extension's)."""
    stem = name.rsplit("/", 1)[-1]
    while (shorter := re.sub(r"\.[A-Za-z]\w*$", "", stem)) != stem:
        stem = shorter
    found = re.search(r"(\d+)$", stem)
    return int(found.group(1)) if found else None


def manifest_key(name: str) -> str:
    return CHECKPOINTS + urllib.parse.quote(name, safe="") + ".json"


def safe_path(path: str) -> str:
    """`path` if it is a relative path that stays inside a folder; ValueError otherwise (a manifest is read
    from a bucket, and its paths decide where a restore writes)."""
    parts = path.split("/")
    if not path or path.startswith("/") or any(p in ("", ".", "..") for p in parts) or "\0" in path:
        raise ValueError(f"{path!r} is not a path inside a checkpoint folder")
    return path


def stored_checkpoints(remote: Remote) -> list[Manifest]:
    """The checkpoints in the job's stored folder, oldest first (by when they were saved on the box)."""
    found = []
    for key in remote.listing(CHECKPOINTS):
        try:
            found.append(Manifest.from_json(remote.get_bytes(key)))
        except (ValueError, KeyError, TypeError):
            continue  # not a manifest of ours: never restored from
    return sorted(found, key=lambda m: (m.saved_at, m.step or 0, m.name))


def restore(remote: Remote, manifest: Manifest, folder: Path) -> int:
    """Fetch `manifest`'s checkpoint into `folder` (the new job's own checkpoint folder), each file verified
    before it is renamed into place, then name it in TensorFlow's state file for a TF checkpoint, so that
    `tf.train.latest_checkpoint` (and so `tfrun.jobs.Checkpoints`) finds it. Returns the bytes fetched."""
    for stored in manifest.files:
        target = folder / stored.path
        _make_parents(folder, target.parent)
        partial = target.with_name(f".{target.name}.tfrun-partial")
        fd = os.open(partial, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
        try:
            with os.fdopen(fd, "wb") as f:
                remote.get_into(stored.path, f, stored.size, stored.sha256)
                f.flush()
                os.fsync(f.fileno())
            os.replace(partial, target)
        except BaseException:
            partial.unlink(missing_ok=True)
            raise
    if manifest.kind == TENSORFLOW:
        prefix = Path(manifest.name)
        (folder / prefix.parent / TF_STATE).write_text(tf_state_text(prefix.name))
    return manifest.size


def tf_state_text(prefix: str) -> str:
    """TensorFlow's state file naming checkpoint `prefix` (a name in the same folder) as the newest and only."""
    return f'model_checkpoint_path: "{prefix}"\nall_model_checkpoint_paths: "{prefix}"\n'


def _make_parents(folder: Path, parent: Path) -> None:
    """Make the folders between `folder` and `parent`, each a real folder (never through a link)."""
    current = folder
    for name in parent.relative_to(folder).parts:
        current = current / name
        try:
            current.mkdir(mode=0o700)
        except FileExistsError:
            if current.is_symlink() or not current.is_dir():
                raise StorageError(STORAGE_FAILED, f"{current} is in the way of a restored checkpoint") from None


def write_record(remote: Remote, key: str, record: dict[str, Any]) -> None:
    remote.put_bytes(key, json.dumps(record, sort_keys=True).encode())


def read_record(remote: Remote, key: str) -> dict[str, Any]:
    data = json.loads(remote.get_bytes(key))
    if not isinstance(data, dict):
        raise StorageError(STORAGE_FAILED, f"{remote.place.child(key)} is not a record of tfrun's")
    return data
