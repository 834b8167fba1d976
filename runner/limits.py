"""What tfrund does at start about the box's limits: its descriptor limit raised, and its log bounded.

A daemon that runs out of file descriptors (every `logs -f` holds its log and its socket, every job a pidfd) fails
requests, and asyncio's accept loop logs each failed accept with its traceback: in Python 3.11.7 it goes on
trying the whole backlog after an EMFILE, and tfrund.log took 11,304 tracebacks (5.3 MB) in 9 s. The soft limit
(often 1,024) is raised to the hard one at start, as systemd advises a daemon to do for itself; the jobs inherit
it, as they do a Docker container's.

The log is bounded whatever fails: a warning or an error logged again with the same text within
REPEAT_WINDOW_S is counted, not written, and the next one written says how many were left out. So a condition
that a loop meets at every turn (a full disk every 0.2 s, an accept that keeps failing) is one line, then one
every REPEAT_WINDOW_S while it lasts. A full disk is a condition of the box, not a bug: its traceback is left
out (its one line says what failed).
"""

from __future__ import annotations

import logging
import resource
import time
from typing import Callable, Optional

from .alerts.diskfull import is_disk_full

REPEAT_WINDOW_S = 600.0
_KEYS_HELD = 1024  # distinct texts remembered at most: older ones are forgotten first

log = logging.getLogger("tfrund")


def raise_descriptor_limit() -> tuple[int, int]:
    """Raise the soft limit on open files to the hard one; (the soft limit before, the one now). A hard limit
    that is unlimited is taken as the kernel's per-process most (fs.nr_open), which setrlimit accepts."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    wanted = hard if hard != resource.RLIM_INFINITY else _nr_open()
    if wanted <= soft and soft != resource.RLIM_INFINITY:
        return soft, soft
    try:
        resource.setrlimit(resource.RLIMIT_NOFILE, (wanted, hard))
    except (ValueError, OSError) as exc:
        log.warning("the limit on open files stays %d: it could not be raised to %d (%s)", soft, wanted, exc)
        return soft, soft
    return soft, wanted


def _nr_open() -> int:
    try:
        with open("/proc/sys/fs/nr_open") as f:
            return int(f.read())
    except (OSError, ValueError):
        return 1 << 20  # Linux's default


class OncePerCondition(logging.Filter):
    """Let a warning or an error through once per REPEAT_WINDOW_S for each text (and exception type); count the
    rest, and say how many were left out on the next one let through."""

    def __init__(self, window_s: float = REPEAT_WINDOW_S, clock: Callable[[], float] = time.monotonic) -> None:
        super().__init__()
        self.window_s = window_s
        self.clock = clock
        self._seen: dict[tuple[str, int, str], tuple[float, int]] = {}  # key -> (written at, left out since)

    def filter(self, record: logging.LogRecord) -> bool:
        if record.levelno < logging.WARNING:
            return True
        exc = record.exc_info[1] if record.exc_info else None
        key = (record.getMessage(), record.levelno, type(exc).__name__)
        now = self.clock()
        written_at, left_out = self._seen.pop(key, (None, 0))
        if written_at is not None and now - written_at < self.window_s:
            self._seen[key] = (written_at, left_out + 1)  # last: the keys used lately are the ones kept
            return False
        self._seen[key] = (now, 0)
        while len(self._seen) > _KEYS_HELD:
            del self._seen[next(iter(self._seen))]
        _one_line(record, exc, left_out)
        return True


def _one_line(record: logging.LogRecord, exc: Optional[BaseException], left_out: int) -> None:
    """The record as written: a full disk's error as one line, with how many like it were left out."""
    text = record.getMessage()
    if exc is not None and is_disk_full(exc):
        text = f"{text}: {exc}"
        record.exc_info, record.exc_text = None, None
    if left_out:
        text = f"{text} [and {left_out} more like this since the last one written]"
    record.msg, record.args = text, None


def bound_the_log() -> None:
    """Put OncePerCondition on every handler of the root logger (tfrund's own lines and asyncio's)."""
    for handler in logging.getLogger().handlers:
        handler.addFilter(OncePerCondition())
