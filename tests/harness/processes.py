"""Processes of a test as /proc shows them: whose they are, whether they live, their sockets, waiting for
a condition with a deadline (`wait_for`), and a free port on loopback."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import time
from pathlib import Path
from typing import Any, Callable, Optional


def processes_of(home: Path) -> list[int]:
    """Pids of every process that carries TFRUN_HOME=home: the daemon, its shims and their jobs."""
    marker = f"TFRUN_HOME={home}".encode()
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == os.getpid():
            continue
        try:
            environ = Path(f"/proc/{entry}/environ").read_bytes()
        except OSError:
            continue
        if marker in environ.split(b"\0"):
            found.append(int(entry))
    return found


def alive(pid: int) -> bool:
    """True while `pid` exists and is not a zombie."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_bytes()
    except OSError:
        return False
    return stat[stat.rfind(b")") + 2 :].split()[0] != b"Z"


def wait_for(predicate: Callable[[], Any], timeout: float = 30.0, what: str = "condition") -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.05)
    raise AssertionError(f"timed out after {timeout}s waiting for {what}")


def keeper_socket(pid: int) -> Path:
    """The protocol socket the keeper `pid` listens on, found as `ss` finds it (its command line names none:
    client/link/keeper.py reads its parameters on stdin); the forward socket beside it is this with `.fwd`."""
    inodes = set()
    for fd in Path(f"/proc/{pid}/fd").iterdir():
        with contextlib.suppress(OSError):
            target = os.readlink(fd)
            if target.startswith("socket:["):
                inodes.add(target[len("socket:[") : -1])
    rows = (line.split() for line in Path(f"/proc/{pid}/net/unix").read_text().splitlines()[1:])  # its netns
    [path] = {Path(row[7]) for row in rows if len(row) > 7 and row[6] in inodes and row[7].endswith(".sock")}
    return path


def serving_daemon(home: Path) -> Optional[int]:
    """The pid of the live daemon holding `home`'s lock, read from the lock file: asking it (`tfrund status`)
    would make one more client, which tests that count the daemon's connections must not."""
    try:
        text = (home / "run" / "tfrund.lock").read_text().strip()
    except OSError:
        return None
    return int(text) if text.isdigit() and alive(int(text)) else None


def open_fds(pid: int) -> list[str]:
    """What each of the process's file descriptors points at (`socket:[N]`, a path, ...), as /proc shows it."""
    targets = []
    for fd in os.listdir(f"/proc/{pid}/fd"):
        with contextlib.suppress(OSError):  # closed between the listing and the look
            targets.append(os.readlink(f"/proc/{pid}/fd/{fd}"))
    return targets


def sockets(pid: int) -> int:
    return sum(target.startswith("socket:") for target in open_fds(pid))


def own_sockets(home: Path) -> int:
    """How many sockets the daemon of `home` holds with no client: its listener and its event loop's own.
    Measured once the clients before (such as `tfrund start`'s status request) have had time to go."""
    pid = wait_for(lambda: serving_daemon(home), what="a daemon")
    time.sleep(0.5)
    return sockets(pid)


def kill_and_await_successor(home: Path, clients: Callable[[], int], idle_sockets: int) -> int:
    """SIGKILL the daemon of `home`; return the pid of the next one once `clients()` connections reach it
    (the clients that lost the first start it on demand and reconnect). `idle_sockets`: a daemon's own."""
    first = wait_for(lambda: serving_daemon(home), what="a daemon")
    os.kill(first, signal.SIGKILL)
    wait_for(lambda: not alive(first), what="the daemon to die")

    def successor() -> Optional[int]:
        pid = serving_daemon(home)
        return pid if pid != first else None

    pid: int = wait_for(successor, what="a new daemon")
    wait_for(lambda: connected(pid, idle_sockets + clients()), what="the clients to reconnect")
    return pid


def connected(pid: int, count: int) -> bool:
    """Whether the daemon `pid` holds at least `count` sockets, now and a moment later: a starter's status
    request (`tfrund start` asking the daemon it started) comes and goes, a client's connection stays."""
    if sockets(pid) < count:
        return False
    time.sleep(0.3)
    return sockets(pid) >= count


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])
