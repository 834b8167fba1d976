"""`tfrun`: the top group, and what every verb shares: --host, one-line errors and exit codes, the output.

Users type these verbs all day, so a verb imports only what it needs, when it runs: this module imports
click and nothing heavy, `tfrun --help` lists the verbs from client/cli/verbs/'s table without importing any
verb's module, and a verb module imports the protocol, the API and rich as its verbs need them; a request
to a daemon up on this machine goes over a plain socket, without asyncio (see `call`). tests/test_imports.py
holds each verb to it, and bench/cli_start.py measures the time.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Coroutine
from typing import TYPE_CHECKING, Any, Callable, NoReturn, Optional, TypeVar

import click

from tfrun import __version__
from tfrun.constants import (
    EXIT_DAEMON,
    EXIT_FAILURE,
    EXIT_LOST,
    EXIT_NO_SUCH_JOB,
    EXIT_OK,
    EXIT_USAGE,
    SIGNAL_EXIT_BASE,
)

from ..errors import TfrunError, remote_exit
from .verbs import VerbGroup

if TYPE_CHECKING:
    from click.shell_completion import CompletionItem
    from rich.console import Console

    from tfrun.protocol.wire import Message

    from ..calls import Call
    from ..library.api import AsyncClient
    from ..link.connection import Target
    from ..link.syncchannel import SyncChannel
    from ..views.styled import Output

T = TypeVar("T")
M = TypeVar("M", bound="Message")

EXIT_CODES_HELP = f"""\b
Exit codes:
  wait, logs -f, submit -f   the job's own exit code; 128+N if a signal N killed it; {EXIT_LOST} if lost
  {EXIT_OK}                          success
  {EXIT_FAILURE}                          the verb could not do all it was asked (e.g. cancel of an ended job)
  {EXIT_USAGE}                          bad usage or bad input (missing script, bad --env, invalid name)
  {EXIT_NO_SUCH_JOB}                          no such job
  {EXIT_DAEMON}                        tfrund cannot be reached or started, or speaks another protocol
"""

COLOR_CHOICES = ("auto", "always", "never")
_COLOR = "tfrun.color"  # where the main group leaves --color for the verbs (click's meta is shared by all)


# -- what every verb shares ---------------------------------------------------------------------------------


def fail(message: str, code: int) -> NoReturn:
    click.echo(f"tfrun: error: {message}", err=True)
    sys.exit(code)


class StdoutClosed(Exception):
    """Whoever reads our output went away."""


def guarded(action: Callable[[], T]) -> T:
    """Run one verb's conversation with the daemon; every failure becomes one line and an exit code."""
    from tfrun.private import NotPrivate
    from tfrun.protocol.channel import RemoteError
    from tfrun.protocol.wire import ProtocolError

    try:
        return action()
    except TfrunError as exc:
        fail(exc.message, exc.exit_code)
    except NotPrivate as exc:  # a socket or its folder another user could have made (tfrun/private.py)
        fail(exc.message, EXIT_DAEMON)
    except RemoteError as exc:  # "no job" names the box (client/library/api.py's NoSuchJob)
        fail(exc.message, remote_exit(exc.code))
    except ProtocolError as exc:
        fail(f"talking to tfrund failed: {exc}", EXIT_DAEMON)
    except StdoutClosed:
        # Our reader (e.g. `| head`) went away: stop quietly, as `cat` would.
        sys.stderr.close()
        sys.exit(SIGNAL_EXIT_BASE + 13)
    except ConnectionError as exc:
        fail(f"lost the connection to tfrund: {exc.strerror or exc}", EXIT_DAEMON)
    except KeyboardInterrupt:
        sys.exit(SIGNAL_EXIT_BASE + 2)
    except Exception as exc:  # a bug of ours: still one line, with the way to see the whole story
        if os.environ.get("TFRUN_DEBUG"):
            raise
        fail(f"unexpected {type(exc).__name__}: {exc} (set TFRUN_DEBUG=1 to see where)", EXIT_DAEMON)


def run(coro: Coroutine[Any, Any, T]) -> T:
    """`guarded`, for a conversation through the API (client/library/api.py) on an event loop of its own."""
    import asyncio

    return guarded(lambda: asyncio.run(coro))


def reached(conversation: Callable[[], Coroutine[Any, Any, T]]) -> tuple[Optional[T], str]:
    """`run` for a verb that has somewhere else to look (a job's stored folder) when the box cannot be reached:
    the result, or None and why the box did not answer; any other failure ends the verb as `run`'s does."""
    import asyncio

    def attempt() -> tuple[Optional[T], str]:
        try:
            return asyncio.run(conversation()), ""
        except TfrunError as exc:
            if exc.exit_code != EXIT_DAEMON:
                raise
            return None, exc.message

    return guarded(attempt)


def box_name() -> str:
    """The verb's box as a job address names it: a configured host's name, or "local"."""
    where = target()
    return where.host.label if where.host else "local"


def target() -> Target:
    """Where this verb's requests go, as its --host options said (see `host_options`)."""
    from ..link.connection import Target

    found = click.get_current_context().find_object(Target)
    return found if found is not None else Target()


def place(full: bool = False) -> str:
    """Where this verb acts, in words: `box`, with `full` `box (alice@gpu-box)`, or `this machine`. `ps` and
    every "no job" error say it, because after `hosts add` a bare `tfrun ps` quietly means the box."""
    return target().place(full)


def client() -> AsyncClient:
    """The API (client/library/api.py) on the daemon this verb's --host names."""
    from ..library.api import AsyncClient

    return AsyncClient(target(), say=lambda line: click.echo(f"tfrun: {line}", err=True))


def call(asked: Call[M, T]) -> T:
    """One call (client/calls/) to the daemon, and what its caller wants of the reply. A daemon up on this
    machine is asked over a plain socket (client/link/syncchannel.py: no asyncio to import); else the API asks,
    starting the local daemon or crossing SSH."""
    where = target()
    channel = guarded(running_daemon) if where.local else None
    if channel is not None:
        return guarded(lambda: on_running_daemon(channel, where, lambda: asked.result(channel.ask(asked.request))))
    return run(client().call(asked))


def each(asked: Call[M, T], take: Callable[[T], bool]) -> None:
    """`call`, for a request answered in parts (`ps --json`): `take` gets each part as it comes and says
    whether more follow."""

    def part(reply: M) -> bool:
        return take(asked.result(reply))

    where = target()
    channel = guarded(running_daemon) if where.local else None
    if channel is not None:
        guarded(lambda: on_running_daemon(channel, where, lambda: channel.each(asked.request, part)))
    else:
        run(client().each(asked, take))


def running_daemon() -> Optional[SyncChannel]:
    """A plain-socket channel to the daemon up on this machine, or None when none is (the API's way starts one)."""
    from tfrun.paths import Layout
    from tfrun.protocol.wire import ConnectionClosed

    from ..link.syncchannel import SyncChannel

    try:
        return SyncChannel.connect(str(Layout.from_env().socket))
    except (FileNotFoundError, ConnectionError, ConnectionClosed):  # none, or one that died in the hello
        return None


def on_running_daemon(channel: SyncChannel, where: Target, action: Callable[[], T]) -> T:
    """`action()`'s conversation on `channel`, closed after; a "no job" error says where, as client/library/api.py's
    NoSuchJob does."""
    from tfrun.protocol.channel import RemoteError
    from tfrun.protocol.fields import ErrorCode

    try:
        return action()
    except RemoteError as exc:
        if exc.code != ErrorCode.NO_SUCH_JOB:
            raise
        raise RemoteError(exc.code, f"{exc.message} on {where.place()}") from None
    finally:
        channel.close()


R = TypeVar("R", str, "tuple[str, ...]")


def job_refs(refs: R) -> R:
    """JOB (a str) or JOB... (a tuple) as given, once each can name a job; else a usage error in the words
    typed. A job's name is UTF-8 text of at most MAX_NAME characters and an id is digits, so a reference of
    other bytes (`status $'job\\xff'`) or longer names none: said here, as the daemon's refusal would name
    its request's field (`get.job: not UTF-8 text`), which the user never typed. A storage URL passes, for the
    verbs that read one (checkpoints, pull, restart); the others send it as a name, which finds no job."""
    from tfrun.constants import MAX_NAME, MAX_STORAGE_URL
    from tfrun.shorten import shorten

    for ref in (refs,) if isinstance(refs, str) else refs:
        try:
            ref.encode("utf-8")
        except UnicodeEncodeError:
            fail(f"not a job id or name: {typed(ref)} (not UTF-8 text)", EXIT_USAGE)
        if "://" in ref and len(ref) <= MAX_STORAGE_URL:
            continue  # a job's stored folder (s3://...), which the verbs that take one read as such
        if len(ref) > MAX_NAME:
            fail(f"not a job id or name: {typed(shorten(ref, 40))} (longer than {MAX_NAME} characters)", EXIT_USAGE)
    return refs


def typed(text: str) -> str:
    """`text`, an argument as Python read it (bytes that are not UTF-8 as surrogate escapes), quoted as the
    user typed it: 'job\\xff', not 'job\\udcff'."""
    return "'" + "".join(map(_typed_char, text)) + "'"


def _typed_char(c: str) -> str:
    if "\udc80" <= c <= "\udcff":
        return f"\\x{ord(c) - 0xDC00:02x}"
    return c if c.isprintable() else repr(c)[1:-1]


Completer = Callable[[click.Context, click.Parameter, str], "list[CompletionItem]"]


def _completer(name: str) -> Completer:
    """client/cli/completion.py's NAME, imported on a Tab press only: it may ask a daemon, which a verb's
    start must not pay for."""

    def complete(ctx: click.Context, param: click.Parameter, incomplete: str) -> list[CompletionItem]:
        from . import completion

        found: Completer = getattr(completion, name)
        return found(ctx, param, incomplete)

    return complete


complete_jobs = _completer("jobs")
complete_hosts = _completer("hosts")
complete_hosts_and_pools = _completer("hosts_and_pools")
complete_files = _completer("files")


def parse_env(pairs: tuple[str, ...]) -> dict[str, str]:
    """--env NAME=VALUE pairs (submit's, hosts add's) as a dict; a usage error names the one that is not.

    A bare NAME takes its value from this command's environment, as `docker run -e NAME` does: a token
    given so is never on tfrun's command line, which every user of the machine can read (`ps`)."""
    env: dict[str, str] = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not key or "\0" in pair:
            raise click.BadParameter(f"{pair!r} is not NAME=VALUE or NAME", param_hint="--env")
        if not sep:
            if key not in os.environ:
                raise click.BadParameter(f"{key} is not set here (--env {key} takes its value from your "
                                         f"environment; or give --env {key}=VALUE)", param_hint="--env")  # fmt: skip
            value = os.environ[key]
        env[key] = value
    return env


def lines_of(source: str, option: str) -> list[str]:
    """The values in file `source` (`-`: stdin), one a line, blank lines and # comments left out: a notify
    URL given so is on no command line. Unreadable, or holding no value, is a usage error naming `option`."""
    try:
        if source == "-":
            text = sys.stdin.read()
        else:
            with open(source, encoding="utf-8") as file:
                text = file.read()
    except (OSError, UnicodeDecodeError) as exc:
        why = getattr(exc, "strerror", None) or exc
        raise click.BadParameter(f"cannot read {source}: {why}", param_hint=option) from None
    values = [line.strip() for line in text.splitlines() if line.strip() and not line.lstrip().startswith("#")]
    if not values:
        raise click.BadParameter(f"{'stdin' if source == '-' else source} holds no value", param_hint=option)
    return values


def job_exit_code(state: str, exit_code: Optional[int]) -> int:
    """What `wait` and `logs -f` exit with: the job's code, as a shell would report it."""
    from tfrun.protocol.fields import JobState

    if state == JobState.LOST:
        return EXIT_LOST
    if exit_code is not None:
        return exit_code
    return EXIT_OK if state == JobState.SUCCEEDED else EXIT_FAILURE


def color_choice() -> str:
    """The main group's --color: auto, always or never."""
    context = click.get_current_context(silent=True)
    return str(context.meta.get(_COLOR, "auto")) if context is not None else "auto"


def output() -> Output:
    """Where a verb writes its lines and tables (client/views/styled.py), with the main group's --color."""
    from ..views.styled import Output

    return Output(color_choice())


def console() -> Console:
    """rich's console, with the main group's --color: for `tfrun top`'s live view only (rich.console costs a
    quarter of a short verb's start; the others write through `output`)."""
    from ..views import render

    return render.console(color_choice())


# -- the top group ------------------------------------------------------------------------------------------


@click.group(
    cls=VerbGroup,
    prog="tfrun",
    context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 110},
    epilog=EXIT_CODES_HELP,
)
@click.version_option(__version__, prog_name="tfrun")
@click.option("--color", type=click.Choice(COLOR_CHOICES), default="auto", show_default=True,
              help="Colour in tables and reports. auto: on a terminal, unless NO_COLOR is set (or FORCE_COLOR "
              "asks for it in a pipe too); --color beats both. Never wrapped either way: a pipe gets whole "
              "rows, one per line.")  # fmt: skip
@click.pass_context
def main(ctx: click.Context, color: str) -> None:
    """Run training scripts detached on a GPU box, follow their logs, and never lose a job.

    Every verb talks to a daemon (tfrund): on a box over SSH with --host (or TFRUN_HOST, or the default
    host of `tfrun hosts add`), else on this machine, started on demand, its state in TFRUN_HOME
    (default ~/.local/state/tfrun). Jobs keep running when the client, the SSH link or the daemon
    itself goes away.

    \b
    Examples:
      tfrun submit train.py --epochs 5     run train.py from a snapshot of its folder; prints the job id
      tfrun submit -f train.py             ... and follow its output; exit with its exit code
      tfrun ps                             jobs that have not ended (-a: all)
      tfrun logs -f 3                      follow job 3's output until it ends
      tfrun pull 3                         copy job 3's checkpoint folder here
      tfrun hosts add box alice@gpu-box    from now on, every verb runs on box (--host local: here)
      tfrun submit --host gpu t.py         on the member of pool gpu that can start it soonest (tfrun pools)
      tfrun logs -f box2:3                 job 3 of host box2, whatever the default host
      tfrun cancel 3                       SIGTERM, then SIGKILL after 10 s (--grace)
      tfrun submit --max-restarts 3 t.py   after a crash or an OOM kill, run it again from its checkpoint
      tfrun checkpoints 3                  what job 3 saved: step, time, size
      tfrun doctor --host box              TensorFlow, CUDA, GPUs, driver, checkpoint space on the box
      tfrun submit --gpus 2 --notify slack://T/B/X t.py   two GPUs of its own; alerts to Slack too
      tfrun alerts                         what fired (OOM, loss spike, stall, failure, end) and if it was sent
      tfrun config set notify URL          the box's alerts go to URL from now on, no restart (tfrun config)
      tfrun top                            live jobs, GPUs, last loss; q quits
      tfrun metrics 3 --plot               job 3's loss curve in the terminal
      tfrun completion bash                Tab completion of verbs, options, job ids and hosts (also zsh, fish)
    """
    ctx.meta[_COLOR] = color
