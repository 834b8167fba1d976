"""Shell completion (`tfrun completion bash|zsh|fish`): click's machinery, plus what only tfrun knows.

click completes verbs and options itself; these functions add the words it cannot guess: job ids (asked
of the daemon the command line points at), host names (from the client's config) and files for SCRIPT.
A completion runs on every Tab press, so each is quick and silent: a daemon that is not running is not
started, one that does not answer within COMPLETION_TIMEOUT_S offers nothing, and no error is ever shown.
"""

from __future__ import annotations

import asyncio
import contextlib

import click
from click.shell_completion import CompletionItem, get_completion_class

from tfrun.client import config
from tfrun.client.connection import Target
from tfrun.constants import COMPLETION_TIMEOUT_S
from tfrun.paths import Layout
from tfrun.protocol.channel import Channel
from tfrun.protocol.jobs import JobList, ListJobs

SHELLS = ("bash", "zsh", "fish")
COMPLETE_VAR = "_TFRUN_COMPLETE"  # what click's scripts set to ask `tfrun` for completions


def script(group: click.Command, shell: str) -> str:
    """The completion script for `shell`, the same that `_TFRUN_COMPLETE={shell}_source tfrun` prints."""
    completer = get_completion_class(shell)
    assert completer is not None, shell  # SHELLS are click's own
    return completer(group, {}, "tfrun", COMPLETE_VAR).source()


def files(ctx: click.Context, param: click.Parameter, incomplete: str) -> list[CompletionItem]:
    """SCRIPT: let the shell complete file names, as it would for `python`."""
    return [CompletionItem(incomplete, type="file")]


def hosts(ctx: click.Context, param: click.Parameter, incomplete: str) -> list[CompletionItem]:
    """--host: the configured hosts, and `local` for the daemon on this machine."""
    try:
        cfg = config.load()
    except Exception:  # a broken config file is for the verb to report, not for a Tab press
        return []
    names = {config.LOCAL: "this machine", **{n: h.destination for n, h in cfg.hosts.items()}}
    return [CompletionItem(name, help=where) for name, where in sorted(names.items()) if name.startswith(incomplete)]


def jobs(ctx: click.Context, param: click.Parameter, incomplete: str) -> list[CompletionItem]:
    """JOB: the ids of the jobs on the target the command line names (--host, TFRUN_HOST, the default host),
    newest first, each with its name and state; for `cancel`, only those that have not ended."""
    target = ctx.find_object(Target) or Target()
    unfinished = ctx.command.name == "cancel"
    found: JobList | None = None
    with contextlib.suppress(Exception):  # unreachable, slow, refused: offer nothing, say nothing
        found = asyncio.run(asyncio.wait_for(_list(target, not unfinished), COMPLETION_TIMEOUT_S))
    if found is None:
        return []
    items = []
    for job in sorted(found.jobs, key=lambda j: j.id, reverse=True):
        if str(job.id).startswith(incomplete):
            items.append(CompletionItem(str(job.id), help=f"{job.name or '-'} {job.state}"))
    return items


async def _list(target: Target, every: bool) -> JobList:
    """The job list, from a daemon that is already running: completing must never start one."""
    if target.local:
        channel = await Channel.connect_unix(str(Layout.from_env().socket))
    else:
        channel = await target.connect()
    try:
        return await channel.ask(ListJobs(all=every))
    finally:
        channel.close()
