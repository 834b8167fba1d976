"""A verb's side of the connection keeper (client/link/keeper.py): a channel to a box's daemon through its keeper's
socket, and, where none answers, one keeper process started for all the boxes this verb needs at once."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import fcntl
import json
import os
import sys
import time
from pathlib import Path
from typing import Any, Callable, ClassVar, Optional

from tfrun.constants import EXIT_DAEMON, SAFE_PATH
from tfrun.private import check_private, peer_is_self
from tfrun.protocol.channel import Channel
from tfrun.protocol.wire import ConnectionClosed

from ..config.settings import Host
from ..errors import TfrunError
from .keepertrust import socket_path

# The longest a verb waits for a keeper to get ready when it has no shorter timeout of its own (a pool's): the
# keeper's connect gives up after its ConnectTimeout (15 s by default) and a link that dies under it after
# 15 s of silence, so this bounds only a box that answers but never gets its daemon ready.
_START_TIMEOUT_S = 60.0


# How a connection through a keeper ends before the hello: the keeper found its SSH connection dead (it has
# let go of its socket by then, so the next try starts a fresh keeper), was killed meanwhile (a reset), or the
# box's end of the channel went away (tfrund gone from the box: the keeper cannot tell the verb why).
HUNG_UP = (ConnectionClosed, ConnectionResetError, BrokenPipeError)

# Tries at the keeper socket before `connect` raises HUNG_UP: a second is what the user would do, and it can
# still land on a connection dying under the hello. Three, so a box that always hangs up fails at once.
_CONNECT_TRIES = 3

# The event loop turns a batch waits for more boxes: a pool verb's connects all fail on a missing socket in
# the first turn (a Unix connect answers at once), so one turn would do; a few spare ones cost microseconds.
_GATHER_TURNS = 3


def enabled() -> bool:
    return os.environ.get("TFRUN_SSH_PERSIST", "1") not in ("0", "no", "false")


async def connect(host: Host, accept_new: bool, timeout: Optional[float] = None) -> Channel:
    """A channel to the box's daemon through its keeper, starting one first if none answers. The boxes that a
    verb needs at once (a pool's) get one keeper process between them (see `_Batch`). A box not ready within
    `timeout` seconds is given up: the thread that waits for it must end by then, since an event loop's end
    waits for its threads (a pool verb must not hang on a box that never answers)."""
    for _ in range(_CONNECT_TRIES - 1):
        with contextlib.suppress(*HUNG_UP):
            return await _connect_once(host, accept_new, timeout)
    return await _connect_once(host, accept_new, timeout)


async def _connect_once(host: Host, accept_new: bool, timeout: Optional[float]) -> Channel:
    path = socket_path(host, accept_new)
    try:
        return await Channel.connect_unix(str(path))
    except (FileNotFoundError, ConnectionRefusedError):
        pass
    error = await _Batch.join(host, accept_new, path, timeout)
    if error is not None:
        raise TfrunError(error, EXIT_DAEMON)
    return await Channel.connect_unix(str(path))


class _Batch:
    """The boxes that this event loop wants keepers for at once: one keeper process is started for them all.

    A connect that finds no keeper joins the open batch (opening one if none is); after a few turns of the
    loop the batch closes and one thread starts the process and reports each box as it gets ready or fails,
    so a fast box is not kept waiting for a slow one."""

    _open: ClassVar[dict[tuple[asyncio.AbstractEventLoop, bool], _Batch]] = {}

    def __init__(self, loop: asyncio.AbstractEventLoop, accept_new: bool) -> None:
        self.loop = loop
        self.accept_new = accept_new
        self.wants: dict[Path, tuple[Host, list[asyncio.Future[Optional[str]]]]] = {}
        self.timeouts: list[Optional[float]] = []
        self.task = loop.create_task(self._launch())

    @classmethod
    async def join(cls, host: Host, accept_new: bool, path: Path, timeout: Optional[float]) -> Optional[str]:
        """Wait until `host`'s keeper listens at `path` (None), or for why it will not (a line)."""
        loop = asyncio.get_running_loop()
        batch = cls._open.get((loop, accept_new))
        if batch is None:
            batch = cls._open[(loop, accept_new)] = cls(loop, accept_new)
        done: asyncio.Future[Optional[str]] = loop.create_future()
        batch.wants.setdefault(path, (host, []))[1].append(done)
        batch.timeouts.append(timeout)
        return await done

    def _report(self, path: Path, error: Optional[str]) -> None:
        for done in self.wants[path][1]:
            if not done.done():  # a waiter cancelled (its verb's own timeout) has no use for it
                done.set_result(error)

    async def _launch(self) -> None:
        key = (self.loop, self.accept_new)
        try:
            for _ in range(_GATHER_TURNS):
                await asyncio.sleep(0)
            del self._open[key]
            timeout = None if None in self.timeouts else max(t for t in self.timeouts if t is not None)
            hosts = [(host, path) for path, (host, _) in self.wants.items()]

            def report(path: Path, error: Optional[str]) -> None:
                with contextlib.suppress(RuntimeError):  # the loop closed: nobody waits any more
                    self.loop.call_soon_threadsafe(self._report, path, error)

            await self.loop.run_in_executor(None, _start, hosts, self.accept_new, timeout, report)
        except TfrunError as exc:
            for path in self.wants:
                self._report(path, exc.message)
        except OSError as exc:  # the runtime folder cannot be made, or Python cannot start
            for path in self.wants:
                self._report(path, f"cannot start the connection keeper: {exc.strerror or exc}")
        except Exception as exc:  # anything else is still one line per box, never a task's traceback at exit
            for path in self.wants:
                self._report(path, f"cannot start the connection keeper: {exc}")
        finally:
            if self._open.get(key) is self:
                del self._open[key]
            for path in self.wants:  # whatever went wrong, no waiter is left waiting (told ones keep their answer)
                self._report(path, "the connection keeper gave no answer")


def _start(
    hosts: list[tuple[Host, Path]],
    accept_new: bool,
    timeout: Optional[float],
    report: Callable[[Path, Optional[str]], None],
) -> None:
    """Start one keeper process for the boxes of `hosts` that have none, and report each as it gets ready or
    fails. Clients racing for a box serialise on its start lock (taken in path order: no deadlock) and start
    one keeper for it; a lock is let go as soon as its box is ready. A keeper process that has readied no box
    within `timeout` is killed; one that readied some gives up the others by itself (it is given `timeout`)."""
    import select
    import subprocess

    check_private(hosts[0][1].parent)  # made by socket_path; looked at again before a lock or socket goes in
    locks: dict[Path, Any] = {}
    with contextlib.ExitStack() as held:  # each lock closed (let go) at the end, if not as soon as its box is told
        todo = []
        for host, path in sorted(hosts, key=lambda pair: pair[1]):
            lock = locks[path] = held.enter_context(open(path.with_suffix(".start"), "a"))
            fcntl.flock(lock, fcntl.LOCK_EX)
            if answers(path):  # another client started it while we waited for the lock
                report(path, None)
                locks.pop(path).close()
            else:
                todo.append((host, path))
        if not todo:
            return
        # The paths are handed over: the keeper's own view could differ (accept-new writes known_hosts).
        boxes = [[dataclasses.asdict(host), str(path)] for host, path in todo]
        params = json.dumps({"boxes": boxes, "accept_new": accept_new, "timeout": timeout})
        proc = subprocess.Popen(
            [sys.executable, *SAFE_PATH, "-m", "tfrun.client.link.keeper"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            start_new_session=True,
        )
        assert proc.stdin is not None and proc.stdout is not None and proc.stderr is not None
        with contextlib.suppress(BrokenPipeError), proc.stdin:  # one that died unread says why on stderr
            proc.stdin.write(params.encode())
        waiting = {index: path for index, (_, path) in enumerate(todo)}
        timeout = _START_TIMEOUT_S if timeout is None else timeout  # a verb never waits for ever
        deadline = time.monotonic() + timeout
        readied, ended, pending = False, False, b""
        while waiting:
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([proc.stdout], [], [], left)[0]:
                break
            chunk = os.read(proc.stdout.fileno(), 1 << 16)  # not readline: a buffered line hides from select
            if not chunk:
                ended = True
                break
            *lines, pending = (pending + chunk).split(b"\n")
            for line in lines:  # "ready INDEX" or "error INDEX MESSAGE"
                word, _, rest = line.decode(errors="replace").partition(" ")
                index, _, message = rest.partition(" ")
                path = waiting.pop(int(index))
                readied = readied or word == "ready"
                report(path, None if word == "ready" else message)
                locks.pop(path).close()
        if not waiting:
            return
        if ended:  # it died before saying (a crash: its last words are on stderr)
            error = proc.stderr.read().decode(errors="replace").strip().splitlines()
            proc.wait(timeout=_START_TIMEOUT_S)
            message = error[-1] if error else f"the connection keeper exited with code {proc.returncode}"
        else:
            message = f"no answer within {timeout:g}s"
            if not readied:
                proc.kill()
                proc.wait()
        for path in waiting.values():
            report(path, message.removeprefix("tfrun: error: "))


def answers(path: Path) -> bool:
    """Whether a keeper of this user's listens at `path` (another user's socket is none: it is replaced)."""
    import socket

    with socket.socket(socket.AF_UNIX) as sock:
        return sock.connect_ex(str(path)) == 0 and peer_is_self(sock)
