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
    return _hosts(incomplete, pools=False)


def hosts_and_pools(ctx: click.Context, param: click.Parameter, incomplete: str) -> list[CompletionItem]:
    """--host of a verb that takes a pool too (`ps`, `submit`, `top`, `alerts`, `notify-test`): the hosts,
    each pool with its members, and `all`."""
    return _hosts(incomplete, pools=True)


def _hosts(incomplete: str, pools: bool) -> list[CompletionItem]:
    try:
        cfg = config.load()
    except Exception:  # a broken config file is for the verb to report, not for a Tab press
        return []
    names = {config.LOCAL: "this machine", **{n: h.destination for n, h in cfg.hosts.items()}}
    if pools:
        named = {pool: "pool: " + " ".join(h.label for h in members) for pool, members in config.pools(cfg).items()}
        names.update({**named, config.ALL: "every host"})
    return [CompletionItem(name, help=where) for name, where in sorted(names.items()) if name.startswith(incomplete)]


def jobs(ctx: click.Context, param: click.Parameter, incomplete: str) -> list[CompletionItem]:
    """JOB: the ids of the jobs on the target the command line names (--host, TFRUN_HOST, the default host),
    newest first, each with its name and state; for `cancel`, only those that have not ended. A word that
    starts with a configured host's `HOST:` is an address: that host alone is asked (for at most the fleet
    timeout, whatever the command line's --host says) and its jobs are offered as HOST:ID."""
    target = ctx.find_object(Target) or Target()
    wait = COMPLETION_TIMEOUT_S
    prefix, sep, rest = incomplete.partition(":")
    if sep:
        try:
            from tfrun.client import fleet

            cfg = config.load()
            if prefix not in cfg.hosts and prefix != config.LOCAL:
                return []
            wait = fleet.timeout(cfg)
            target = Target(config.resolve(prefix, cfg), timeout=wait)
        except Exception:  # a broken config or timeout is for the verb to report
            return []
        incomplete, prefix = rest, f"{prefix}:"
    unfinished = ctx.command.name == "cancel"
    found: JobList | None = None
    with contextlib.suppress(Exception):  # unreachable, slow, refused: offer nothing, say nothing
        found = asyncio.run(asyncio.wait_for(_list(target, not unfinished), wait))
    if found is None:
        return []
    head = prefix if sep else ""
    items = []
    for job in sorted(found.jobs, key=lambda j: j.id, reverse=True):
        if str(job.id).startswith(incomplete):
            items.append(CompletionItem(f"{head}{job.id}", help=f"{job.name or '-'} {job.state}"))
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
