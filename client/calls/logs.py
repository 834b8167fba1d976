"""Calls on a job's output (tfrun/protocol/logs.py) that are not a follow: the command that attaches to it."""

from __future__ import annotations

import os

from tfrun.constants import EXIT_DAEMON
from tfrun.protocol.logs import Attach, AttachReply

from ..errors import TfrunError
from . import Call


def attach_command(ref: str) -> Call[AttachReply, list[str]]:
    """The command that opens a `--tty` job's tmux session, to run on the box."""
    return Call(Attach(job=ref), _tmux_attach)


def _tmux_attach(reply: AttachReply) -> list[str]:
    """The reply's command, if it is what tfrund sends (`tmux -S SOCKET attach-session -t SESSION`): the client
    runs it as the user, so nothing else a daemon names is run, whatever answered."""
    command = reply.command
    if (
        len(command) == 6
        and command[:2] == ["tmux", "-S"]
        and os.path.isabs(command[2])
        and command[3:5] == ["attach-session", "-t"]
        and not command[5].startswith("-")
    ):
        return command
    raise TfrunError(f"tfrund answered attach with a command tfrun does not run: {command[:6]!r}", EXIT_DAEMON)
