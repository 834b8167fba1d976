"""Reaching a daemon: the local one on its Unix socket (started on demand), or a box's over SSH."""

from __future__ import annotations

import sys
from dataclasses import dataclass
from typing import Optional

from tfrun.constants import EXIT_DAEMON, SAFE_PATH
from tfrun.paths import Layout
from tfrun.private import NotPrivate
from tfrun.protocol.channel import Channel, RemoteError
from tfrun.protocol.fields import ErrorCode
from tfrun.protocol.wire import ConnectionClosed

from ..config.settings import Host
from ..errors import TfrunError, cannot_start


@dataclass(frozen=True)
class Target:
    """Where a verb's requests go: a box (`host`), or the local daemon when `host` is None. `timeout`: the
    seconds a keeper being started for the box may take (client/pools/members.py's short wait for each box of a
    pool); None waits as long as the SSH connect does."""

    host: Optional[Host] = None
    accept_new_host_key: bool = False
    timeout: Optional[float] = None

    @property
    def local(self) -> bool:
        return self.host is None

    def place(self, full: bool = False) -> str:
        """Where the jobs are, in words: `box`, with `full` `box (alice@gpu-box)`, or `this machine`."""
        if self.host is None:
            return "this machine"
        return f"{self.host.name} ({self.host.destination})" if full and self.host.name else self.host.label

    async def connect(self) -> Channel:
        """A channel to the target's daemon. A socket, or its folder, that is not this user's alone (another
        user's, on a shared machine: tfrun/private.py) is one line naming it and the fix, never a connection."""
        try:
            return await self._connect()
        except NotPrivate as exc:
            raise TfrunError(exc.message, EXIT_DAEMON) from None

    async def _connect(self) -> Channel:
        if self.host is None:
            return await connect_local(Layout.from_env())
        from . import keeperclient

        if keeperclient.enabled():
            try:
                return await keeperclient.connect(self.host, self.accept_new_host_key, self.timeout)
            except RemoteError as exc:  # the box's dial-stdio, through a keeper already up, says why
                if exc.code == ErrorCode.CANNOT_START:
                    raise cannot_start(self.host.label, exc.message) from None
                raise
            except keeperclient.HUNG_UP:
                await self._why_hung_up()
                raise
        return await self._direct()

    async def _direct(self) -> Channel:
        """A channel over an SSH connection of this verb's own (TFRUN_SSH_PERSIST=0), closed with it."""
        from . import ssh

        assert self.host is not None
        conn = await ssh.open_ssh(self.host, self.accept_new_host_key)
        try:
            channel, _ = await ssh.open_channel(conn, self.host)
        except BaseException:
            conn.close()
            raise
        channel.on_close(conn.close)
        return channel

    async def _why_hung_up(self) -> None:
        """Every try through the keeper ended before the hello. A connection of the verb's own, closed at once,
        raises the reason when the box is the cause (tfrund gone from it: "tfrund was not found on box");
        if it works, the link was what failed, and the hang-up stands (a reconnect tries the keeper again:
        the conversation stays on the keeper's connection, which the user's other verbs share)."""
        try:
            channel = await self._direct()
        except TfrunError:
            raise
        except Exception:  # the link again: the hang-up says it
            return
        channel.close()


async def connect_local(layout: Layout) -> Channel:
    """A channel to the daemon of `layout`, starting it first if none answers (the embedded default).

    A daemon that took the connection but died before answering the hello (killed that very moment) is no
    daemon either: the client starts the next one, as it would a moment later, instead of failing."""
    try:
        return await Channel.connect_unix(str(layout.socket))
    except (FileNotFoundError, ConnectionError, ConnectionClosed):
        pass
    await start_local_daemon()
    try:
        return await Channel.connect_unix(str(layout.socket))
    except OSError as exc:
        raise TfrunError(
            f"tfrund started but cannot be reached at {layout.socket}: {exc.strerror or exc}", EXIT_DAEMON
        ) from None


async def start_local_daemon() -> None:
    """Run `tfrund start` with this Python (the same tfrun install); it returns once the daemon answers.

    `tfrund start` serialises racing starters on a lock, so twenty clients starting at once get one daemon.
    """
    import asyncio  # here, not above: `tfrun ps` on a running daemon needs no asyncio (cli.ask)

    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        *SAFE_PATH,
        "-m",
        "tfrun.runner",
        "start",
        "--quiet",
        stdin=asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.DEVNULL,
        stderr=asyncio.subprocess.PIPE,
    )
    _, err = await proc.communicate()
    if proc.returncode != 0:
        lines = err.decode(errors="replace").strip().splitlines()
        reason = lines[-1].removeprefix("tfrund: error: ") if lines else f"exit code {proc.returncode}"
        raise cannot_start(None, reason)
