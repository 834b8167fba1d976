"""Telling a process apart from a later one that reuses its pid: pid + start time + boot id.

Standard library only, and cheap: the shim imports this.
"""

from __future__ import annotations

import os

from tfrun.numerals import is_digits

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing (the shim imports this)

if TYPE_CHECKING:
    from typing import Optional


_BOOT_ID: list[str] = []  # read once: a process lives within one boot


def boot_id() -> str:
    """Changes at every boot, so records from before a reboot are recognised as dead."""
    if not _BOOT_ID:
        try:
            with open("/proc/sys/kernel/random/boot_id") as f:
                _BOOT_ID.append(f.read().strip())
        except OSError:
            return "unknown"
    return _BOOT_ID[0]


def start_ticks(pid: int) -> Optional[int]:
    """The process's start time in clock ticks since boot (field 22 of /proc/PID/stat), None if gone."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read()
    except OSError:
        return None
    # The command name (field 2) may hold spaces and parentheses: split after its last ')'.
    fields = stat[stat.rfind(b")") + 2 :].split()
    try:
        if fields[0] == b"Z":
            return None  # a zombie has finished; only its exit status is left to collect
        return int(fields[19])
    except (IndexError, ValueError):
        return None


class Identity:
    """One process, for as long as it lives: a pid alone could be a stranger after a reuse or a reboot.

    A plain class, not a dataclass: the shim imports this, and `dataclasses` alone costs it ~15 ms a job.
    """

    __slots__ = ("boot", "pid", "start")

    def __init__(self, pid: int, start: int, boot: str) -> None:
        self.pid = pid
        self.start = start
        self.boot = boot

    @classmethod
    def of(cls, pid: int) -> Optional[Identity]:
        start = start_ticks(pid)
        return None if start is None else cls(pid, start, boot_id())

    def alive(self) -> bool:
        return self.boot == boot_id() and start_ticks(self.pid) == self.start


def parent_map() -> dict[int, list[int]]:
    """Children of every live (not zombie) process, read from /proc in one pass."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if not is_digits(entry):
            continue
        try:
            with open(f"/proc/{entry}/stat", "rb") as f:
                stat = f.read()
        except OSError:
            continue
        fields = stat[stat.rfind(b")") + 2 :].split()
        if fields[:1] == [b"Z"]:
            continue  # finished, waiting to be reaped: nothing left to signal
        try:
            children.setdefault(int(fields[1]), []).append(int(entry))
        except (IndexError, ValueError):
            continue
    return children


def descendants(pid: int) -> list[int]:
    """Every live descendant of `pid`, however deep, including ones that left its process group."""
    tree = parent_map()
    found: list[int] = []
    todo = list(tree.get(pid, []))
    while todo:
        child = todo.pop()
        found.append(child)
        todo.extend(tree.get(child, []))
    return found
