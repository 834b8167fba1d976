"""The connection keeper: one SSH connection per box, kept open between commands (like ControlPersist).

Every remote verb would otherwise pay for importing asyncssh and for an SSH handshake before saying a
word (about 0.4 s here). The first verb for a box starts a keeper in the background; the keeper holds
the SSH connection and listens on a Unix socket in a 0700 folder of this user's; each verb connects to
that socket and speaks the protocol straight through to the box's daemon, each connection on an SSH
channel of its own. The keeper exits after ten idle minutes, or as soon as its SSH connection drops:
the next verb starts a fresh one. TFRUN_SSH_PERSIST=0 turns it off.

    python -m tfrun.client.keeper HOST_JSON [--accept-new-host-key]   (started by the client, never by hand)
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import fcntl
import hashlib
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

from tfrun.client.config import Host
from tfrun.client.errors import TfrunError
from tfrun.constants import EXIT_DAEMON
from tfrun.protocol import Channel

IDLE_EXIT_S = 600.0
_START_TIMEOUT_S = 60.0


def enabled() -> bool:
    return os.environ.get("TFRUN_SSH_PERSIST", "1") not in ("0", "no", "false")


def socket_path(host: Host) -> Path:
    """Where the keeper for `host` listens: short, per user, named by what identifies the daemon."""
    base = Path(os.environ.get("XDG_RUNTIME_DIR") or f"/tmp/tfrun-{os.getuid()}") / "keepers"
    digest = hashlib.sha256(host.identity.encode()).hexdigest()[:20]
    return base / f"{digest}.sock"


async def connect(host: Host, accept_new: bool) -> Channel:
    """A channel to the box's daemon through its keeper, starting the keeper first if none answers."""
    path = socket_path(host)
    try:
        return await Channel.connect_unix(str(path))
    except (FileNotFoundError, ConnectionRefusedError):
        pass
    await asyncio.get_running_loop().run_in_executor(None, _start, host, accept_new, path)
    return await Channel.connect_unix(str(path))


def _start(host: Host, accept_new: bool, path: Path) -> None:
    """Start a keeper and wait until it listens; racing clients serialise on a lock and start one."""
    import subprocess

    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    os.chmod(path.parent, 0o700)
    with open(path.with_suffix(".start"), "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if _answers(path):
            return
        command = [sys.executable, "-m", "tfrun.client.keeper", json.dumps(dataclasses.asdict(host))]
        if accept_new:
            command.append("--accept-new-host-key")
        proc = subprocess.Popen(
            command,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            start_new_session=True,
        )
        assert proc.stdout is not None and proc.stderr is not None
        ready = proc.stdout.readline()  # "ready", or nothing when it failed
        if ready.strip() != b"ready":
            error = proc.stderr.read().decode(errors="replace").strip().splitlines()
            proc.wait(timeout=_START_TIMEOUT_S)
            message = error[-1] if error else f"the connection keeper exited with code {proc.returncode}"
            raise TfrunError(message.removeprefix("tfrun: error: "), EXIT_DAEMON)


def _answers(path: Path) -> bool:
    import socket

    with socket.socket(socket.AF_UNIX) as sock:
        return sock.connect_ex(str(path)) == 0


class Keeper:
    def __init__(self, host: Host, conn: Any) -> None:
        self.host = host
        self.conn = conn
        self.active = 0
        self.last_used = time.monotonic()

    async def serve(self, path: Path) -> None:
        self.unusable = asyncio.Event()  # set when the SSH connection can no longer open channels
        server = await asyncio.start_unix_server(self._client, path=str(path))
        os.chmod(path, 0o600)
        print("ready", flush=True)
        _detach_stdio()
        ended = [asyncio.ensure_future(self.conn.wait_closed()), asyncio.ensure_future(self.unusable.wait())]
        try:
            while not any(task.done() for task in ended):
                await asyncio.wait(ended, timeout=5, return_when=asyncio.FIRST_COMPLETED)
                if self.active == 0 and time.monotonic() - self.last_used > IDLE_EXIT_S:
                    break
        finally:
            server.close()
            path.unlink(missing_ok=True)
            self.conn.close()
            for task in ended:
                task.cancel()

    async def _client(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        """Pipe one local connection to the daemon over an SSH channel of its own, both ways."""
        from tfrun.client.ssh import open_raw

        self.active += 1
        try:
            try:
                remote_reader, remote_writer = await open_raw(self.conn, self.host)
            except Exception:
                # The connection cannot open a channel: it is dead, or the box changed under it. Stop
                # serving it, so that the next verb (this one, retrying) starts a keeper afresh.
                self.unusable.set()
                raise
            await asyncio.gather(_pump(reader, remote_writer), _pump(remote_reader, writer))
        except Exception:  # a failed channel ends this client's connection
            pass
        finally:
            writer.close()
            self.active -= 1
            self.last_used = time.monotonic()


async def _pump(source: Any, sink: Any) -> None:
    try:
        while data := await source.read(1 << 16):
            sink.write(data)
            await sink.drain()
    finally:
        with contextlib.suppress(Exception):  # already closed: nothing left to tell it
            sink.write_eof()


def _detach_stdio() -> None:
    """Once ready, let go of the client's pipes: nobody reads them any more."""
    null = os.open(os.devnull, os.O_RDWR)
    for fd in (1, 2):
        os.dup2(null, fd)
    os.close(null)


async def _main(host: Host, accept_new: bool) -> None:
    from tfrun.client import ssh

    path = socket_path(host)
    conn = await ssh.open_ssh(host, accept_new)
    channel, _ = await ssh.open_channel(conn, host)  # learns how to reach the daemon; reports a missing tfrund
    channel.close()
    path.unlink(missing_ok=True)  # a keeper that died: we hold the start lock, so it is stale
    await Keeper(host, conn).serve(path)


def main(argv: list[str]) -> None:
    host = Host(**json.loads(argv[1]))
    try:
        asyncio.run(_main(host, "--accept-new-host-key" in argv[2:]))
    except TfrunError as exc:
        print(f"tfrun: error: {exc.message}", file=sys.stderr, flush=True)
        raise SystemExit(exc.exit_code) from None


if __name__ == "__main__":
    main(sys.argv)
