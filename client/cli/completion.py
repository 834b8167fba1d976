"""Shell completion (`tfrun completion bash|zsh|fish`): click's machinery, plus what only tfrun knows.

click completes verbs and options itself; these functions add the words it cannot guess: job ids (asked
of the daemon the command line points at), host names (from the client's config) and files for SCRIPT.
A completion runs on every Tab press, so each is quick and silent: a daemon that is not running is not
started, one that does not answer within COMPLETION_TIMEOUT_S offers nothing, and no error is ever shown.

bash splits words at a colon (it is in COMP_WORDBREAKS), so click's own bash script hands `tfrun logs box2:3`
over as the words `box2`, `:`, `3`, and a job address never completes. `Bash` reads the line up to the cursor
instead, and answers with what follows the word's last colon, the part bash replaces.
"""

from __future__ import annotations

import asyncio
import contextlib
import os

import click
from click.shell_completion import BashComplete, CompletionItem, add_completion_class, get_completion_class

try:
    from click.shell_completion import split_arg_string
except ImportError:  # click 8.1, the last for Python 3.9
    from click.parser import split_arg_string  # type: ignore[no-redef]

from tfrun.constants import COMPLETE_VAR, COMPLETION_TIMEOUT_S
from tfrun.numerals import is_digits
from tfrun.paths import Layout
from tfrun.protocol.channel import Channel
from tfrun.protocol.jobs import JobList

from ..calls import jobs as job_calls
from ..config import settings as config
from ..link.connection import Target

SHELLS = ("bash", "zsh", "fish")

# click's bash script, passing bash's line, cursor and word breaks too (Bash below reads them).
_BASH_SCRIPT = """\
%(complete_func)s() {
    local IFS=$'\\n'
    local response

    response=$(env COMP_WORDS="${COMP_WORDS[*]}" COMP_CWORD=$COMP_CWORD COMP_LINE="$COMP_LINE" \\
        COMP_POINT=$COMP_POINT COMP_WORDBREAKS="$COMP_WORDBREAKS" %(complete_var)s=bash_complete $1)

    for completion in $response; do
        IFS=',' read type value <<< "$completion"

        if [[ $type == 'dir' ]]; then
            COMPREPLY=()
            compopt -o dirnames
        elif [[ $type == 'file' ]]; then
            COMPREPLY=()
            compopt -o default
        elif [[ $type == 'plain' ]]; then
            COMPREPLY+=($value)
        fi
    done

    return 0
}

%(complete_func)s_setup() {
    complete -o nosort -F %(complete_func)s %(prog_name)s
}

%(complete_func)s_setup;
"""


class Bash(BashComplete):
    """click's bash completion, with words that hold a colon (job addresses, HOST:ID) kept whole."""

    source_template = _BASH_SCRIPT
    cut = ""  # the incomplete word up to its last colon: bash has it already, and replaces only the rest

    def get_completion_args(self) -> tuple[list[str], str]:
        """The words before the cursor and the one under it, split as the shell would (quotes, escapes) but
        not at colons; click's way (COMP_WORDS) where bash gave no line (an older script)."""
        line = os.environ.get("COMP_LINE", "")
        if not line:
            return super().get_completion_args()
        point = os.environ.get("COMP_POINT", "")
        before = line[: int(point)] if is_digits(point) else line
        words = split_arg_string(before)
        starts_a_word = not words or len(split_arg_string(before + "_")) > len(words)
        incomplete = "" if starts_a_word else words.pop()
        if ":" in incomplete and ":" in os.environ.get("COMP_WORDBREAKS", ":"):
            self.cut = incomplete[: incomplete.rindex(":") + 1]
        return words[1:], incomplete

    def format_completion(self, item: CompletionItem) -> str:
        value = item.value
        if item.type == "plain" and self.cut and value.startswith(self.cut):
            value = value[len(self.cut) :]
        return f"{item.type},{value}"


def register() -> None:
    """Make `Bash` click's bash completion: for the Tab press being answered, and the script printed."""
    add_completion_class(Bash)


def script(group: click.Command, shell: str) -> str:
    """The completion script for `shell`, the same that `_TFRUN_COMPLETE={shell}_source tfrun` prints."""
    register()
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
        names.update({**named, config.ALL_HOSTS: "every host"})
    return [CompletionItem(name, help=where) for name, where in sorted(names.items()) if name.startswith(incomplete)]


def jobs(ctx: click.Context, param: click.Parameter, incomplete: str) -> list[CompletionItem]:
    """JOB: the ids of the jobs on the target the command line names (--host, TFRUN_HOST, the default host),
    newest first, each with its name and state; for `cancel`, only those that have not ended. A word that
    starts with a configured host's `HOST:` is an address: that host alone is asked (for at most the pool
    timeout, whatever the command line's --host says) and its jobs are offered as HOST:ID."""
    target = ctx.find_object(Target) or Target()
    wait = COMPLETION_TIMEOUT_S
    prefix, sep, rest = incomplete.partition(":")
    if sep:
        try:
            from ..pools.members import member_wait

            cfg = config.load()
            if prefix not in cfg.hosts and prefix != config.LOCAL:
                return []
            wait = member_wait(cfg)
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
        return await job_calls.job_list(all=every).on(channel)
    finally:
        channel.close()
