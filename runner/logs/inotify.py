"""The kernel's file events (Linux inotify), read on the daemon's event loop: no thread, one read a batch.

tfrund runs on Linux alone (it reads /proc), so it takes file events straight from the kernel: a nonblocking
inotify descriptor that the event loop reads when it is ready, every event waiting parsed from one buffer
(about a microsecond each). watchdog, used before, ran two threads and built Python objects per event in a
queue; at 200 progress-bar redraws a second that alone cost the daemon a tenth of a core.
"""

from __future__ import annotations

import ctypes
import os
import struct
from typing import NamedTuple

IN_MODIFY = 0x00000002
IN_CLOSE_WRITE = 0x00000008
IN_MOVED_TO = 0x00000080
IN_CREATE = 0x00000100
IN_Q_OVERFLOW = 0x00004000  # events were dropped: whoever follows anything must look again
IN_IGNORED = 0x00008000  # the watch is gone (its folder was removed)
WRITTEN = IN_MODIFY | IN_CLOSE_WRITE  # a watched file was written
APPEARS = IN_CREATE | IN_MOVED_TO  # a file appeared in a watched folder (created, or renamed into place)
_IN_NONBLOCK = os.O_NONBLOCK
_IN_CLOEXEC = os.O_CLOEXEC
_HEADER = struct.Struct("iIII")  # wd, mask, cookie, length of the name that follows
_READ_BYTES = 64 << 10


class Event(NamedTuple):
    watch: int  # the watch descriptor `add` returned; -1 for an overflow
    mask: int
    name: str  # the file's name in the watched folder ("" for the folder itself)


class Inotify:
    """One inotify instance; `fd` is for the event loop's add_reader. Raises OSError where there is none."""

    def __init__(self) -> None:
        libc = ctypes.CDLL(None, use_errno=True)
        self._add = libc.inotify_add_watch
        self._add.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_uint32]
        self._remove = libc.inotify_rm_watch
        self._remove.argtypes = [ctypes.c_int, ctypes.c_int]
        fd = libc.inotify_init1(_IN_NONBLOCK | _IN_CLOEXEC)
        if fd < 0:
            raise OSError(ctypes.get_errno(), os.strerror(ctypes.get_errno()))
        self.fd: int = fd

    def add(self, path: str, mask: int) -> int:
        """Watch a file or folder for `mask`; its watch descriptor. OSError: no such file (FileNotFoundError),
        or watches used up."""
        wd = int(self._add(self.fd, os.fsencode(path), mask))
        if wd < 0:
            code = ctypes.get_errno()
            raise OSError(code, os.strerror(code), path)
        return wd

    def remove(self, wd: int) -> None:
        """Stop a watch; one whose file is gone already is no error."""
        self._remove(self.fd, wd)

    def read(self) -> list[Event]:
        """Every event waiting now (none if none): the descriptor never blocks."""
        events: list[Event] = []
        while True:
            try:
                data = os.read(self.fd, _READ_BYTES)
            except BlockingIOError:
                return events
            offset = 0
            while offset < len(data):
                wd, mask, _, length = _HEADER.unpack_from(data, offset)
                start = offset + _HEADER.size
                name = data[start : start + length].rstrip(b"\0")
                events.append(Event(wd, mask, os.fsdecode(name)))
                offset = start + length
            if len(data) < _READ_BYTES // 2:  # short of a full buffer: nothing more is waiting
                return events

    def close(self) -> None:
        os.close(self.fd)
