"""Looking at a job's files: listing a folder of it (`ListFiles`) and reading one file (`ReadFile`), as `tfrun
pull` and `tfrun checkpoints` do. The records are `FileEntry`s, as in a submit's manifest."""

from __future__ import annotations

from dataclasses import dataclass

from tfrun.protocol.fields import JobRef, Offset
from tfrun.protocol.submit import FileEntry
from tfrun.protocol.wire import Message, Request, tagged


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
