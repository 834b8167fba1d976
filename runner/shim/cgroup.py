"""The kernel OOM killer's count for a process's memory cgroup, so a SIGKILL can be told apart from an OOM kill.

cgroup v2 counts kills in `memory.events` ("oom_kill N"), cgroup v1 in `memory.oom_control` (same line,
kernel 4.13+). The shim reads the count for its own cgroup (which its job inherits) just before it starts
the job and records it in shim.json; when the job dies of SIGKILL the daemon reads it again as it records the
job's end (runner/records/lifecycle.py `end_cause`, the one place a job's cause is decided, through
runner/records/oom.py): a higher count means the kernel killed something in the job's cgroup for want of memory.

Standard library only, and no typing or pathlib at run time: the shim imports this.
"""

from __future__ import annotations

import os

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Callable, Optional

_PROC = "/proc"


def oom_counter_file(pid: str = "self") -> Optional[str]:
    """The file holding the OOM-kill count of `pid`'s memory cgroup, or None where there is none to read."""
    try:
        with open(os.path.join(_PROC, pid, "cgroup")) as f:
            memberships = f.read().splitlines()
        with open(os.path.join(_PROC, pid, "mountinfo")) as f:
            mounts = f.read().splitlines()
    except OSError:
        return None
    for line in memberships:
        _, controllers, path = line.split(":", 2)
        if controllers == "":  # cgroup v2: the unified hierarchy
            found = _under_mount(mounts, path, lambda fstype, options: fstype == "cgroup2", "memory.events")
        elif "memory" in controllers.split(","):
            found = _under_mount(
                mounts, path, lambda fstype, options: fstype == "cgroup" and "memory" in options, "memory.oom_control"
            )
        else:
            continue
        if found is not None:
            return found
    return None


def _under_mount(mounts: list[str], path: str, wanted: Callable[[str, list[str]], bool], name: str) -> Optional[str]:
    """Map cgroup `path` to a file under a mount of the wanted kind that shows it (mountinfo, proc(5))."""
    for line in mounts:
        fields = line.split()
        if "-" not in fields:
            continue
        dash = fields.index("-")
        root, mount_point = fields[3], fields[4]
        fstype, options = fields[dash + 1], fields[dash + 3].split(",") if len(fields) > dash + 3 else []
        if not wanted(fstype, options):
            continue
        if path == root or path.startswith(root.rstrip("/") + "/"):
            relative = path[len(root) :].lstrip("/")
            candidate = os.path.join(mount_point, relative, name)
            if os.path.exists(candidate):
                return candidate
    return None


def oom_kills(counter_file: Optional[str]) -> Optional[int]:
    """The OOM-kill count in `counter_file`; None when it cannot be read."""
    if not counter_file:
        return None
    try:
        with open(counter_file) as f:
            for line in f:
                key, _, value = line.partition(" ")
                if key == "oom_kill":
                    return int(value)
    except (OSError, ValueError):
        return None
    return None
