"""TensorBoard scalars written by the daemon: the metrics read from a job's printed output, as an event file in
the job's TensorBoard folder, so a script that never heard of TensorBoard still gets curves.

An event file is a sequence of TFRecords (length, masked CRC-32C of the length, data, masked CRC-32C of the
data), each holding one `tensorflow.Event` protocol buffer: the first says the file's version, each later
one a step's scalars (`Summary.Value.simple_value`, which TensorBoard reads as its scalars plugin's data).
Those three messages take a few fields each; they are encoded here by hand rather than with the
`tensorboard` package's writer, because the daemon runs in a venv of its own on the box (client/install/onbox.py)
where neither TensorFlow nor TensorBoard nor protobuf is installed, and importing TensorBoard would cost the
daemon numpy and protobuf for about eighty lines. tests/test_eventfile.py reads what this writes with
TensorBoard's own reader.

A file is appended to across daemon restarts (TensorBoard follows a growing file); a fresh one starts with
the version record.

Each record's two checksums are CRC-32C, computed by google-crc32c's C code (a dependency) where its wheel or
build has it, else by the table below: a box whose platform has no wheel and no compiler must still get curves.
Measured, 100,000 records of two scalars appended 100 at a time: 0.29 s with google-crc32c, 0.65 s with the
table (the records are small: the rest is building them).
"""

from __future__ import annotations

import socket
import struct
import time
import warnings
from pathlib import Path
from typing import Callable, Optional

VERSION = b"brain.Event:2"
PRINTED = "printed"  # the run under a job's TensorBoard folder that holds what the daemon read from its output
_MASK_DELTA = 0xA282EAD8


def _crc32c_table() -> list[int]:
    table = []
    for byte in range(256):
        crc = byte
        for _ in range(8):
            crc = (crc >> 1) ^ 0x82F63B78 if crc & 1 else crc >> 1  # CRC-32C (Castagnoli), reflected
        table.append(crc)
    return table


_TABLE = _crc32c_table()
_U32, _U64 = struct.Struct("<I").pack, struct.Struct("<Q").pack
_FLOAT, _DOUBLE = struct.Struct("<f").pack, struct.Struct("<d").pack
_SMALL = [bytes((value,)) for value in range(0x80)]  # the varint of each number below 128: one byte, itself
_TAGS: dict[str, bytes] = {}  # a scalar's tag as its Value's first field and the key of its simple_value
MAX_TAGS = 1024  # tags remembered: a job prints a few metrics, and one that prints ever new names costs no memory
MAX_TAG_CHARS = 128  # nor one that prints long ones (a name may run to a segment's 64 kB)


def crc32c_table(data: bytes) -> int:
    """CRC-32C in Python, where google-crc32c's C code is missing."""
    crc, table = 0xFFFFFFFF, _TABLE  # the table as a local: a global's lookup for every byte was a fifth of it
    for byte in data:
        crc = table[(crc ^ byte) & 0xFF] ^ (crc >> 8)
    return crc ^ 0xFFFFFFFF


def _compiled_crc32c() -> Optional[Callable[[bytes], int]]:
    """google-crc32c's CRC-32C when it runs as C; None when it is not installed, or installed without its
    extension (built where there was no compiler): it then computes in Python too, and warns that it does."""
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)  # its warning: the table below is used instead
            import google_crc32c
    except ImportError:
        return None
    value: Callable[[bytes], int] = google_crc32c.value
    return value if google_crc32c.implementation == "c" else None


crc32c: Callable[[bytes], int] = _compiled_crc32c() or crc32c_table


def _masked(data: bytes) -> bytes:
    """The TFRecord checksum: CRC-32C, rotated and offset (so a CRC of data holding CRCs stays useful)."""
    crc = crc32c(data)
    return _U32((((crc >> 15) | (crc << 17)) + _MASK_DELTA) & 0xFFFFFFFF)


def record(data: bytes) -> bytes:
    """One TFRecord around `data`."""
    length = _U64(len(data))
    return length + _masked(length) + data + _masked(data)


def _varint(value: int) -> bytes:
    if 0 <= value < 0x80:
        return _SMALL[value]  # a field's key, a step below 128, a short field's length: most varints here
    out = bytearray()
    value &= (1 << 64) - 1  # protobuf's int64: a negative one takes ten bytes
    while True:
        bits, value = value & 0x7F, value >> 7
        out.append(bits | (0x80 if value else 0))
        if not value:
            return bytes(out)


def _field(number: int, payload: bytes) -> bytes:
    """A length-delimited field (wire type 2): a string, bytes or an embedded message."""
    return _varint(number << 3 | 2) + _varint(len(payload)) + payload


def _tag(tag: str) -> bytes:
    """A Value's tag field (1) and the key of its simple_value (2, a float: wire type 5)."""
    found = _TAGS.get(tag)
    if found is None:
        found = _field(1, tag.encode()) + b"\x15"
        if len(_TAGS) < MAX_TAGS and len(tag) <= MAX_TAG_CHARS:
            _TAGS[tag] = found
    return found


def event(wall_time: float, step: int = 0, version: bytes = b"", scalars: dict[str, float] | None = None) -> bytes:
    """An Event: wall_time (1, double), step (2, int64), and file_version (3) or summary (5) with a Value
    (1) for each scalar: tag (1), simple_value (2, float)."""
    out = b"\x09" + _DOUBLE(wall_time)
    if step:
        out += b"\x10" + _varint(step)
    if version:
        out += _field(3, version)
    if scalars:
        out += _field(5, b"".join(_field(1, _tag(tag) + _FLOAT(value)) for tag, value in scalars.items()))
    return out


class ScalarFile:
    """A job's event file of printed metrics, in `folder` (created when first written)."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        self._open: Optional[Path] = None  # the file this object appended to last: no glob, no stat again

    def path(self) -> Path:
        """The file to append to: the one already there (after a daemon restart), else a new name as
        TensorBoard names its own (events.out.tfevents.TIME.HOST)."""
        found = sorted(self.folder.glob("events.out.tfevents.*")) if self.folder.is_dir() else []
        if found:
            return found[-1]
        return self.folder / f"events.out.tfevents.{int(time.time())}.{socket.gethostname()}.tfrun"

    def append(self, steps: list[tuple[int, dict[str, float]]]) -> None:
        """Write each (step, {tag: value}) as one event; values that are not numbers are left out (NaN and
        infinities are numbers: TensorBoard shows them as they were)."""
        chunks = []
        now = time.time()
        for step, values in steps:
            scalars = {tag: number for tag, v in values.items() if (number := _number(v)) is not None}
            if scalars:
                chunks.append(record(event(now, step, scalars=scalars)))
        if not chunks:
            return
        if self._open is not None:
            try:
                with open(self._open, "ab") as f:
                    f.write(b"".join(chunks))  # not fsynced: the curves are derived from the log, which is kept
                return
            except FileNotFoundError:  # its folder was removed meanwhile: start a file again
                self._open = None
        self.folder.mkdir(parents=True, exist_ok=True)
        path = self.path()
        fresh = not path.exists() or path.stat().st_size == 0
        with open(path, "ab") as f:
            if fresh:
                f.write(record(event(now, version=VERSION)))
            f.write(b"".join(chunks))
        self._open = path


def _number(value: object) -> float | None:
    """`value` as a scalar, or None for what is not a number (a bool, a string, an int beyond a double)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    try:
        return float(value)
    except OverflowError:
        return None
