"""The connection keeper: one SSH connection per box, kept open between commands (like ControlPersist).

Every remote verb would otherwise pay for importing asyncssh and for an SSH handshake before saying a
word (about 0.4 s here). The first verb for a box starts a keeper in the background; the keeper holds
the SSH connection and listens on a Unix socket in a 0700 folder of this user's; each verb connects to
that socket and speaks the protocol straight through to the box's daemon, each connection on an SSH
channel of its own. The keeper exits after ten idle minutes, or as soon as its SSH connection drops:
the next verb starts a fresh one. TFRUN_SSH_PERSIST=0 turns it off.

A keeper serves only callers who would have opened the same connection themselves: its socket is named by
the box and by everything that decides whom the connection trusts and as whom it logs in (HOME, the local
user, the agent, accept-new, and what ~/.ssh holds). A caller whose known_hosts lacks the box's key, or
whose known_hosts changed since (`ssh-keygen -R`), gets a keeper of its own, which checks the key afresh.

    python -m tfrun.client.keeper HOST_JSON SOCKET [--accept-new-host-key]   (started by the client only)
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import fcntl
import getpass
import glob
import hashlib
import json
import os
import re
import shlex
import sys
import time
from pathlib import Path
from typing import Any, Optional

from tfrun.client.config import Host
from tfrun.client.errors import TfrunError
from tfrun.constants import EXIT_DAEMON
from tfrun.protocol.channel import Channel

IDLE_EXIT_S = 600.0
_START_TIMEOUT_S = 60.0


def enabled() -> bool:
    return os.environ.get("TFRUN_SSH_PERSIST", "1") not in ("0", "no", "false")


def socket_path(host: Host, accept_new: bool) -> Path:
    """Where the keeper for `host` listens, for this caller: short, per user, named by what identifies the
    daemon, by the way there (jump hosts, identity file) and by what decides trust (see `_trust`), so no caller
    rides a connection it could not open."""
    base = Path(os.environ.get("XDG_RUNTIME_DIR") or f"/tmp/tfrun-{os.getuid()}") / "keepers"
    login = [host.jump, host.identity_file and _fingerprint(Path(host.identity_file).expanduser())]
    key = json.dumps([host.identity, login, _trust(accept_new or host.accept_new_host_key)])
    digest = hashlib.sha256(key.encode()).hexdigest()[:20]
    return base / f"{digest}.sock"


# What asyncssh reads from ~/.ssh when no option says otherwise: the config, known_hosts, the CA bundle
# for X.509 host certificates, and the default identities with their certificates.
_KEY_NAMES = ("id_ed25519_sk", "id_ecdsa_sk", "id_ed448", "id_ed25519", "id_ecdsa", "id_rsa", "id_dsa")
_SSH_FILES = ("config", "known_hosts", "ca-bundle.crt", *_KEY_NAMES, *(f"{name}-cert.pub" for name in _KEY_NAMES))
# ssh_config keywords that name files deciding trust or identity, in any Host block (a superset is safe).
_FILE_KEYWORDS = {"include", "userknownhostsfile", "globalknownhostsfile", "identityfile", "certificatefile"}
_KEYWORD = re.compile(r"\s*([A-Za-z]+)\s*(?:=\s*|\s+)(.*)")
_FINGERPRINT_BYTES = 1 << 20  # bigger files (only a stray pattern names them) are told apart by their stat


def _trust(accept_new: bool) -> list[Any]:
    """Everything that decides whom a new SSH connection trusts and as whom it logs in, as this caller's
    asyncssh would read it: HOME, the local user, the agent, accept-new, and each file that can hold a host
    key or a login key, with a digest of its contents (a changed known_hosts must not ride an old connection)."""
    home = Path.home()
    try:
        user = getpass.getuser()
    except (KeyError, OSError):  # no name for this uid: asyncssh refuses to connect, and says so
        user = ""
    files = sorted({*(home / ".ssh" / name for name in _SSH_FILES), *_named_by_config(home)})
    fingerprints = [[str(path), _fingerprint(path)] for path in files]
    return [str(home), user, os.environ.get("SSH_AUTH_SOCK", ""), accept_new, fingerprints]


def _named_by_config(home: Path) -> set[Path]:
    """Files that ~/.ssh/config and what it includes name as known_hosts, identities or certificates.

    Host-dependent tokens (%h, %r, ...) become wildcards: every file they could name counts, a superset."""
    found: set[Path] = set()
    pending = [home / ".ssh" / "config"]
    while pending:
        config = pending.pop()
        found.add(config)
        try:
            lines = config.read_text(errors="replace").splitlines()
        except OSError:
            continue
        for line in lines:
            match = _KEYWORD.match(line)
            if not match or match[1].lower() not in _FILE_KEYWORDS:
                continue
            include = match[1].lower() == "include"
            for word in _words(match[2]):
                pattern = os.path.expandvars(word.replace("%d", str(home)).replace("%%", "%"))
                pattern = re.sub(r"%.", "*", os.path.expanduser(pattern))
                # A relative Include is under ~/.ssh; any other relative path, under the working directory.
                for name in glob.glob(str(home / ".ssh" / pattern) if include else pattern):
                    path = Path(name).absolute()
                    if include and path not in found:
                        pending.append(path)
                    found.add(path)
    return found


def _words(text: str) -> list[str]:
    """An ssh_config line's arguments, quoted as ssh_config quotes them."""
    try:
        return shlex.split(text)
    except ValueError:  # an unbalanced quote: ssh refuses the line, and so would asyncssh
        return []


def _fingerprint(path: Path) -> str:
    """A digest of the file's contents; its stat when big; why it cannot be read when it cannot (missing
    counts too: a known_hosts that appears changes what is trusted)."""
    try:
        info = path.stat()
        if info.st_size > _FINGERPRINT_BYTES:
            return f"{info.st_ino}:{info.st_size}:{info.st_mtime_ns}"
        return hashlib.sha256(path.read_bytes()).hexdigest()
    except OSError as exc:
        return f"errno {exc.errno}"


async def connect(host: Host, accept_new: bool, timeout: Optional[float] = None) -> Channel:
    """A channel to the box's daemon through its keeper, starting the keeper first if none answers. A keeper
    not ready within `timeout` seconds is killed: the thread that waits for it must end by then, since an
    event loop's end waits for its threads (a pool verb must not hang on a box that never answers)."""
    path = socket_path(host, accept_new)
    try:
        return await Channel.connect_unix(str(path))
    except (FileNotFoundError, ConnectionRefusedError):
        pass
    await asyncio.get_running_loop().run_in_executor(None, _start, host, accept_new, path, timeout)
    return await Channel.connect_unix(str(path))


def _start(host: Host, accept_new: bool, path: Path, timeout: Optional[float]) -> None:
    """Start a keeper and wait until it listens; racing clients serialise on a lock and start one."""
    import select
    import subprocess

    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    os.chmod(path.parent, 0o700)
    with open(path.with_suffix(".start"), "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if _answers(path):
            return
        # The path is handed over: the keeper's own view could differ (accept-new writes known_hosts).
        command = [sys.executable, "-m", "tfrun.client.keeper", json.dumps(dataclasses.asdict(host)), str(path)]
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
        if timeout is not None and not select.select([proc.stdout], [], [], timeout)[0]:
            proc.kill()
            proc.wait()
            raise TfrunError(f"no answer within {timeout:g}s", EXIT_DAEMON)
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


async def _main(host: Host, path: Path, accept_new: bool) -> None:
    from tfrun.client import ssh

    conn = await ssh.open_ssh(host, accept_new)
    channel, _ = await ssh.open_channel(conn, host)  # learns how to reach the daemon; reports a missing tfrund
    channel.close()
    path.unlink(missing_ok=True)  # a keeper that died: we hold the start lock, so it is stale
    await Keeper(host, conn).serve(path)


def main(argv: list[str]) -> None:
    host = Host(**json.loads(argv[1]))
    try:
        asyncio.run(_main(host, Path(argv[2]), "--accept-new-host-key" in argv[3:]))
    except TfrunError as exc:
        print(f"tfrun: error: {exc.message}", file=sys.stderr, flush=True)
        raise SystemExit(exc.exit_code) from None


if __name__ == "__main__":
    main(sys.argv)
