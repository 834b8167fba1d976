"""The connection keeper: one SSH connection per box, kept open between commands (like ControlPersist).

Every remote verb would otherwise pay for importing asyncssh and for an SSH handshake before saying a
word (about 0.4 s here). The first verb for a box starts a keeper in the background; the keeper holds
the SSH connection and listens on a Unix socket in a 0700 folder of this user's; each verb connects to
that socket and speaks the protocol straight through to the box's daemon, each connection on an SSH
channel of its own. TFRUN_SSH_PERSIST=0 turns it off.

One keeper process may hold several boxes' connections: the boxes a verb finds no keeper for at once (a pool
verb asks every member concurrently) are handed to ONE process (`_Batch`), so a cold `ps --host all` over ten
boxes starts one Python that imports asyncssh, not ten. Each box still has its own socket, connection, idle
clock and end: a connection idle for ten minutes, or one that drops, is let go (its socket removed, the next
verb for that box starts a keeper process for it alone) while the process serves the others, and the process
exits with its last connection. Each box's keeper also takes `tfrun forward`'s connections, on a socket of
their own beside the protocol's (client/tunnel.py).

The simplest design that keeps one verb's boxes together: no process is shared across verbs or callers, so
nothing needs a control protocol, and every property of one keeper per box holds per socket. A per-user
process for every box is not used: it would have to open connections for callers whose HOME, agent and ~/.ssh
differ from its own (asyncssh reads them process-wide).

A keeper serves only callers who would have opened the same connection themselves: each socket is named by
the box and by everything that decides trust (client/keepertrust.py), and the process is started with the
caller's own environment, so it opens each connection as that caller would. Starting waits for each box at
most the verb's timeout (a pool's fleet timeout): a box not ready by then is reported as not answering, and
the process gives it up by itself (or is killed, if it readied no box), so a dead box never hangs a verb.

    python -m tfrun.client.keeper   (started by the client only; says "ready I" or "error I WHY" for each box)

The parameters come on its stdin, one JSON document (`_start`): {"boxes": [[HOST, SOCKET], ...], "accept_new":
BOOL, "timeout": SECONDS or null}. Never on its command line, which every user of the machine reads in `ps`: a
host's env holds secrets, and a socket's path tells where to wait for the next keeper.
"""

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

from tfrun.client.config import Host
from tfrun.client.errors import TfrunError
from tfrun.client.keepertrust import socket_path
from tfrun.client.tunnel import forward_path, pump, serve_forward
from tfrun.constants import EXIT_DAEMON
from tfrun.private import check_private, peer_is_self
from tfrun.protocol.channel import Channel
from tfrun.protocol.wire import ConnectionClosed

IDLE_EXIT_S = 600.0
# The longest a verb waits for a keeper to get ready when it has no shorter timeout of its own (a pool's): the
# keeper's connect gives up after its ConnectTimeout (15 s by default) and a link that dies under it after
# 15 s of silence, so this bounds only a box that answers but never gets its daemon ready.
_START_TIMEOUT_S = 60.0


def enabled() -> bool:
    return os.environ.get("TFRUN_SSH_PERSIST", "1") not in ("0", "no", "false")


# How a connection through a keeper ends before the hello: the keeper found its SSH connection dead (it has
# let go of its socket by then, so the next try starts a fresh keeper), was killed meanwhile (a reset), or the
# box's end of the channel went away (tfrund gone from the box: the keeper cannot tell the verb why).
HUNG_UP = (ConnectionClosed, ConnectionResetError, BrokenPipeError)

# Tries at the keeper socket before `connect` raises HUNG_UP: a second is what the user would do, and it can
# still land on a connection dying under the hello. Three, so a box that always hangs up fails at once.
_CONNECT_TRIES = 3


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


# The event loop turns a batch waits for more boxes: a pool verb's connects all fail on a missing socket in
# the first turn (a Unix connect answers at once), so one turn would do; a few spare ones cost microseconds.
_GATHER_TURNS = 3


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
            if _answers(path):  # another client started it while we waited for the lock
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
            [sys.executable, "-m", "tfrun.client.keeper"],
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


def _answers(path: Path) -> bool:
    """Whether a keeper of this user's listens at `path` (another user's socket is none: it is replaced)."""
    import socket

    with socket.socket(socket.AF_UNIX) as sock:
        return sock.connect_ex(str(path)) == 0 and peer_is_self(sock)


class Keeper:
    """One box's SSH connection and the socket it is served on, until it drops or idles out."""

    def __init__(self, host: Host, conn: Any) -> None:
        self.host = host
        self.conn = conn
        self.active = 0
        self.last_used = time.monotonic()
        self.listening: list[tuple[asyncio.AbstractServer, Path, int]] = []  # servers, their sockets and inodes

    async def serve(self, path: Path, ready: Callable[[], None]) -> None:
        self.unusable = asyncio.Event()  # set when the SSH connection can no longer open channels
        forwards = forward_path(path)
        forwards.unlink(missing_ok=True)
        self._listen(await asyncio.start_unix_server(self._forward, path=str(forwards)), forwards)
        self._listen(await asyncio.start_unix_server(self._client, path=str(path)), path)
        ready()
        ended = [asyncio.ensure_future(self.conn.wait_closed()), asyncio.ensure_future(self.unusable.wait())]
        try:
            while not any(task.done() for task in ended):
                await asyncio.wait(ended, timeout=5, return_when=asyncio.FIRST_COMPLETED)
                if self.active == 0 and time.monotonic() - self.last_used > IDLE_EXIT_S:
                    break
        finally:
            self._let_go()
            self.conn.close()
            for task in ended:
                task.cancel()

    def _listen(self, server: asyncio.AbstractServer, path: Path) -> None:
        os.chmod(path, 0o600)
        self.listening.append((server, path, path.stat().st_ino))

    def _let_go(self) -> None:
        """Take no more connections: close the listeners and remove their sockets, unless a fresh keeper
        has bound the same path since (the verb that found this one dead started it)."""
        for server, path, inode in self.listening:
            server.close()
            with contextlib.suppress(OSError):
                if path.stat().st_ino == inode:
                    path.unlink()
        self.listening.clear()

    async def _client(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        """Pipe one local connection to the daemon over an SSH channel of its own, both ways. A caller of
        another uid (root aside, none can reach the 0700 folder) is hung up on unheard."""
        from tfrun.client.ssh import open_raw

        if not peer_is_self(writer.get_extra_info("socket")):
            writer.close()
            return
        self.active += 1
        try:
            try:
                remote_reader, remote_writer = await open_raw(self.conn, self.host)
            except Exception:
                # The connection cannot open a channel: it is dead, or the box changed under it. Stop
                # serving it, before this verb hears of it, so that its next try starts a keeper afresh.
                self._let_go()
                self.unusable.set()
                raise
            await asyncio.gather(pump(reader, remote_writer), pump(remote_reader, writer))
        except Exception:  # a failed channel ends this client's connection
            pass
        finally:
            writer.close()
            self.active -= 1
            self.last_used = time.monotonic()

    async def _forward(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        """One `tfrun forward` connection: a direct-tcpip channel to a port on the box (client/tunnel.py).
        It counts as use, so the keeper does not idle out under a browser's open connection. A caller of
        another uid is hung up on, as in `_client`."""
        if not peer_is_self(writer.get_extra_info("socket")):
            writer.close()
            return
        self.active += 1
        try:
            await serve_forward(self.conn, reader, writer)
        except Exception:  # a failed channel ends this forward only
            pass
        finally:
            self.active -= 1
            self.last_used = time.monotonic()


class _Reporter:
    """Tells the starting client, a line each, how each box went; lets go of its pipes once all are told."""

    def __init__(self, boxes: int) -> None:
        self.boxes = boxes
        self.told: set[int] = set()

    def say(self, index: int, word: str, message: str = "") -> None:
        if index in self.told:
            return
        self.told.add(index)
        with contextlib.suppress(OSError):  # a client that gave up has closed the pipe
            print(f"{word} {index} {' '.join(message.split())}".rstrip(), flush=True)
        if len(self.told) == self.boxes:  # nobody reads the pipes any more
            null = os.open(os.devnull, os.O_RDWR)
            for fd in (1, 2):
                os.dup2(null, fd)
            os.close(null)


async def _keep(index: int, host: Host, path: Path, accept_new: bool, timeout: Optional[float], to: _Reporter) -> None:
    """Connect to one box (within `timeout`), then serve it until its connection drops or idles out."""
    try:
        conn = await asyncio.wait_for(_open(host, accept_new), timeout)
        if _answers(path):  # given up by the client meanwhile, and started by another: that one serves
            conn.close()
            return to.say(index, "error", "started by another client")
        path.unlink(missing_ok=True)  # a keeper that died: stale
        await Keeper(host, conn).serve(path, lambda: to.say(index, "ready"))
    except asyncio.TimeoutError:
        to.say(index, "error", f"no answer within {timeout:g}s" if timeout else "timed out")
    except TfrunError as exc:
        to.say(index, "error", exc.message)
    except Exception as exc:  # any other failure is this box's line, never the other boxes' end
        to.say(index, "error", getattr(exc, "message", None) or str(exc) or type(exc).__name__)


async def _open(host: Host, accept_new: bool) -> Any:
    from tfrun.client import ssh

    conn = await ssh.open_ssh(host, accept_new)
    try:
        channel, _ = await ssh.open_channel(conn, host)  # learns how to reach the daemon; reports a missing tfrund
    except BaseException:
        conn.close()
        raise
    channel.close()
    return conn


async def _main(boxes: list[tuple[Host, Path]], accept_new: bool, timeout: Optional[float]) -> None:
    to = _Reporter(len(boxes))
    keeps = (_keep(index, host, path, accept_new, timeout, to) for index, (host, path) in enumerate(boxes))
    await asyncio.gather(*keeps, return_exceptions=True)  # the process ends with its last connection


def main() -> None:
    """Serve the boxes named by the JSON document on stdin (see the module's docstring)."""
    params = json.loads(sys.stdin.read())
    boxes = [(Host(**host), Path(path)) for host, path in params["boxes"]]
    asyncio.run(_main(boxes, bool(params["accept_new"]), params["timeout"]))


if __name__ == "__main__":
    main()
