"""`tfrun attach`: this terminal on a `--tty` job's tmux session, on this machine or on a box over SSH.

Locally tmux itself takes over (exec). On a box, an SSH session with a pseudo-terminal runs tmux there;
this terminal is put in raw mode, every key goes to the box as it is typed, the session's output comes
back as it is, and a resized window is passed on. tmux's own keys work as usual: Ctrl-b d detaches and
leaves the job running.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shlex
import signal
import sys
import termios
import tty
from collections.abc import Iterator

from tfrun.constants import EXIT_USAGE

from ..config.settings import Host
from ..errors import TfrunError


def attach_here(command: list[str]) -> None:
    """Replace this process with tmux attached to the session (the job runs on this machine)."""
    try:
        os.execvp(command[0], command)
    except OSError as exc:
        raise TfrunError(f"cannot run {command[0]}: {exc.strerror}", EXIT_USAGE) from None


async def attach_remote(host: Host, accept_new: bool, command: list[str]) -> int:
    """Run `command` on the box in a pseudo-terminal wired to this one; its exit code once it ends."""
    from ..link import ssh

    if not os.isatty(sys.stdin.fileno()):
        raise TfrunError("tfrun attach needs a terminal (stdin is not one)", EXIT_USAGE)
    conn = await ssh.open_ssh(host, accept_new)
    try:
        columns, lines = os.get_terminal_size(sys.stdin.fileno())
        process = await conn.create_process(
            shlex.join(command),
            term_type=os.environ.get("TERM", "xterm-256color"),
            term_size=(columns, lines),
            encoding=None,
        )
        loop = asyncio.get_running_loop()
        stdin = sys.stdin.fileno()

        def typed() -> None:
            data = os.read(stdin, 4096)
            if data:
                process.stdin.write(data)

        def resized() -> None:
            process.change_terminal_size(*os.get_terminal_size(stdin))

        with _raw(stdin):
            loop.add_reader(stdin, typed)
            loop.add_signal_handler(signal.SIGWINCH, resized)
            try:
                while True:
                    data = await process.stdout.read(65536)
                    if not data:
                        break
                    os.write(sys.stdout.fileno(), data)
                await process.wait()
            finally:
                loop.remove_reader(stdin)
                loop.remove_signal_handler(signal.SIGWINCH)
        return process.exit_status or 0
    finally:
        conn.close()


@contextlib.contextmanager
def _raw(fd: int) -> Iterator[None]:
    """Raw mode while the block runs: keys (Ctrl-C and Ctrl-b too) go to the box, not to this process."""
    saved = termios.tcgetattr(fd)
    tty.setraw(fd)
    try:
        yield
    finally:
        termios.tcsetattr(fd, termios.TCSADRAIN, saved)
