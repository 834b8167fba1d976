"""Files: the snapshot's content-addressed blobs (`HaveBlobs`, `PutBlob(s)`), listing and reading a job's files."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated, Optional

from tfrun.constants import (
    MAX_PAYLOAD_BYTES,
)
from tfrun.protocol.fields import JobRef, Mode, Offset, Range, Text
from tfrun.protocol.wire import Message, Ok, Request, tagged


@dataclass
class FileEntry:
    """One entry of a work dir snapshot, or of a folder listed for `tfrun pull`.

    `path` is relative and '/'-separated, never absolute, never with '..'; the daemon checks again.
    """

    path: str
    kind: str  # "file", "dir" or "symlink"
    mode: Mode = 0o644
    size: Offset = 0
    digest: Optional[Text] = None  # SHA-256 of a file's content, hex
    target: Optional[str] = None  # a symlink's target, as it was
    mtime: Optional[float] = None  # when it was last written (listings only)


FILE_KINDS = ("file", "dir", "symlink")


@tagged("missing_blobs")
@dataclass
class MissingBlobs(Message):
    digests: list[str]


@tagged("file_list")
@dataclass
class FileList(Message):
    files: list[FileEntry]


@tagged("file_chunk")
@dataclass
class FileChunk(Message):
    offset: int
    last: bool
    data: bytes


@tagged("have_blobs")
@dataclass
class HaveBlobs(Request[MissingBlobs]):
    """Which of these contents (SHA-256, hex) does the daemon lack? Answered by `MissingBlobs`."""

    digests: list[Text]


@tagged("put_blob")
@dataclass
class PutBlob(Request[Ok]):
    """Bytes of one content, from `offset`; the chunk with `last` is answered by `Ok` once stored."""

    digest: Text
    offset: Offset
    last: bool
    data: bytes


@tagged("put_blobs")
@dataclass
class PutBlobs(Request[Ok]):
    """Several whole small contents in one frame, their bytes one after another; answered by `Ok`."""

    digests: list[Text]
    sizes: list[Annotated[int, Range(0, MAX_PAYLOAD_BYTES)]]
    data: bytes


@tagged("list_files")
@dataclass
class ListFiles(Request[FileList]):
    """Entries under `path` of a job's folder (e.g. "work/out", "output.log") or, when `path` starts with
    "checkpoints", of its checkpoint folder. Answered by `FileList`."""

    job: JobRef
    path: str = "checkpoints"


@tagged("read_file")
@dataclass
class ReadFile(Request[FileChunk]):
    """A file's bytes from `offset`, in the same namespace as `ListFiles`; answered by `FileChunk`s."""

    job: JobRef
    path: str
    offset: Offset = 0
