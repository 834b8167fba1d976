"""`tfrund`: the daemon's own commands (run, start, stop, status, doctor, dial-stdio)."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import fcntl
import json
import logging
import os
import select
import signal
import socket
import subprocess
import sys
import threading
import time
from typing import Any, NoReturn, Optional

import click

from tfrun import __version__
from tfrun.constants import DAEMON_START_TIMEOUT_S, EXIT_FAILURE, EXIT_OK, HELLO_WAIT_S, MAX_HEADER_BYTES, SAFE_PATH
from tfrun.paths import Layout
from tfrun.private import NotPrivate, check_peer
from tfrun.protocol.admin import DaemonInfo, DaemonStatus, Shutdown
from tfrun.protocol.channel import Channel, RemoteError
from tfrun.protocol.fields import ErrorCode
from tfrun.protocol.wire import Error, Message, Ok, ProtocolError, encode
from tfrun.usage import OneLineUsageGroup

from . import limits
from .config.settings import Config, ConfigError
from .daemon import Daemon
from .home import (
    AlreadyRunning,
    DaemonError,
    acquire_lock,
    install_job_pythonpath,
    install_shim_pythonpath,
    keep_private,
    lock_holder,
    prepare_dirs,
    tighten_home,
)
from .records.store import Store, StoreError


def _fail(message: str, code: int = EXIT_FAILURE) -> NoReturn:
    click.echo(f"tfrund: error: {message}", err=True)
    sys.exit(code)


@click.group(cls=OneLineUsageGroup, prog="tfrund", context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="tfrund")
def main() -> None:
    """tfrund, the tfrun daemon: runs jobs that outlive it, serves `tfrun` on a Unix socket.

    Its state lives in TFRUN_HOME (default: $XDG_STATE_HOME/tfrun, i.e. ~/.local/state/tfrun): the
    SQLite job store, one folder per job, the socket (in a 0700 folder) and its log. You rarely call it
    yourself: `tfrun` starts it on demand, and in the container its entrypoint runs `tfrund run`.
    """


@main.command()
def run() -> None:
    """Run the daemon in the foreground (for supervisors and containers); Ctrl-C or SIGTERM stops it,
    SIGHUP reads its config.toml again (as `tfrun config reload` does).

    Jobs keep running when it stops; the next daemon re-adopts them.
    """
    keep_private()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s tfrund[%(process)d] %(levelname)s %(message)s")
    limits.bound_the_log()
    was, now = limits.raise_descriptor_limit()
    if now != was:
        logging.getLogger("tfrund").info("open files: the soft limit raised from %d to %d", was, now)
    layout = Layout.from_env()
    try:
        prepare_dirs(layout)
        lock = acquire_lock(layout)
        tighten_home(layout)  # holding the lock: one daemon walks the home, and logs what it changed once
        config = Config.load(layout)
        store = Store(layout.database, layout.jobs_dir)
        layout.jobs_dir.mkdir(exist_ok=True)
        install_job_pythonpath(layout)
        install_shim_pythonpath(layout)
    except AlreadyRunning as exc:
        _fail(str(exc))
    except (DaemonError, StoreError, ConfigError) as exc:
        _fail(str(exc))
    except OSError as exc:
        _fail(f"{exc.filename or layout.home}: {exc.strerror or exc}")
    try:
        asyncio.run(Daemon(layout, config, store, lock).serve())
    finally:
        store.close()
        lock.close()


@main.command()
@click.option("-q", "--quiet", is_flag=True, help="Print nothing on success.")
def start(quiet: bool) -> None:
    """Start the daemon in the background and return once it accepts connections.

    Does nothing if one already runs for this TFRUN_HOME. Clients that race to start it get one daemon.
    """
    try:
        pid = ensure_started(Layout.from_env())
    except DaemonError as exc:
        _fail(str(exc))
    if not quiet:
        click.echo(f"tfrund running (pid {pid})")


def ensure_started(layout: Layout) -> int:
    """The pid of this home's daemon, started now if none answers; DaemonError says why none could start."""
    try:
        prepare_dirs(layout)
    except OSError as exc:
        raise DaemonError(str(exc)) from None
    with open(layout.start_lock, "a", opener=_private) as start_lock:
        fcntl.flock(start_lock, fcntl.LOCK_EX)  # released when the file closes, even if we crash
        info = _status(layout)
        if info is not None:
            return info.pid
        with open(layout.daemon_log, "ab", opener=_private) as daemon_log:
            log_offset = daemon_log.tell()
            proc = subprocess.Popen(
                [sys.executable, *SAFE_PATH, "-m", "tfrun.runner", "run"],
                stdin=subprocess.DEVNULL,
                stdout=daemon_log,
                stderr=daemon_log,
                start_new_session=True,
                cwd="/",
            )
        deadline = time.monotonic() + DAEMON_START_TIMEOUT_S
        while time.monotonic() < deadline:
            info = _status(layout)
            if info is not None:
                return info.pid
            if proc.poll() is not None:
                raise DaemonError(_last_error(layout, log_offset) or f"tfrund exited with code {proc.returncode}")
            time.sleep(0.05)
        raise DaemonError(f"tfrund did not answer within {DAEMON_START_TIMEOUT_S:g}s; see {layout.daemon_log}")


def _private(path: str, flags: int) -> int:
    """Open as 0600: made here, in the caller's process, before the daemon's own umask 077 applies."""
    return os.open(path, flags, 0o600)


def _last_error(layout: Layout, offset: int) -> Optional[str]:
    """The daemon's own error line, from what it wrote to its log since `offset`."""
    try:
        with open(layout.daemon_log, "rb") as f:
            f.seek(offset)
            lines = f.read().decode(errors="replace").splitlines()
    except OSError:
        return None
    for line in reversed(lines):
        if line.startswith("tfrund: error: "):
            return line[len("tfrund: error: ") :]
    return lines[-1] if lines else None


async def _ask(layout: Layout, msg: Message) -> Message:
    channel = await Channel.connect_unix(str(layout.socket))
    try:
        return await channel.request(msg)
    finally:
        channel.close()


def _status(layout: Layout) -> Optional[DaemonInfo]:
    """The running daemon's status, or None if none answers on the socket."""
    try:
        reply = asyncio.run(_ask(layout, DaemonStatus()))
    except (OSError, ProtocolError):
        return None
    except RemoteError as exc:
        _fail(exc.message)
    except NotPrivate as exc:  # another user's socket at the daemon's place: told nothing, and named
        _fail(exc.message)
    return reply if isinstance(reply, DaemonInfo) else None


@main.command()
@click.option("--json", "as_json", is_flag=True, help="Print a JSON object instead of text.")
def status(as_json: bool) -> None:
    """Say whether the daemon runs: pid, socket, version, jobs by state. Exit code 1 if it does not."""
    layout = Layout.from_env()
    info = _status(layout)
    if info is None:
        if as_json:
            click.echo(json.dumps({"running": False, "home": str(layout.home), "socket": str(layout.socket)}))
        else:
            click.echo(f"tfrund is not running (home {layout.home})")
        sys.exit(EXIT_FAILURE)
    record: dict[str, Any] = {
        "running": True,
        "pid": info.pid,
        "version": info.version,
        "protocol": info.protocol,
        "home": info.home,
        "socket": info.socket,
        "started_at": info.started_at,
        "jobs": info.jobs,
    }
    if as_json:
        click.echo(json.dumps(record))
        return
    counts = ", ".join(f"{n} {state}" for state, n in info.jobs.items() if n) or "no jobs"
    click.echo(f"tfrund {info.version} running, pid {info.pid}, protocol {info.protocol}")
    click.echo(f"home:   {info.home}\nsocket: {info.socket}\njobs:   {counts}")


@main.command()
@click.option("--timeout", default=10.0, show_default=True, help="Seconds to wait before sending SIGTERM.")
def stop(timeout: float) -> None:
    """Stop the daemon. Running jobs keep running; the next daemon re-adopts them."""
    layout = Layout.from_env()
    pid = lock_holder(layout)
    if pid is None:
        click.echo("tfrund is not running")
        return
    try:
        reply = asyncio.run(_ask(layout, Shutdown()))
        if isinstance(reply, Ok):
            click.echo(reply.message)
    except (OSError, ProtocolError, RemoteError):
        os.kill(pid, signal.SIGTERM)  # the socket is gone or garbled: the lock still names the daemon
    deadline = time.monotonic() + timeout
    while lock_holder(layout) is not None:
        if time.monotonic() > deadline:
            os.kill(pid, signal.SIGTERM)
            deadline = time.monotonic() + timeout
        time.sleep(0.05)
    sys.exit(EXIT_OK)


@main.command()
@click.option("--python", metavar="PATH", help="Check this job interpreter (default: the one jobs get).")
@click.option("--json", "as_json", is_flag=True, help="Print the checks as a JSON list.")
def doctor(python: Optional[str], as_json: bool) -> None:
    """Check this box for training: the job interpreter and its TensorFlow (CUDA build, GPUs, memory
    growth), the NVIDIA driver, the checkpoint root, and object storage where [storage] names it. Works with
    or without a running daemon; exits 1 if any check fails (a warning is not a failure: a CPU-only box is
    allowed)."""
    from .doctor import FAIL, job_python, run_checks

    try:
        config = Config.load(Layout.from_env())
    except ConfigError as exc:
        _fail(str(exc))
    checks = run_checks(config.checkpoint_root, python or job_python(config.job_python), config.checkpoints_to)
    if as_json:
        click.echo(json.dumps([dataclasses.asdict(check) for check in checks], indent=2))
    else:
        for check in checks:
            advice = f"; {check.advice}" if check.advice else ""
            click.echo(f"{check.status:<4}  {check.name}: {check.detail}{advice}")
    sys.exit(EXIT_FAILURE if any(check.status == FAIL for check in checks) else EXIT_OK)


@main.command("dial-stdio")
def dial_stdio() -> None:
    """Bridge stdin and stdout to the daemon's socket, starting the daemon if needed.

    For clients that reach the box by running a command over SSH when socket forwarding is refused.
    """
    layout = Layout.from_env()
    try:
        ensure_started(layout)
    except DaemonError as exc:
        _refuse(str(exc))
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        sock.connect(str(layout.socket))
        check_peer(sock, str(layout.socket))  # the SSH client's bytes (code, env) go to its own user's daemon alone
    except OSError as exc:
        _fail(f"cannot connect to {layout.socket}: {exc.strerror or exc}")
    except NotPrivate as exc:
        _fail(exc.message)

    def upstream() -> None:
        try:
            while data := os.read(0, 1 << 16):
                sock.sendall(data)
            sock.shutdown(socket.SHUT_WR)
        except OSError:
            pass  # the daemon hung up; the main thread sees it and exits

    threading.Thread(target=upstream, daemon=True).start()
    try:
        while data := sock.recv(1 << 16):
            view = memoryview(data)
            while view:
                view = view[os.write(1, view) :]
    except OSError:
        pass  # whoever reads our stdout went away
    sys.exit(EXIT_OK)


def _refuse(reason: str) -> NoReturn:
    """Tell the client at the other end of stdin and stdout why no daemon could start, in the protocol: an
    `Error` in answer to its hello reaches it through whatever carries the bytes (an SSH exec channel, the
    client's connection keeper), where a bare exit reads as a connection closed for no reason. On stderr
    too, for a person who runs dial-stdio by hand."""
    click.echo(f"tfrund: error: {reason}", err=True)
    with contextlib.suppress(OSError):
        _skip_line(0)
        frame = memoryview(encode(Error(ErrorCode.CANNOT_START, reason)))
        while frame:
            frame = frame[os.write(1, frame) :]
    sys.exit(EXIT_FAILURE)


def _skip_line(fd: int) -> None:
    """Read the client's hello (one line), so that the answer follows it as the protocol has it."""
    deadline = time.monotonic() + HELLO_WAIT_S
    seen = 0
    while seen <= MAX_HEADER_BYTES:
        ready, _, _ = select.select([fd], [], [], max(0.0, deadline - time.monotonic()))
        data = os.read(fd, 1 << 16) if ready else b""
        if not data or b"\n" in data:
            return
        seen += len(data)
