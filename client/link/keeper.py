"""The connection keeper: one SSH connection per box, kept open between commands (like ControlPersist).

Every remote verb would otherwise pay for importing asyncssh and for an SSH handshake before saying a
word (about 0.4 s here). The first verb for a box starts a keeper in the background; the keeper holds
the SSH connection and listens on a Unix socket in a 0700 folder of this user's; each verb connects to
that socket and speaks the protocol straight through to the box's daemon, each connection on an SSH
channel of its own. TFRUN_SSH_PERSIST=0 turns it off.

One keeper process may hold several boxes' connections: the boxes a verb finds no keeper for at once (a pool verb
asks every member concurrently) are handed to ONE process (`_Batch`, client/link/keeperclient.py), so a cold `ps --host
all` over ten boxes starts one Python that imports asyncssh, not ten. Each box still has its own socket,
connection, idle clock and end: a connection idle for ten minutes, or one that drops, is let go (its socket
removed, the next verb for that box starts a keeper process for it alone) while the process serves the others, and
the process exits with its last connection. Each box's keeper also takes `tfrun forward`'s connections, on a
socket of their own beside the protocol's (client/link/tunnel.py).

The simplest design that keeps one verb's boxes together: no process is shared across verbs or callers, so
nothing needs a control protocol, and every property of one keeper per box holds per socket. A per-user
process for every box is not used: it would have to open connections for callers whose HOME, agent and ~/.ssh
differ from its own (asyncssh reads them process-wide).

A keeper serves only callers who would have opened the same connection themselves: each socket is named by
the box and by everything that decides trust (client/link/keepertrust.py), and the process is started with the
caller's own environment, so it opens each connection as that caller would. Starting waits for each box at
most the verb's timeout (a pool's member wait): a box not ready by then is reported as not answering, and
the process gives it up by itself (or is killed, if it readied no box), so a dead box never hangs a verb.

    python -m tfrun.client.link.keeper   (started by the client only; says "ready I" or "error I WHY" for each box)

The parameters come on its stdin, one JSON document (`keeperclient._start`): {"boxes": [[HOST, SOCKET], ...],
"accept_new": BOOL, "timeout": SECONDS or null}. Never on its command line, which every user of the machine reads
in `ps`: a host's env holds secrets, and a socket's path tells where to wait for the next keeper."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import sys
import time
from pathlib import Path
from typing import Any, Callable, Optional

from tfrun.private import peer_is_self
from tfrun.protocol.wire import read_header

from ..config.settings import Host
from ..errors import TfrunError
from .keeperclient import answers
from .tunnel import forward_path, pump, serve_forward

IDLE_EXIT_S = 600.0


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
        from .ssh import open_raw

        if not peer_is_self(writer.get_extra_info("socket")):
            writer.close()
            return
        self.active += 1
        try:
            hello = await read_header(reader)  # the verb's hello: a remembered socket must prove itself first
            if hello is None:
                return
            try:
                remote_reader, remote_writer, answer = await open_raw(self.conn, self.host, hello)
            except Exception:
                # The connection cannot open a channel: it is dead, or the box changed under it. Stop
                # serving it, before this verb hears of it, so that its next try starts a keeper afresh.
                self._let_go()
                self.unusable.set()
                raise
            writer.write(answer)
            await asyncio.gather(pump(reader, remote_writer), pump(remote_reader, writer))
        except Exception:  # a failed channel ends this client's connection
            pass
        finally:
            writer.close()
            self.active -= 1
            self.last_used = time.monotonic()

    async def _forward(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        """One `tfrun forward` connection: a direct-tcpip channel to a port on the box (client/link/tunnel.py).
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
        if answers(path):  # given up by the client meanwhile, and started by another: that one serves
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
    from . import ssh

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
