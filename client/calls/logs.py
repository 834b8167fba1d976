"""Calls on a job's output (tfrun/protocol/logs.py) that are not a follow: the command that attaches to it."""

from __future__ import annotations

from tfrun.client.calls import Call
from tfrun.protocol.logs import Attach, AttachReply


def attach_command(ref: str) -> Call[AttachReply, list[str]]:
    """The command that opens a `--tty` job's tmux session, to run on the box."""
    return Call(Attach(job=ref), lambda reply: reply.command)
