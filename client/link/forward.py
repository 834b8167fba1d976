"""`tfrun forward`: a local TCP port that reaches a port on the box, through the SSH connection tfrun holds.

Each connection made to the local port gets an SSH channel of its own to 127.0.0.1:BOX_PORT on the box
(direct-tcpip, what `ssh -L` asks for), so a service that listens on the box's loopback only (TensorBoard,
Jupyter, an HTTP server) is reachable from here and from nowhere else. The local port listens on 127.0.0.1
only: a forwarded service is the user's, not the network's.

With the connection keeper (client/link/keeper.py) the channels ride the keeper's connection: a verb that stays for
hours then holds no SSH connection of its own, and a dropped connection is opened again by the next keeper.
The keeper serves forwards on a socket beside its protocol socket (client/link/tunnel.py); a client writes `PORT\\n`,
reads `ok\\n`, `closed WHY\\n` (nothing accepts on that port) or `error WHY\\n`, then the bytes flow. Without
the keeper (TFRUN_SSH_PERSIST=0) this process opens the SSH connection itself and keeps it for as long as it
forwards.

Both ends belong to other users too. Here, any user of this machine may connect to 127.0.0.1: each connection is
admitted only if the kernel says its peer runs as this user (client/link/loopback.py), else closed unheard. On the
box, a service's port is anyone's to bind once the service ended: a forward to a service asks the box's daemon
before each connection whether the service's own processes still listen there (`service_guard`).
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Awaitable
from typing import Any, Callable, Optional

from tfrun.constants import EXIT_DAEMON, EXIT_USAGE
from tfrun.private import NotPrivate, check_peer

from ..config.settings import Host
from ..errors import TfrunError
from . import loopback
from .tunnel import forward_path, pump, refusal


class NothingListens(TfrunError):
    """The box refused the connection to the port: nothing listens there (yet)."""


# A tunnel: the box port's byte streams (reader, writer), or TfrunError saying why there is none.
Opener = Callable[[int], Awaitable[tuple[Any, Any]]]
# Before each tunnel: returns if the box's port may be reached now, else raises TfrunError saying why not.
Guard = Callable[[], Awaitable[None]]


def service_guard(client: Any, job: int) -> Guard:
    """The guard of a forward to service `job`: the box's daemon (through `client`, an AsyncClient) says the
    service still runs and its own processes listen on its port, so once it ended nothing reaches whoever
    listens there since."""
    from tfrun.protocol.channel import RemoteError

    from ..calls import services

    async def guard() -> None:
        try:
            await client.call(services.check(job))
        except RemoteError as exc:
            raise TfrunError(exc.message, EXIT_DAEMON) from None

    return guard


def keeper_opener(host: Host, accept_new: bool) -> Opener:
    """Tunnels through the box's keeper, starting one (again) whenever none answers: a keeper idles out or its
    connection drops, and a forward that stays for a day must outlive both."""
    from . import keeperclient
    from .keepertrust import socket_path

    path = forward_path(socket_path(host, accept_new))

    async def open_tunnel(port: int) -> tuple[Any, Any]:
        try:
            reader, writer = await asyncio.open_unix_connection(str(path))
        except (FileNotFoundError, ConnectionRefusedError):
            channel = await keeperclient.connect(host, accept_new)  # starts the keeper, or says why it cannot
            channel.close()
            try:
                reader, writer = await asyncio.open_unix_connection(str(path))
            except (FileNotFoundError, ConnectionRefusedError):  # a keeper of a tfrun before forwards
                raise TfrunError(
                    f"the connection keeper for {host.label} is an older tfrun's, which cannot forward: it ends "
                    "after 10 idle minutes, or forward without it (TFRUN_SSH_PERSIST=0)",
                    EXIT_DAEMON,
                ) from None
        try:
            check_peer(writer.get_extra_info("socket"), str(path))  # before the port: another user's is told nothing
        except NotPrivate as exc:
            writer.close()
            raise TfrunError(exc.message, EXIT_DAEMON) from None
        writer.write(f"{port}\n".encode())
        answer = (await reader.readline()).decode(errors="replace").strip()
        if answer != "ok":
            writer.close()
            word, _, why = answer.partition(" ")
            raise (NothingListens if word == "closed" else TfrunError)(
                why or "the connection keeper closed the forward", EXIT_DAEMON
            )
        return reader, writer

    return open_tunnel


async def direct_opener(host: Host, accept_new: bool) -> tuple[Opener, Callable[[], None]]:
    """Tunnels on an SSH connection of this process's own (no keeper), and how to close it. A connection that
    dropped (its keepalives unanswered: a link that died) is opened again for the next tunnel, as a keeper
    would be: a forward that stays for a day must outlive the link's outages."""
    import asyncssh

    from . import ssh

    held = [await ssh.open_ssh(host, accept_new)]

    async def open_tunnel(port: int) -> tuple[Any, Any]:
        if held[0].is_closed():
            held[0] = await ssh.open_ssh(host, accept_new)
        try:
            return await held[0].open_connection("127.0.0.1", port)
        except asyncssh.ChannelOpenError as exc:
            refused = NothingListens if exc.code == asyncssh.OPEN_CONNECT_FAILED else TfrunError
            raise refused(refusal(exc), EXIT_DAEMON) from None
        except asyncssh.Error as exc:  # lost under the channel's opening: the next tunnel connects again
            raise TfrunError(f"the SSH connection to {host.label} was lost: {exc.reason}", EXIT_DAEMON) from None

    return open_tunnel, lambda: held[0].close()


class Forward:
    """A listening local port whose every connection is tunnelled to BOX_PORT on the box."""

    def __init__(
        self, open_tunnel: Opener, box_port: int, warn: Callable[[str], None], guard: Optional[Guard] = None
    ) -> None:
        self.open_tunnel = open_tunnel
        self.box_port = box_port
        self.warn = warn  # one line on stderr: a connection that could not be tunnelled, and why
        self.guard = guard
        self.port = 0  # the local port, once listening
        self.strangers: set[Optional[int]] = set()  # the uids refused (None: not found), each told of once

    async def probe(self) -> Optional[str]:
        """Try one tunnel before listening: a box where nothing listens on the port yet is only a warning (a
        service may be starting); anything else (a box that refuses forwarding, no keeper, a service that
        ended) fails the verb now."""
        try:
            if self.guard is not None:
                await self.guard()
            _, writer = await self.open_tunnel(self.box_port)
        except NothingListens as exc:
            return exc.message
        writer.close()
        return None

    async def listen(self, local_port: int) -> asyncio.Server:
        """Listen on 127.0.0.1:`local_port` (0: any free port); TfrunError if that port is taken."""
        try:
            server = await asyncio.start_server(self._connection, "127.0.0.1", local_port)
        except OSError as exc:  # asyncio's message wraps the errno's words in its own: say the errno's alone
            why = os.strerror(exc.errno) if exc.errno else str(exc)
            raise TfrunError(f"cannot listen on 127.0.0.1:{local_port}: {why}", EXIT_USAGE) from None
        self.port = server.sockets[0].getsockname()[1]
        if not loopback.can_tell():
            self.warn(f"this system cannot tell which user connects to 127.0.0.1:{self.port}: any user of this "
                      "machine may use the forward")  # fmt: skip
        return server

    def _admitted(self, writer: asyncio.StreamWriter) -> bool:
        """Whether the connection comes from this user (where the kernel can say): another user's, or one whose
        socket the kernel no longer lists, is closed before a byte is read or tunnelled."""
        if not loopback.can_tell():
            return True
        uid = loopback.peer_uid(writer.get_extra_info("socket"))
        if uid == os.geteuid():
            return True
        if uid not in self.strangers:  # once per uid: another user's knocking cannot flood this terminal
            self.strangers.add(uid)
            who = "a socket the kernel does not list" if uid is None else f"uid {uid}, not you"
            self.warn(f"refused a connection to 127.0.0.1:{self.port} from {who}: only you may use this forward")
        return False

    async def _connection(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        if not self._admitted(writer):
            writer.close()
            return
        try:
            if self.guard is not None:
                await self.guard()
            remote_reader, remote_writer = await self.open_tunnel(self.box_port)
        except TfrunError as exc:
            self.warn(f"a connection to box port {self.box_port} failed: {exc.message}")
            writer.close()
            return
        except OSError as exc:
            self.warn(f"a connection to box port {self.box_port} failed: {exc.strerror or exc}")
            writer.close()
            return
        try:
            await asyncio.gather(pump(reader, remote_writer), pump(remote_reader, writer))
        finally:
            writer.close()
            remote_writer.close()


def local_port_for(box_port: int) -> int:
    """The local port to use when none is given: the box's own number when it is free here (a URL that reads
    the same on both sides), else any free port."""
    import socket

    with socket.socket() as sock:
        try:
            sock.bind(("127.0.0.1", box_port))
        except OSError:
            return 0
    return box_port
