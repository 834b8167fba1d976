"""The (byte offset, time) index of a job's log, so that `logs --since` and `--timestamps` need no rewrite.

The job writes its log itself (no pipe through anyone), so nobody sees each write as it happens. The shim,
which lives exactly as long as the job, looks at the log's size every INDEX_INTERVAL_S and, when it grew,
appends one record: "by this time the log held this many bytes". A line is stamped with the time of the
first record that covers its end: when it was first seen complete, at most INDEX_INTERVAL_S late. The shim
writes and the daemon only reads, so the index survives daemon restarts and costs 16 bytes per tick with
output (about 0.6 MB for an hour of non-stop printing); a torn last record is ignored.

Standard library only: the shim imports this.
"""

from __future__ import annotations

import bisect
import errno
import os
import struct
import time

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing (the shim imports this)

if TYPE_CHECKING:  # the shim imports this: no pathlib or typing at run time
    from pathlib import Path
    from typing import Optional

INDEX_INTERVAL_S = 0.1
_RECORD = struct.Struct("<Qd")  # offset (bytes), time (seconds since the epoch)


def append(fd: int, offset: int, when: float) -> None:
    """One record, in one write to a file opened with O_APPEND by its only writer, the job's shim."""
    record = _RECORD.pack(offset, when)
    written = os.write(fd, record)
    if written != len(record):  # a full disk: take the piece back, or every later record would be misread
        os.ftruncate(fd, os.lseek(fd, 0, os.SEEK_END) - written)
        raise OSError(errno.ENOSPC, "short write to the log index")


class LogIndex:
    """A reader of one job's index that picks up new records as the shim appends them."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.offsets: list[int] = []
        self.times: list[float] = []
        self._read = 0  # bytes of the index file consumed

    def refresh(self) -> None:
        """Read the records appended since the last call; a missing file is an empty index."""
        try:
            with open(self.path, "rb") as f:
                f.seek(self._read)
                data = f.read()
        except FileNotFoundError:
            return
        whole = len(data) - len(data) % _RECORD.size
        for offset, when in _RECORD.iter_unpack(data[:whole]):
            if self.offsets and offset <= self.offsets[-1]:
                continue  # not growth: a record from a restarted shim over the same log, say
            self.offsets.append(offset)
            self.times.append(max(when, self.times[-1]) if self.times else when)
        self._read += whole

    def time_at(self, end: int) -> Optional[float]:
        """When the log first held `end` bytes, as far as the index knows; None if it does not know yet."""
        i = bisect.bisect_left(self.offsets, end)
        if i == len(self.offsets):
            self.refresh()
            i = bisect.bisect_left(self.offsets, end)
        return self.times[i] if i < len(self.offsets) else None

    def offset_since(self, when: float) -> int:
        """A byte offset from which every line that was complete at or after `when` is read.

        Bytes written after the last record before `when` may belong to such a line; the caller backs up
        to the start of the line that holds this offset.
        """
        self.refresh()
        i = bisect.bisect_left(self.times, when)
        return self.offsets[i - 1] if i > 0 else 0


class Stamper:
    """The `--timestamps` prefix of a line: when it was complete, RFC 3339 in UTC, as `docker logs -t`."""

    def __init__(self, index: LogIndex, log: Path) -> None:
        self.index = index
        self.log = log
        self._second = -1
        self._prefix = ""
        self._mtime = (0.0, 0.0)  # (when read, the log's mtime)

    def stamp(self, end: int) -> str:
        when = self.index.time_at(end)
        if when is None:
            when = self._last_write()
        second = int(when)
        if second != self._second:
            self._second = second
            self._prefix = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(second))
        return f"{self._prefix}.{int((when - second) * 1000):03d}Z "

    def _last_write(self) -> float:
        """For bytes the index does not cover yet (or a log from before indexes): the log's last write."""
        now = time.monotonic()
        if now - self._mtime[0] > INDEX_INTERVAL_S / 2:
            try:
                self._mtime = (now, os.stat(self.log).st_mtime)
            except OSError:
                self._mtime = (now, time.time())
        return self._mtime[1]
