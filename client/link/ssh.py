"""Reaching a daemon on a box over SSH (asyncssh): host keys checked like OpenSSH, then the daemon's socket.

The fast way is SSH's Unix-socket forwarding straight to tfrund's socket: no remote shell starts. Its path
is learnt once (through the slow way) and remembered per host. The slow way, taken when forwarding is
refused (`AllowStreamLocalForwarding no`, a `restrict` key) or the path is not known yet, runs
`tfrund dial-stdio` over an exec channel; it also starts the daemon if none runs.

asyncssh is imported here only, and this module only by verbs that connect, so `tfrun --help` and local
verbs never pay for it.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import socket
import time
from pathlib import Path
from typing import Any, Optional

import asyncssh

from tfrun.constants import (
    EXIT_DAEMON,
    EXIT_USAGE,
    PROOF_TIMEOUT_S,
    SSH_ALIVE_COUNT_MAX,
    SSH_ALIVE_INTERVAL_S,
    SSH_CONNECT_TIMEOUT_S,
)
from tfrun.protocol.admin import DaemonInfo, DaemonKey, DaemonStatus, GetDaemonKey
from tfrun.protocol.channel import Channel, RemoteError, check_proof
from tfrun.protocol.fields import ErrorCode
from tfrun.protocol.proof import KEY_BYTES, new_challenge
from tfrun.protocol.wire import Hello, ProtocolError, decode_header, encode, read_header, read_message, write_message

from ..config import sshconfig
from ..config.settings import Host, parse_destination
from ..errors import TfrunError, cannot_start
from . import knownhosts
from .hostcache import SocketCache
from .remotecommand import RemoteCommand, remote_command

_RECHECK_S = 24 * 3600.0  # how long a box's refusal to forward is believed before trying again


async def open_ssh(host: Host, accept_new: bool = False) -> asyncssh.SSHClientConnection:
    """An authenticated SSH connection, or a TfrunError that says what went wrong and what to do.

    Jump hosts (`hosts add --jump`, like ssh -J) are reached in turn, each through the one before, each host
    key checked as the box's is, and the host's identity file offered on every hop: one key for the whole way,
    as a user with one key expects (OpenSSH's -i reaches the last hop only). A ProxyJump from ~/.ssh/config
    is asyncssh's to follow, with what the config says for each jump host.
    """
    accept_new = accept_new or host.accept_new_host_key
    keys = _client_keys(host)
    tunnel: Optional[asyncssh.SSHClientConnection] = None
    try:
        for hop in host.jump.split(",") if host.jump else []:
            tunnel = await _connect(hop, f"jump host {hop}", accept_new, keys, tunnel)
        return await _connect(host.destination, host.destination, accept_new, keys, tunnel)
    except BaseException:
        if tunnel is not None:
            tunnel.close()  # and the hops before it: each closes the one it came through
        raise


def _client_keys(host: Host) -> dict[str, Any]:
    """asyncssh's options for the host's identity file: it first, then the agent's keys, as OpenSSH offers an
    IdentityFile. Without one, ~/.ssh/config's IdentityFile, the agent and ~/.ssh/id_* apply."""
    if not host.identity_file:
        return {}
    path = Path(host.identity_file).expanduser()
    if not path.is_file():
        raise TfrunError(f"identity file {host.identity_file} of host {host.label} does not exist", EXIT_USAGE)
    # A key with a passphrase is skipped, not fatal: asyncssh cannot ask for it, and the agent may hold it.
    return {"client_keys": [str(path)], "ignore_encrypted": True}


def _why(exc: BaseException) -> str:
    """Why a connect failed, as ssh says it: `Connection refused`, not asyncio's `Connect call failed
    ('10.0.0.2', 22)` (the address is in the message already)."""
    if isinstance(exc, socket.gaierror):  # a name that does not resolve: its errno is the resolver's, not errno's
        return exc.strerror or str(exc)
    code = getattr(exc, "errno", None)
    if code:
        return os.strerror(code)
    return getattr(exc, "strerror", None) or str(exc) or type(exc).__name__


async def _connect(
    destination: str,
    what: str,
    accept_new: bool,
    keys: dict[str, Any],
    tunnel: Optional[asyncssh.SSHClientConnection],
) -> asyncssh.SSHClientConnection:
    """One hop: `destination` (user@host:port, or a Host of ~/.ssh/config), through `tunnel` if there is one;
    `what` names it in errors."""
    user, address, port = parse_destination(destination)
    files = knownhosts.for_destination(address, port, user)
    known = files.load()
    check = knownhosts.HostKeyCheck(files, known, accept_new)
    options: dict[str, Any] = {"client_factory": lambda: check, "known_hosts": known, **keys}
    if user:
        options["username"] = user
    if port:
        options["port"] = port
    link = _link_options(address, options)
    options.update(link)
    if tunnel is not None:
        options["tunnel"] = tunnel
    try:
        conn = await asyncssh.connect(address, **options)
    except asyncssh.HostKeyNotVerifiable:
        raise TfrunError(knownhosts.host_key_message(destination, check), EXIT_DAEMON) from None
    except asyncssh.PermissionDenied:
        raise TfrunError(_auth_message(what, bool(keys)), EXIT_DAEMON) from None
    except asyncssh.Error as exc:
        raise TfrunError(f"ssh to {what} failed: {exc.reason}", EXIT_DAEMON) from None
    except asyncio.TimeoutError:
        raise TfrunError(
            f"cannot connect to {what}: no answer within {link['connect_timeout']:g}s", EXIT_DAEMON
        ) from None
    except OSError as exc:
        raise TfrunError(f"cannot connect to {what}: {_why(exc)}", EXIT_DAEMON) from None
    if tunnel is not None:
        conn.set_tunnel(tunnel)  # closing the box's connection closes the way to it
    return conn


def _link_options(address: str, options: dict[str, Any]) -> dict[str, Any]:
    """Keepalives and a connect deadline for one hop, where ~/.ssh/config sets none for it: a link that dies
    without closing (a laptop asleep, a Wi-Fi change) is then noticed after 15 s of silence, and a connect to
    a box behind a dead link fails after 15 s, instead of waiting forever as OpenSSH's defaults (and
    asyncssh's) do. What the user's config says for the host (ServerAliveInterval, ServerAliveCountMax,
    ConnectTimeout) wins, as it does for ssh: asyncssh reads the same file for the same host; but not the values
    `tfrun ssh-config` wrote into its own block, unchanged (see below)."""
    config = Path.home() / ".ssh" / "config"
    paths = [str(config)] if os.access(config, os.R_OK) else []
    where = {key: options[key] for key in ("port", "username") if key in options}
    try:
        said = asyncssh.SSHClientConnectionOptions(host=address, config=paths, **where).config
    except (OSError, ValueError, asyncssh.Error):
        return {"connect_timeout": SSH_CONNECT_TIMEOUT_S}  # a config asyncssh cannot read: its connect says so
    ours = {
        "ServerAliveInterval": ("keepalive_interval", SSH_ALIVE_INTERVAL_S),
        "ServerAliveCountMax": ("keepalive_count_max", SSH_ALIVE_COUNT_MAX),
        "ConnectTimeout": ("connect_timeout", SSH_CONNECT_TIMEOUT_S),
    }
    # The keepalives `tfrun ssh-config --write` put in its own block are for VS Code and plain ssh (a dead link
    # noticed after two minutes): no word of the user's, so tfrun, which heals its link, keeps its own 15 s.
    written = dict(sshconfig.KEEPALIVE) if sshconfig.read_entry(address) is not None else {}
    return {
        option: default if str(said.get(name)) == written.get(name) else said.get(name, default)
        for name, (option, default) in ours.items()
    }


def _auth_message(what: str, identity_file: bool) -> str:
    if identity_file:
        return (
            f"ssh authentication to {what} failed: the identity file was not accepted (one with a passphrase "
            "must be loaded in ssh-agent)"
        )
    return (
        f"ssh authentication to {what} failed: no key was accepted (is it loaded in ssh-agent, named by "
        "IdentityFile in ~/.ssh/config, or by `tfrun hosts add --identity-file`?)"
    )


def fix_hint(host: Host, upgrade: bool = False) -> str:
    """What to run when the box has no tfrund (or another version): the ways out, named for this host."""
    if upgrade:
        if host.name:
            return f"upgrade it with `tfrun hosts install {host.name}`"
        return f"upgrade it with `tfrun hosts add NAME {host.destination} --install`"
    if host.name:
        return (
            f"install it with `tfrun hosts install {host.name}` (or `tfrun hosts add {host.name} "
            f"{host.destination} --install`), or name its path with --tfrund PATH"
        )
    return (
        f"install it with `tfrun hosts add NAME {host.destination} --install`, or name its path with "
        f"`tfrun hosts add NAME {host.destination} --tfrund PATH`"
    )


# A host's environment reaches the box on the command's stdin, never on its command line, which every user
# of the box sees in `ps` (its values may be secrets: a TFRUN_NOTIFY for the daemon it starts). This POSIX sh


async def start_process(conn: asyncssh.SSHClientConnection, command: RemoteCommand) -> Any:
    """`command` started on the box (bytes in and out), its environment already written to its stdin."""
    process = await conn.create_process(command.line, encoding=None)
    if command.stdin:
        process.stdin.write(command.stdin)
    return process


class _Stream:
    """An SSH channel's reader and writer as the protocol uses them, with a lost connection raised as
    ConnectionResetError, the way a Unix socket reports it, so callers handle one kind of loss."""

    def __init__(self, reader: Any, writer: Any) -> None:
        self.reader = reader
        self.writer = writer

    async def readuntil(self, separator: Any) -> Any:
        try:
            return await self.reader.readuntil(separator)
        except asyncssh.Error as exc:
            raise ConnectionResetError(f"ssh connection lost: {exc.reason}") from None

    async def readexactly(self, n: int) -> Any:
        try:
            return await self.reader.readexactly(n)
        except asyncssh.Error as exc:
            raise ConnectionResetError(f"ssh connection lost: {exc.reason}") from None

    def write(self, data: bytes) -> None:
        try:
            self.writer.write(data)
        except asyncssh.Error as exc:
            raise ConnectionResetError(f"ssh connection lost: {exc.reason}") from None

    async def drain(self) -> None:
        try:
            await self.writer.drain()
        except asyncssh.Error as exc:
            raise ConnectionResetError(f"ssh connection lost: {exc.reason}") from None

    def close(self) -> None:
        self.writer.close()


async def _open_stream(reader: Any, writer: Any, key: Optional[bytes] = None) -> Channel:
    stream = _Stream(reader, writer)
    return await Channel.open(stream, stream, key)


def _proof_key(known: dict[str, Any]) -> Optional[bytes]:
    """The daemon key remembered with a host's socket path, if a well-formed one is."""
    try:
        key = bytes.fromhex(known.get("socket_key") or "")
    except (TypeError, ValueError):
        return None
    return key if len(key) == KEY_BYTES else None


async def open_channel(conn: asyncssh.SSHClientConnection, host: Host) -> tuple[Channel, str]:
    """A channel to the box's daemon, and how it was reached ("socket" or "exec").

    A remembered socket path is used only with the daemon key remembered beside it, and only once what answers
    there proves it holds that key (tfrun/protocol/proof.py): after a reboot another user of the box may listen
    at that path. Anything else (no answer, another listener, an old daemon) is passed over for the exec
    channel, which learns the path and key anew, so the memory heals by itself."""
    cache = SocketCache()
    key = host.identity
    known = cache.get(key)
    refused = bool(known.get("forwarding_refused")) and time.time() - known.get("checked_at", 0) < _RECHECK_S
    proof_key = _proof_key(known)
    if known.get("socket") and proof_key is not None and not refused:
        try:
            reader, writer = await conn.open_unix_connection(known["socket"])
        except (ConnectionError, asyncssh.Error):
            pass  # forwarding refused, or no daemon there (yet): dial-stdio finds or starts it
        else:
            try:
                channel = await asyncio.wait_for(_open_stream(reader, writer, proof_key), PROOF_TIMEOUT_S)
                return channel, "socket"
            except (ProtocolError, ConnectionError, asyncssh.Error, asyncio.TimeoutError):
                writer.close()  # Unproven among them: it was told nothing but a hello
    try:
        channel = await _dial_stdio(conn, host)
        if not refused:
            # OpenSSH refuses a forward with the same code as a missing socket, so ask the daemon where it
            # listens, then try once more: with the daemon surely up, a refusal now means forwarding is off.
            info = await channel.request(DaemonStatus())
            if isinstance(info, DaemonInfo):
                works = await can_forward(conn, info.socket)
                proof = await _daemon_key(channel)
                cache.put(
                    key, socket=info.socket, socket_key=proof, forwarding_refused=not works, checked_at=time.time()
                )
    except asyncssh.Error as exc:  # the connection died under us: lost, as a reconnect understands it
        raise ConnectionResetError(f"ssh connection lost: {exc.reason}") from None
    return channel, "exec"


async def _daemon_key(channel: Channel) -> str:
    """The daemon's key as hex, asked through the exec channel (whose far end runs as the user)."""
    reply = await channel.request(GetDaemonKey())
    return reply.key if isinstance(reply, DaemonKey) else ""


async def open_raw(conn: asyncssh.SSHClientConnection, host: Host, hello: bytes) -> tuple[Any, Any, bytes]:
    """A byte stream to the box's daemon for the keeper, with the verb's first frame (`hello`) already sent
    and answered: (reader, writer, the answer's frame for the verb). Through the remembered socket, as
    `open_channel` found to work, the verb's hello goes with a challenge added and the answer must prove the
    daemon's key; otherwise, or if it does not, through `tfrund dial-stdio`, as the verb sent it."""
    known = SocketCache().get(host.identity)
    proof_key = _proof_key(known)
    if known.get("socket") and not known.get("forwarding_refused") and proof_key is not None:
        try:
            reader, writer = await conn.open_unix_connection(known["socket"])
        except (ConnectionError, asyncssh.ChannelOpenError):
            pass  # the daemon went away: dial-stdio starts a new one
        else:
            try:
                answer = await asyncio.wait_for(_proven_hello(reader, writer, hello, proof_key), PROOF_TIMEOUT_S)
                return reader, writer, answer
            except (ProtocolError, ConnectionError, asyncssh.Error, asyncio.TimeoutError):
                writer.close()
                _relearn(conn, host)
    process = await start_process(conn, remote_command(host, "dial-stdio"))
    stream = _Stream(process.stdout, process.stdin)
    stream.write(hello)
    reply = await read_header(stream)
    if reply is None:
        raise ConnectionResetError("tfrund dial-stdio ended without answering")
    return process.stdout, process.stdin, reply


_relearning: set[asyncio.Future[None]] = set()  # held here: the loop keeps only weak references to tasks


def _relearn(conn: asyncssh.SSHClientConnection, host: Host) -> None:
    """Forget the host's remembered socket, which did not prove itself, and learn where the daemon listens now
    (through the exec channel, in the background), so that the keeper's next verbs take the fast path again
    and nothing more is sent to whatever answered there."""
    SocketCache().put(host.identity, socket="", socket_key="")

    async def learn() -> None:
        with contextlib.suppress(Exception):
            channel, _ = await open_channel(conn, host)
            channel.close()

    task = asyncio.ensure_future(learn())
    _relearning.add(task)
    task.add_done_callback(_relearning.discard)


async def _proven_hello(reader: Any, writer: Any, hello: bytes, key: bytes) -> bytes:
    """Send the verb's `hello` with a challenge added, and return the daemon's answer as a frame, once it
    proves the daemon holds `key`; Unproven (or ProtocolError for a first frame that is no hello) otherwise."""
    cls, fields, _ = decode_header(hello)
    if cls is not Hello:
        raise ProtocolError("the first frame is not a hello")
    mine = Hello(**fields)
    mine.challenge = new_challenge()
    stream = _Stream(reader, writer)
    await write_message(stream, mine)
    reply = await read_message(stream)
    check_proof(key, mine, reply)
    assert reply is not None  # check_proof refused anything but a hello
    return encode(reply)


async def can_forward(conn: asyncssh.SSHClientConnection, socket_path: str) -> bool:
    """Whether the server forwards a Unix socket connection to `socket_path`."""
    try:
        _, writer = await conn.open_unix_connection(socket_path)
    except asyncssh.ChannelOpenError:
        return False
    writer.close()
    return True


async def _dial_stdio(conn: asyncssh.SSHClientConnection, host: Host) -> Channel:
    process = await start_process(conn, remote_command(host, "dial-stdio"))
    try:
        channel = await _open_stream(process.stdout, process.stdin)
    except RemoteError as exc:
        if exc.code == ErrorCode.CANNOT_START:  # no daemon could start, and dial-stdio says why
            raise cannot_start(host.label, exc.message) from None
        raise
    except (ProtocolError, ConnectionError, asyncssh.Error):
        process.stdin.write_eof()
        result = await process.wait()
        stderr = result.stderr if isinstance(result.stderr, bytes) else b""
        lines = stderr.decode(errors="replace").strip().splitlines()
        if result.exit_status == 127:
            message = f"tfrund was not found on {host.label} ({host.tfrund!r}): {fix_hint(host)}"
            raise TfrunError(message, EXIT_DAEMON) from None
        reason = lines[-1].removeprefix("tfrund: error: ") if lines else f"exit status {result.exit_status}"
        raise TfrunError(f"tfrund on {host.label} failed: {reason}", EXIT_DAEMON) from None
    return channel


async def run_command(conn: asyncssh.SSHClientConnection, command: RemoteCommand) -> tuple[int, str]:
    """(exit status, stdout) of a command on the box; for `hosts check`."""
    result = await conn.run(command.line, check=False, input=command.stdin, encoding=None)
    out = result.stdout.decode(errors="replace") if isinstance(result.stdout, bytes) else ""
    return int(result.exit_status or 0), out
