"""`tfrun`: submit training jobs, watch them, cancel them. One function per verb."""

from __future__ import annotations

import asyncio
import dataclasses
import functools
import os
import sys
import uuid
from collections.abc import Awaitable, Coroutine
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, NoReturn, Optional, TypeVar

import click

from tfrun import __version__
from tfrun.client import completion, config, daemonconfig, render
from tfrun.client.connection import Target
from tfrun.client.errors import TfrunError
from tfrun.client.timespec import Since, since_option
from tfrun.constants import (
    DEFAULT_BOX_VENV,
    DEFAULT_GRACE_S,
    EXIT_DAEMON,
    EXIT_FAILURE,
    EXIT_LOST,
    EXIT_NO_SUCH_JOB,
    EXIT_OK,
    EXIT_USAGE,
    MAX_ALERTS,
    MAX_CANCEL_JOBS,
    MAX_CONTEXT,
    MAX_INT64,
    MAX_PATTERN_CHARS,
    MAX_PATTERNS,
    MAX_PRIORITY,
    MAX_RESTARTS,
    MAX_TAIL,
    RECONNECT_PAUSE_S,
    SIGNAL_EXIT_BASE,
    UPLOAD_WARN_BYTES,
    WHEELHOUSE_ENV,
)
from tfrun.duration import format_duration
from tfrun.protocol import (
    AlertList,
    Attach,
    AttachReply,
    Cancel,
    CancelReply,
    Channel,
    ConfigReply,
    ConnectionClosed,
    Doctor,
    DoctorReport,
    ErrorCode,
    ExplainMetrics,
    FileList,
    GetConfig,
    GetJob,
    GetMetrics,
    GpuList,
    Job,
    JobList,
    JobReply,
    JobState,
    ListAlerts,
    ListFiles,
    ListGpus,
    ListJobs,
    LogChunk,
    LogEnd,
    LogLines,
    Message,
    MetricsExplained,
    MetricsReply,
    NotifyReport,
    NotifyTest,
    ProtocolError,
    ReadLog,
    ReloadConfig,
    RemoteError,
    Restart,
    SetConfig,
    Submit,
    Wait,
    validate_name,
    write_message,
)
from tfrun.usage import OneLineUsageGroup

if TYPE_CHECKING:
    from rich.console import Console

    from tfrun.client.snapshot import Snapshot

T = TypeVar("T")

_REMOTE_EXIT = {
    ErrorCode.NO_SUCH_JOB: EXIT_NO_SUCH_JOB,
    ErrorCode.INVALID_INPUT: EXIT_USAGE,
    ErrorCode.BAD_REQUEST: EXIT_USAGE,
}
# What a daemon that went away in the middle of a conversation looks like: worth connecting again.
_DISCONNECTS = (ConnectionError, ConnectionClosed)

EXIT_CODES_HELP = f"""\b
Exit codes:
  wait, logs -f, submit -f   the job's own exit code; 128+N if a signal N killed it; {EXIT_LOST} if lost
  {EXIT_OK}                          success
  {EXIT_FAILURE}                          the verb could not do all it was asked (e.g. cancel of an ended job)
  {EXIT_USAGE}                          bad usage or bad input (missing script, bad --env, invalid name)
  {EXIT_NO_SUCH_JOB}                          no such job
  {EXIT_DAEMON}                        tfrund cannot be reached or started, or speaks another protocol
"""


def _fail(message: str, code: int) -> NoReturn:
    click.echo(f"tfrun: error: {message}", err=True)
    sys.exit(code)


def _run(coro: Coroutine[Any, Any, T]) -> T:
    """Run one verb's conversation with the daemon; every failure becomes one line and an exit code."""
    try:
        return asyncio.run(coro)
    except TfrunError as exc:
        _fail(exc.message, exc.exit_code)
    except RemoteError as exc:
        where = f" on {_place()}" if exc.code == ErrorCode.NO_SUCH_JOB else ""  # after `hosts add`, not here
        _fail(exc.message + where, _REMOTE_EXIT.get(exc.code, EXIT_DAEMON))
    except ProtocolError as exc:
        _fail(f"talking to tfrund failed: {exc}", EXIT_DAEMON)
    except StdoutClosed:
        # Our reader (e.g. `| head`) went away: stop quietly, as `cat` would.
        sys.stderr.close()
        sys.exit(SIGNAL_EXIT_BASE + 13)
    except ConnectionError as exc:
        _fail(f"lost the connection to tfrund: {exc.strerror or exc}", EXIT_DAEMON)
    except KeyboardInterrupt:
        sys.exit(SIGNAL_EXIT_BASE + 2)
    except Exception as exc:  # a bug of ours: still one line, with the way to see the whole story
        if os.environ.get("TFRUN_DEBUG"):
            raise
        _fail(f"unexpected {type(exc).__name__}: {exc} (set TFRUN_DEBUG=1 to see where)", EXIT_DAEMON)


class StdoutClosed(Exception):
    """Whoever reads our output went away."""


def _target() -> Target:
    """Where this verb's requests go, as its --host options said (see `host_options`)."""
    target = click.get_current_context().find_object(Target)
    return target if target is not None else Target()


def _place(full: bool = False) -> str:
    """Where this verb acts, in words: `box`, with `full` `box (alice@gpu-box)`, or `this machine`. `ps` and
    every "no job" error say it, because after `hosts add` a bare `tfrun ps` quietly means the box."""
    host = _target().host
    if host is None:
        return "this machine"
    return f"{host.name} ({host.destination})" if full and host.name else host.label


async def _channel() -> Channel:
    return await _target().connect()


async def _with_channel(action: Callable[[Channel], Awaitable[T]]) -> T:
    channel = await _channel()
    try:
        return await action(channel)
    finally:
        channel.close()


R = TypeVar("R", bound=Message)


def _ask(request: Message, reply_type: type[R]) -> R:
    """One request to the daemon and its reply, which must be a `reply_type` (else a protocol error)."""

    async def conversation(channel: Channel) -> R:
        reply = await channel.request(request)
        if not isinstance(reply, reply_type):
            raise ProtocolError(f"expected {reply_type.TYPE!r} in reply to {request.TYPE!r}, got {reply.TYPE!r}")
        return reply

    return _run(_with_channel(conversation))


F = TypeVar("F", bound=Callable[..., Any])


def host_options(command: F) -> F:
    """--host and --accept-new-host-key, shared by every verb that talks to a daemon."""

    command = click.option(
        "--accept-new-host-key",
        is_flag=True,
        expose_value=False,
        is_eager=True,
        callback=_set_accept_new,
        help="Trust a box's host key the first time it is seen (like StrictHostKeyChecking=accept-new).",
    )(command)
    command = click.option(
        "--host",
        envvar="TFRUN_HOST",
        expose_value=False,
        metavar="HOST",
        callback=_set_target,
        shell_complete=completion.hosts,
        help="The box: a configured host (tfrun hosts list), or user@host[:port]. Default: the configured "
        "default host, else the daemon on this machine ('local').",
    )(command)
    return command


def _set_accept_new(ctx: click.Context, _: click.Parameter, value: bool) -> None:
    ctx.meta["accept_new"] = value  # eager: read by _set_target, whatever the order on the command line


def _set_target(ctx: click.Context, _: click.Parameter, value: Optional[str]) -> None:
    if value is None and isinstance(ctx.obj, Target):
        return  # a subcommand without --host keeps its group's: `tfrun config --host box set ...`
    try:
        host = config.resolve(value, config.load())
    except TfrunError as exc:
        if ctx.resilient_parsing:  # completing a command line (Tab): the verb itself says what is wrong
            return
        _fail(exc.message, exc.exit_code)
    ctx.obj = Target(host, bool(ctx.meta.get("accept_new")))


def job_exit_code(state: str, exit_code: Optional[int]) -> int:
    """What `wait` and `logs -f` exit with: the job's code, as a shell would report it."""
    if state == JobState.LOST:
        return EXIT_LOST
    if exit_code is not None:
        return exit_code
    return EXIT_OK if state == JobState.SUCCEEDED else EXIT_FAILURE


def _console() -> Console:
    context = click.get_current_context(silent=True)
    return render.console(context.meta.get(_COLOR, "auto") if context is not None else "auto")


_COLOR = "tfrun.color"  # where the main group leaves --color for the verbs (click's meta is shared by all)


@click.group(
    cls=OneLineUsageGroup,
    prog="tfrun",
    context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 110},
    epilog=EXIT_CODES_HELP,
)
@click.version_option(__version__, prog_name="tfrun")
@click.option("--color", type=click.Choice(render.COLOR_CHOICES), default="auto", show_default=True,
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


# -- submit -------------------------------------------------------------------------------------------------


def _parse_env(pairs: tuple[str, ...]) -> dict[str, str]:
    env: dict[str, str] = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key or "\0" in pair:
            raise click.BadParameter(f"{pair!r} is not NAME=VALUE", param_hint="--env")
        env[key] = value
    return env


def _snapshot_notes(snap: Snapshot) -> None:
    """Tell the user about what is not sent, and about a snapshot big enough to be a mistake."""
    if snap.skipped:
        names = [name if name.isprintable() else repr(name) for name in snap.skipped[:3]]  # one line, always
        shown = ", ".join(names) + (", ..." if len(snap.skipped) > 3 else "")
        click.echo(f"tfrun: not sent (special files or unusable names): {shown}", err=True)
    if snap.total_bytes > UPLOAD_WARN_BYTES:
        largest = ", ".join(f"{e.path} ({render.size(e.size)})" for e in snap.largest(3))
        click.echo(
            f"tfrun: warning: the work dir snapshot holds {render.size(snap.total_bytes)} in "
            f"{len(snap.paths)} files; largest: {largest}. Keep data out of it with .tfrunignore.",
            err=True,
        )


@main.command(context_settings={"ignore_unknown_options": True, "allow_interspersed_args": False})
@click.option("--name", help="A name to refer to the job by (the newest job of a name wins).")
@click.option(
    "--workdir",
    type=click.Path(path_type=Path),
    help="Folder to snapshot and run in (default: the script's folder). SCRIPT must be inside it.",
)
@click.option("--env", "env_pairs", multiple=True, metavar="NAME=VALUE", help="Set a variable for the job; repeatable.")
@click.option(
    "--python",
    metavar="PATH",
    help="Interpreter for a .py script (default: the host's python setting, else the daemon's job_python, "
    "else python3 on the daemon's PATH).",
)
@click.option("-f", "--follow", is_flag=True, help="Follow the job's output and exit with its exit code.")
@click.option("--max-restarts", type=click.IntRange(0, MAX_RESTARTS), default=0, metavar="N", help="If the job "
              "fails or is lost (not cancelled), run it again as a new job with the same snapshot and checkpoint "
              "folder, up to N times; with tfrun.jobs it resumes from its last checkpoint.")  # fmt: skip
@click.option("--gpus", type=click.IntRange(min=0), metavar="N", help="GPUs of its own (CUDA_VISIBLE_DEVICES); "
              "it waits until N are free. Default: the daemon's default_gpus, else 1 if the box has GPUs.")  # fmt: skip
@click.option("--priority", type=click.IntRange(-MAX_PRIORITY, MAX_PRIORITY), default=0, metavar="P",
              help="Among waiting jobs, higher P starts first (default 0); equal ones start in the order they "
              "were submitted.")  # fmt: skip
@click.option("--after", "after", multiple=True, metavar="JOB[,JOB...]", help="Start only once these jobs have "
              "succeeded; if one fails, is cancelled or lost, this job fails without starting.")  # fmt: skip
@click.option("--tty", is_flag=True, help="Run it in a tmux session on the box that `tfrun attach JOB` opens (for "
              "breakpoint() or input()); its output still goes to its log.")  # fmt: skip
@click.option("--alert", "alerts", multiple=True, metavar="RULE[=VALUE][,...]", help="Turn on or tune alert rules "
              "for this job: oom, spike[=FACTOR], stall[=TIME], failed, done, lost (e.g. --alert stall=10m); all "
              "are on unless the daemon's config says otherwise.")  # fmt: skip
@click.option("--no-alert", "no_alerts", multiple=True, metavar="RULE[,...]", help="Turn alert rules off for this "
              "job (`all` for every one), e.g. --no-alert done.")  # fmt: skip
@click.option("--notify", multiple=True, metavar="URL", help="Also send this job's alerts to URL (any apprise URL: "
              "mailto://, slack://, json://, ...); repeatable. Kept on the box, never shown unmasked.")  # fmt: skip
@click.option("--metric", "metric_patterns", multiple=True, metavar="REGEX", help="Read more metrics from the "
              "output: each named group is one, `step`/`epoch` are counters, e.g. 'it (?P<step>\\d+) "
              "f1=(?P<f1>[0-9.]+)'.")  # fmt: skip
@click.option("--json", "as_json", is_flag=True, help="Print the job's record as JSON instead of its id.")
@click.option("-y", "--yes", is_flag=True, help="Send a large upload without asking: on a terminal, submit asks "
              "before sending more than confirm_upload_bytes (client config, default 1GB) the box lacks.")  # fmt: skip
@host_options
@click.argument("script", shell_complete=completion.files)
@click.argument("args", nargs=-1, type=click.UNPROCESSED)
def submit(
    name: Optional[str],
    workdir: Optional[Path],
    env_pairs: tuple[str, ...],
    python: Optional[str],
    follow: bool,
    max_restarts: int,
    gpus: Optional[int],
    priority: int,
    after: tuple[str, ...],
    tty: bool,
    alerts: tuple[str, ...],
    no_alerts: tuple[str, ...],
    notify: tuple[str, ...],
    metric_patterns: tuple[str, ...],
    as_json: bool,
    yes: bool,
    script: str,
    args: tuple[str, ...],
) -> None:
    """Run SCRIPT [ARGS]... as a detached job, from a snapshot of its work dir.

    A submit runs its job once: if tfrund goes away before answering, tfrun sends it again (to the
    daemon that comes back, for up to TFRUN_RECONNECT_TIMEOUT), and a daemon that took it already
    answers with that job. So it prints one job id, or says that nothing was submitted.

    The work dir's files are sent to the daemon (only contents it does not hold yet) and the job runs
    in a copy of its own, so editing your files afterwards never changes a queued or running job.
    .gitignore and .tfrunignore are honoured, .git is skipped; the git commit and whether the tree was
    dirty are recorded with the job. A .py script runs with the job interpreter; anything else is
    executed directly (it must be executable). Everything after SCRIPT goes to the script untouched,
    even options: put tfrun's own options before SCRIPT. One of them after SCRIPT (`train.py --host box`)
    gets a warning; `SCRIPT -- ARGS...` passes ARGS on without one (that first -- is tfrun's, dropped).

    The job's environment has PYTHONUNBUFFERED=1, TFRUN_JOB_ID, TFRUN_JOB_DIR, TFRUN_CHECKPOINT_DIR
    (a folder of its own for checkpoints), TFRUN_METRICS_FILE and TF_FORCE_GPU_ALLOW_GROWTH=true (unless
    set already) on top of the daemon's environment and your --env.

    Alerts (out of memory, loss spikes, stalls, failure, success, loss of the job) go to the daemon's
    notify URLs and to each --notify URL; `tfrun alerts` lists them. Metrics come from tfrun.jobs when the
    script uses it, else from its Keras, Lightning or plain `loss` prints: `tfrun metrics`.
    """
    from tfrun.client.housekeeping import UploadQuestion
    from tfrun.client.snapshot import relative_script, scan, why_not_sent
    from tfrun.client.transfer import LazyProgress, upload

    if name is not None and validate_name(name):
        raise click.BadParameter(str(validate_name(name)), param_hint="--name")
    env = _parse_env(env_pairs)
    args = _script_args(script, args)
    target = _target()
    try:
        root, relative = relative_script(script, workdir)
        snap = scan(root, local=target.local)
    except TfrunError as exc:
        _fail(exc.message, exc.exit_code)
    if snap.find(relative) is None:
        _fail(why_not_sent(root, relative), EXIT_USAGE)
    _snapshot_notes(snap)
    hashing = LazyProgress(snap.total_bytes, "hashing")
    try:
        snap.hash(hashing.advance)
    except TfrunError as exc:
        _fail(exc.message, exc.exit_code)
    finally:
        hashing.close()
    if python is None and target.host is not None:
        python = target.host.python
    elif python is not None and target.local and os.sep in python:
        python = str(Path(python).absolute())
    request = Submit(
        files=snap.entries,
        script=relative,
        args=list(args),
        name=name,
        env=env,
        python=python,
        source=str(root),
        git_commit=snap.git_commit,
        git_dirty=snap.git_dirty,
        max_restarts=max_restarts,
        alerts=_split(alerts),
        no_alerts=_split(no_alerts),
        notify=list(notify),
        metric_patterns=list(metric_patterns),
        gpus=gpus,
        priority=priority,
        after=_split(after),
        tty=tty,
        submission_id=uuid.uuid4().hex,  # the same in every retry: a daemon that took it once returns that job
    )
    asked = False  # whether the submit went out: from then on, a failure leaves its outcome unknown
    where = target.host.label if target.host else "the local tfrund"
    question = UploadQuestion(config.confirm_upload_bytes(config.load()), yes, where)

    async def submitted(channel: Channel) -> tuple[Job, int, int]:
        nonlocal asked
        sent, sent_bytes = await upload(channel, snap, question)
        asked = True
        reply = await channel.request(request)
        assert isinstance(reply, JobReply)
        return reply.job, sent, sent_bytes

    async def conversation() -> int:
        try:
            job, sent, sent_bytes = await _resilient(submitted, hello_answers=False)
        except (TfrunError, ProtocolError, ConnectionError) as exc:  # not RemoteError: a refusal says why itself
            code = exc.exit_code if isinstance(exc, TfrunError) else EXIT_DAEMON
            raise TfrunError(_unsubmitted(exc, asked), code) from None
        click.echo(f"tfrun: uploaded {sent} of {len(snap.sources)} files ({render.size(sent_bytes)})", err=True)
        if as_json:
            click.echo(render.to_json(job))
        elif follow:
            click.echo(f"job {job.id} submitted" + (f", {job.waiting}" if job.waiting else ""), err=True)
        else:
            click.echo(job.id)
        if not follow:
            return EXIT_OK
        return await _follow(str(job.id))

    sys.exit(_run(conversation()))


def _script_args(script: str, args: tuple[str, ...]) -> tuple[str, ...]:
    """The script's arguments. A `--` right after SCRIPT is tfrun's and dropped: what follows goes on as it is,
    unremarked. Otherwise an option of submit's own among them (`--host box`) still goes to the script, which
    may well take a --name of its own, but with a warning: it is the likeliest slip of all."""
    if args[:1] == ("--",):
        return args[1:]
    ctx = click.get_current_context()
    own = {name for param in ctx.command.get_params(ctx) if isinstance(param, click.Option)
           for name in (*param.opts, *param.secondary_opts)}  # fmt: skip
    found: list[str] = []
    for arg in args:
        if arg == "--":  # the script's own end of options: what follows is plainly meant for it
            break
        name = arg.split("=", 1)[0] if arg.startswith("--") else arg
        if name in own and name not in found:
            found.append(name)
    if found:
        verb = "goes" if len(found) == 1 else "go"
        click.echo(f"tfrun: warning: {', '.join(found)} after SCRIPT {verb} to {script}, not to tfrun; put tfrun's "
                   "options before SCRIPT, or write -- before the script's own to pass them on without this "
                   "warning", err=True)  # fmt: skip
    return args


def _unsubmitted(exc: Exception, asked: bool) -> str:
    """Why a submit failed, and whether its job may exist after all: only if the daemon went away after the
    request reached it and none came back in time to say."""
    reason = exc.message if isinstance(exc, TfrunError) else str(exc)
    if not asked:
        return f"{reason}; nothing was submitted"
    return f"{reason}; the submit was sent but never answered, so the job may exist: see `tfrun ps -a`"


def _split(values: tuple[str, ...]) -> list[str]:
    """Options that may repeat and take comma-separated lists: --alert oom,stall=5m --alert done."""
    return [part.strip() for value in values for part in value.split(",") if part.strip()]


# -- looking at jobs ----------------------------------------------------------------------------------------


@main.command()
@host_options
@click.option("-a", "--all", "show_all", is_flag=True, help="Include jobs that have ended.")
@click.option("-q", "--quiet", is_flag=True, help="Print only the job ids, one a line (for xargs or $(...)).")
@click.option("--json", "as_json", is_flag=True, help="Print a JSON list of job records.")
def ps(show_all: bool, quiet: bool, as_json: bool) -> None:
    """List jobs that have not ended (with -a, every job).

    The first line names the box (`jobs on box (alice@gpu-box)`, or `this machine`), then one row per job,
    never wrapped: in a pipe each row is whole, so `tfrun ps -a | grep NAME` finds the job; on a terminal a
    row too wide for it is cut with an ellipsis."""
    if quiet and as_json:
        raise click.UsageError("-q and --json do not go together")
    jobs = _ask(ListJobs(all=show_all), JobList).jobs
    if as_json:
        click.echo(render.to_json(jobs))
    elif quiet:
        click.echo("".join(f"{job.id}\n" for job in jobs), nl=False)
    else:
        render.job_table(jobs, _console(), _place(full=True))


def _newest() -> Job:
    """The newest job on the box (the last submitted): what `logs` and `status` mean without JOB."""
    jobs = _ask(ListJobs(all=True), JobList).jobs
    if not jobs:
        _fail(f"no jobs on {_place()}", EXIT_NO_SUCH_JOB)
    return max(jobs, key=lambda job: job.id)


@main.command()
@host_options
@click.argument("job", required=False, shell_complete=completion.jobs)
@click.option("--json", "as_json", is_flag=True, help="Print the job's record as JSON.")
def status(job: Optional[str], as_json: bool) -> None:
    """Show one job: state, exit code, times, folders. JOB is an id or a name; without it, the newest job."""
    record = _ask(GetJob(job=job), JobReply).job if job is not None else _newest()
    if as_json:
        click.echo(render.to_json(record))
    else:
        render.job_detail(record, _console())


@main.command()
@host_options
@click.argument("job", shell_complete=completion.jobs)
@click.option("--json", "as_json", is_flag=True, help="Print the final record as JSON.")
def wait(job: str, as_json: bool) -> None:
    """Wait until JOB ends, then exit with its exit code (128+N for signal N, 255 if lost).

    A job restarted after a failure (submit --max-restarts) ends when its last restart does. Through
    daemon restarts and dropped SSH links it reconnects and waits on, however often; it gives up (exit
    125) only once no tfrund answered for TFRUN_RECONNECT_TIMEOUT (default 5m; or reconnect_timeout in
    the client's config.toml).
    """

    async def conversation(channel: Channel) -> Job:
        reply = await channel.request(Wait(job=job))
        assert isinstance(reply, JobReply)
        while reply.job.restarted_as is not None:  # failed, and running again (submit --max-restarts)
            reply = await channel.request(Wait(job=str(reply.job.restarted_as)))
            assert isinstance(reply, JobReply)
        return reply.job

    record = _run(_resilient(conversation))
    if as_json:
        click.echo(render.to_json(record))
    else:
        code = "-" if record.exit_code is None else record.exit_code
        click.echo(f"job {record.id} {record.state} (exit code {code})", err=True)
    sys.exit(job_exit_code(record.state, record.exit_code))


@main.command()
@host_options
@click.argument("jobs", nargs=-1, metavar="[JOB]...", shell_complete=completion.jobs)
@click.option("--all", "every", is_flag=True, help="Cancel every job that has not ended (queued or running).")
@click.option(
    "--grace",
    type=click.FloatRange(0, 86400),
    default=DEFAULT_GRACE_S,
    show_default=True,
    help="Seconds between SIGTERM and SIGKILL.",
)
@click.option("--json", "as_json", is_flag=True, help="Print one JSON result per job.")
def cancel(jobs: tuple[str, ...], every: bool, grace: float, as_json: bool) -> None:
    """Stop jobs: SIGTERM to each job's process group, SIGKILL to whatever is left after --grace.

    Returns once every job named has ended, with nothing of it left running. With --all, every job that
    has not ended, each with its own line; a job that ends by itself meanwhile is no failure.
    """

    if every == bool(jobs):
        raise click.UsageError("JOB... or --all, not both" if every else "name the JOB... to cancel, or --all")
    if len(jobs) > MAX_CANCEL_JOBS:
        raise click.UsageError(f"at most {MAX_CANCEL_JOBS} jobs at once")
    wanted = list(jobs) or [str(job.id) for job in _ask(ListJobs(all=False), JobList).jobs]
    if not wanted:
        click.echo(f"tfrun: no unfinished jobs on {_place()}", err=True)
    results = []
    for start in range(0, len(wanted), MAX_CANCEL_JOBS):
        results += _ask(Cancel(jobs=wanted[start : start + MAX_CANCEL_JOBS], grace=grace), CancelReply).results
    if as_json:
        click.echo(render.to_json(results))
    for result in results:
        if not as_json:
            click.echo(result.message + (f" on {_place()}" if result.id is None else ""), err=not result.ok)
    if any(r.id is None for r in results):
        sys.exit(EXIT_NO_SUCH_JOB)
    ended = every and all(r.ok or r.state in JobState.FINAL for r in results)  # --all: it ended by itself
    sys.exit(EXIT_OK if ended or all(r.ok for r in results) else EXIT_FAILURE)


@main.command()
@host_options
@click.argument("job", shell_complete=completion.jobs)
@click.option("-f", "--follow", is_flag=True, help="Follow the new job's output and exit with its exit code.")
@click.option("--json", "as_json", is_flag=True, help="Print the new job's record as JSON instead of its id.")
def restart(job: str, follow: bool, as_json: bool) -> None:
    """Run an ended JOB again, as a new job: the same snapshot (not your files as they are now), command,
    environment, and the same checkpoint folder, so a job using tfrun.jobs resumes where it stopped."""

    async def conversation(channel: Channel) -> int:
        reply = await channel.request(Restart(job=job))
        assert isinstance(reply, JobReply)
        if as_json:
            click.echo(render.to_json(reply.job))
        elif follow:
            click.echo(f"job {reply.job.id} runs job {reply.job.restart_of} again", err=True)
        else:
            click.echo(reply.job.id)
        return await _follow(str(reply.job.id), channel) if follow else EXIT_OK

    sys.exit(_run(_with_channel(conversation)))


# -- logs ---------------------------------------------------------------------------------------------------


@main.command()
@host_options
@click.argument("job", required=False, shell_complete=completion.jobs)
@click.option("-f", "--follow", is_flag=True, help="Keep printing until the job ends; exit with its exit code. "
              "Through daemon restarts and dropped SSH links it resumes at the next byte; it gives up only "
              "once no tfrund answered for TFRUN_RECONNECT_TIMEOUT (default 5m, see config.toml).")  # fmt: skip
@click.option("-e", "--regexp", "patterns", multiple=True, metavar="PATTERN", help="Only lines matching PATTERN "
              "(an extended regular expression, as grep -E); repeat to match any of several.")  # fmt: skip
@click.option("--grep", "grep_patterns", multiple=True, metavar="PATTERN", help="The same as -e.")
@click.option("-v", "--invert-match", "invert", is_flag=True, help="Only lines that do NOT match.")
@click.option("-i", "--ignore-case", is_flag=True, help="Match upper and lower case alike.")
@click.option("-F", "--fixed-strings", "fixed", is_flag=True, help="Patterns are plain strings, not expressions.")
@click.option("-n", "--tail", type=click.IntRange(0, MAX_TAIL), metavar="N", help="Start with the last N lines "
              "(that match).")  # fmt: skip
@click.option("-A", "--after-context", "after", type=click.IntRange(0, MAX_CONTEXT), default=0, metavar="N",
              help="Also N lines after each match.")  # fmt: skip
@click.option("-B", "--before-context", "before", type=click.IntRange(0, MAX_CONTEXT), default=0, metavar="N",
              help="Also N lines before each match.")  # fmt: skip
@click.option("-C", "--context", type=click.IntRange(0, MAX_CONTEXT), metavar="N", help="The same as -A N -B N.")
@click.option("--since", callback=since_option, metavar="DURATION|TIME", help="Only lines written since "
              "then: a duration before now (90s, 10m, 1h30m, 2d) or a date and time (2026-11-30T08:00, local unless "
              "it ends in Z or names a zone).")  # fmt: skip
@click.option("-t", "--timestamps", is_flag=True, help="Start each line with the time it was written (UTC, "
              "RFC 3339, to within 0.1 s).")  # fmt: skip
def logs(
    job: Optional[str],
    follow: bool,
    patterns: tuple[str, ...],
    grep_patterns: tuple[str, ...],
    invert: bool,
    ignore_case: bool,
    fixed: bool,
    tail: Optional[int],
    after: int,
    before: int,
    context: Optional[int],
    since: Optional[Since],
    timestamps: bool,
) -> None:
    """Print JOB's output (stdout and stderr, as the job wrote them); without JOB, the newest job's (which
    one is said on stderr).

    With a filter (-e/--grep, -v, --tail, --since) or --timestamps the output is read as a terminal shows
    it: a progress bar that redraws itself with \\r is one line in its final state, colour codes are ignored
    when matching, and bytes that are not UTF-8 appear as \\xNN. Filtering happens on the box: only
    matching lines travel.

    \b
    Examples:
      tfrun logs -f 12 --grep 'loss|step'     follow job 12, only lines with loss or step
      tfrun logs 12 -i -e error -e nan         lines with error or NaN, any case
      tfrun logs 12 -n 20                      the last 20 lines (-n is --tail)
      tfrun logs 12 --since 10m -t             the last ten minutes, each line with its time
    """
    wanted = LogQuery(
        patterns=[*patterns, *grep_patterns],
        invert=invert,
        ignore_case=ignore_case,
        fixed=fixed,
        tail=tail,
        after=after if context is None else context,
        before=before if context is None else context,
        since=since,
        timestamps=timestamps,
    )
    if (invert or ignore_case or fixed or wanted.after or wanted.before) and not wanted.patterns:
        raise click.UsageError("-v, -i, -F, -A, -B and -C need a pattern (-e PATTERN or --grep PATTERN)")
    if len(wanted.patterns) > MAX_PATTERNS or sum(map(len, wanted.patterns)) > MAX_PATTERN_CHARS:
        raise click.UsageError(f"at most {MAX_PATTERNS} patterns of {MAX_PATTERN_CHARS} characters in all")
    if job is None:
        newest = _newest()
        job = str(newest.id)
        named = f" ({newest.name})" if newest.name else ""
        click.echo(f"tfrun: job {job}{named}, the newest on {_place()}", err=True)
    if follow:
        sys.exit(_run(_follow(job, query=wanted)))

    async def conversation(channel: Channel) -> int:
        await _stream_log(channel, job, LogCursor(), follow=False, query=wanted)
        return EXIT_OK

    sys.exit(_run(_with_channel(conversation)))


@dataclasses.dataclass
class LogQuery:
    """Which lines `logs` asks for; empty means every byte as written."""

    patterns: list[str] = dataclasses.field(default_factory=list)
    invert: bool = False
    ignore_case: bool = False
    fixed: bool = False
    tail: Optional[int] = None
    after: int = 0
    before: int = 0
    since: Optional[Since] = None
    timestamps: bool = False


class LogCursor:
    """The next byte of the log to print: where a follower resumes after losing its connection."""

    def __init__(self) -> None:
        self.offset = 0
        self.started = False  # something was received: a reconnect carries on instead of starting over


async def _stream_log(
    channel: Channel, job: str, cursor: LogCursor, follow: bool, query: Optional[LogQuery] = None
) -> LogEnd:
    """Write the log to stdout from the cursor, moving it along; return the final LogEnd."""
    out = sys.stdout.buffer
    query = query or LogQuery()
    request = ReadLog(
        job=job,
        offset=cursor.offset,
        follow=follow,
        patterns=query.patterns,
        invert=query.invert,
        ignore_case=query.ignore_case,
        fixed=query.fixed,
        tail=None if cursor.started else query.tail,  # after a reconnect: carry on, do not tail again
        after=query.after,
        before=query.before,
        timestamps=query.timestamps,
    )
    if query.since is not None and not cursor.started:  # after a reconnect every line from the cursor is wanted
        request.since, request.since_ago = query.since.at, query.since.ago
    await write_message(channel.writer, request)
    while True:
        msg = await channel.receive()
        if isinstance(msg, (LogChunk, LogLines)):
            if msg.offset != cursor.offset:
                raise ProtocolError(f"log data from byte {msg.offset}, expected {cursor.offset}")
            try:
                out.write(msg.data)
                out.flush()
            except BrokenPipeError:
                raise StdoutClosed from None
            cursor.offset = msg.next_offset if isinstance(msg, LogLines) else msg.offset + len(msg.data)
            cursor.started = True
        elif isinstance(msg, LogEnd):
            cursor.started = True
            return msg
        else:
            raise ProtocolError(f"unexpected {msg.TYPE!r} while reading a log")


async def _follow(job: str, channel: Optional[Channel] = None, query: Optional[LogQuery] = None) -> int:
    """Print the job's output until it ends, resuming at the same byte after a daemon restart; when the
    job failed and was restarted (submit --max-restarts), carry on with the job that runs it again."""
    while True:
        from_cursor = functools.partial(_stream_log, job=job, cursor=LogCursor(), follow=True, query=query)
        end = await _resilient(from_cursor, channel)
        channel = None
        if end.restarted_as is None:
            return job_exit_code(end.state, end.exit_code)
        click.echo(f"tfrun: job {job} {end.state} (exit code {end.exit_code}); restarted as job {end.restarted_as}",
                   err=True)  # fmt: skip
        job = str(end.restarted_as)


async def _resilient(
    action: Callable[[Channel], Awaitable[T]], channel: Optional[Channel] = None, hello_answers: bool = True
) -> T:
    """Run `action`; if the daemon goes away in the middle (a crash, a restart, a dropped SSH link), connect
    again and run it again, for as long as a daemon comes back: a job may outlive any number of daemons.
    Give up only once no daemon has answered for the reconnect timeout, never after some count of retries.
    With `hello_answers` False, a daemon that takes the connection but dies before answering the request
    does not count as answering: a submit that kills every daemon it reaches must not retry forever.

    Only for actions that are safe to repeat: waiting, following from the byte already printed, and a
    submit that carries its submission id. A daemon that cannot be reached at the start is an error at once.
    """
    patience = config.reconnect_timeout(config.load())
    loop = asyncio.get_running_loop()
    deadline: Optional[float] = None
    if channel is None:
        channel = await _channel()
    while True:
        try:
            return await action(channel)
        except _DISCONNECTS as exc:
            lost = exc
        finally:
            channel.close()
        if deadline is None or hello_answers:
            deadline = loop.time() + patience
        channel = await _reconnect(deadline, patience, lost)


async def _reconnect(deadline: float, patience: float, lost: Exception) -> Channel:
    """A new channel, tried every RECONNECT_PAUSE_S until a daemon answers (one may be starting, the SSH link
    coming back; jobs run on regardless) or `deadline` passes."""
    loop = asyncio.get_running_loop()
    while True:
        if loop.time() >= deadline:
            reason = lost.message if isinstance(lost, TfrunError) else getattr(lost, "strerror", None) or str(lost)
            raise TfrunError(
                f"no tfrund answered for {format_duration(patience)} ({reason}); jobs run on without it: try "
                f"again later, or keep trying longer with {config.RECONNECT_ENV}",
                EXIT_DAEMON,
            )
        try:
            return await _channel()
        except (OSError, TfrunError, ProtocolError) as exc:
            lost = exc
        await asyncio.sleep(RECONNECT_PAUSE_S)


@main.command()
@host_options
@click.option("--python", metavar="PATH", help="Check this job interpreter on the box (default: the one jobs get).")
@click.option("--json", "as_json", is_flag=True, help="Print the checks as a JSON list.")
def doctor(python: Optional[str], as_json: bool) -> None:
    """Check the box for training, as its daemon sees it: the job interpreter and its TensorFlow (built
    with CUDA, GPUs seen, memory growth), the NVIDIA driver and CUDA version from nvidia-smi, and the
    checkpoint root (writable, free space). Each line passes or says what to do; exits 1 if any fails.
    A box without GPUs gets warnings, not failures."""
    host = _target().host
    checks = _ask(Doctor(python=python or (host.python if host else None)), DoctorReport).checks
    if as_json:
        click.echo(render.to_json(checks))
    else:
        render.check_lines(checks, _console())
    sys.exit(EXIT_FAILURE if any(check.status == "fail" for check in checks) else EXIT_OK)


@main.command()
@host_options
@click.option("--json", "as_json", is_flag=True, help="Print a JSON list of GPUs.")
def gpus(as_json: bool) -> None:
    """The box's GPUs: memory in use, utilisation, and the job each is given to (`submit --gpus N` gives a
    job N GPUs of its own). The devices are those NVML sees, or those the daemon's config or TFRUN_GPUS
    names."""

    found = _ask(ListGpus(), GpuList).gpus
    if as_json:
        click.echo(render.to_json(found))
    else:
        render.gpu_table(found, _console())


@main.command()
@host_options
@click.argument("job", shell_complete=completion.jobs)
def attach(job: str) -> None:
    """Open JOB's terminal: a job submitted with --tty runs in a tmux session on the box; this attaches to
    it, to answer input() or drive a breakpoint(). Ctrl-b d detaches and leaves the job running."""
    from tfrun.client.attach import attach_here, attach_remote

    command = _ask(Attach(job=job), AttachReply).command
    host = _target().host
    if host is None:
        try:
            attach_here(command)
        except TfrunError as exc:
            _fail(exc.message, exc.exit_code)
    else:
        sys.exit(_run(attach_remote(host, _target().accept_new_host_key, command)))


@main.command()
@host_options
@click.option("-d", "--interval", type=click.FloatRange(0.2, 3600), default=1.0, show_default=True, metavar="SECONDS",
              help="Time between two frames.")  # fmt: skip
@click.option("--once", is_flag=True, help="Print one frame and exit (for scripts, or a terminal that is not one).")
def top(interval: float, once: bool) -> None:
    """A live view of the box: its unfinished and last ended jobs with their state, GPUs, runtime, last
    loss and its trend, and its GPUs with their memory, load and job. Redrawn in place every second;
    `q` or Ctrl-C quits. Works the same over SSH."""
    from tfrun.client.top import show

    _run(_with_channel(lambda channel: show(channel, _console(), interval, once)))


# -- alerts and metrics -------------------------------------------------------------------------------------


@main.command()
@host_options
@click.argument("job", required=False, shell_complete=completion.jobs)
@click.option("-n", "--last", type=click.IntRange(1, MAX_ALERTS), default=20, show_default=True, metavar="N",
              help="Show the newest N alerts.")  # fmt: skip
@click.option("--verbose", is_flag=True, help="Show each alert's whole message, as it was sent.")
@click.option("--json", "as_json", is_flag=True, help="Print a JSON list of alerts with their deliveries.")
def alerts(job: Optional[str], last: int, verbose: bool, as_json: bool) -> None:
    """What fired, when, and whether it was delivered: the alerts of JOB, or of every job and the box.

    Each alert is stored on the box before it is sent, then delivered to the daemon's notify URLs (its
    config.toml) and the job's --notify URLs, retried with backoff for a day while a server is down.
    URLs are shown with their secrets masked."""

    found = _ask(ListAlerts(job=job, limit=last), AlertList).alerts
    if as_json:
        click.echo(render.to_json(found))
    else:
        render.alert_lines(found, verbose, _console())


@main.command("notify-test")
@host_options
@click.argument("url", required=False)
@click.option("--json", "as_json", is_flag=True, help="Print one JSON result per URL.")
def notify_test(url: Optional[str], as_json: bool) -> None:
    """Send a test message from the box to URL (any apprise URL), or to each notify URL of the daemon's
    config; say for each whether it was sent or why not. Exits 1 if any failed. Nothing is retried.

    A URL apprise cannot use is refused with what is wrong with it (exit 2), e.g. `mailto://HOST?to=ADDR`:
    "needs a sender: add from=ADDRESS"; a slack:// short of a token; an unknown service. Secrets in URLs
    are never shown."""

    results = _ask(NotifyTest(url=url), NotifyReport).results
    if as_json:
        click.echo(render.to_json(results))
    else:
        for result in results:
            if result.state == "sent":
                click.echo(f"sent to {result.target}")
            else:
                click.echo(f"tfrun: not sent to {result.target}: {result.error}", err=True)
    sys.exit(EXIT_OK if all(result.state == "sent" for result in results) else EXIT_FAILURE)


@main.command()
@host_options
@click.argument("job", shell_complete=completion.jobs)
@click.option("-n", "--last", type=click.IntRange(min=1), metavar="N", help="Only the newest N samples "
              "(default: 20 in the table, all with --json).")  # fmt: skip
@click.option("--plot", is_flag=True, help="Draw the loss (and val_loss) over steps in the terminal.")
@click.option("--png", type=click.Path(dir_okay=False, writable=True, path_type=Path), metavar="FILE",
              help="Save the loss (and val_loss) over steps as a PNG (needs matplotlib: tfrun[png]).")  # fmt: skip
@click.option("-m", "--metric", "names", multiple=True, metavar="NAME", help="Plot NAME instead of loss and "
              "val_loss; repeatable.")  # fmt: skip
@click.option("--explain", is_flag=True, help="Show how the daemon reads JOB's output: one line of each shape "
              "(N of them with -n, default 30), what was read from it, at which step, and why; for a loss it "
              "misses, write a --metric pattern at submit.")  # fmt: skip
@click.option("--json", "as_json", is_flag=True, help="Print the samples (or --explain's lines) as JSON.")
def metrics(
    job: str,
    last: Optional[int],
    plot: bool,
    png: Optional[Path],
    names: tuple[str, ...],
    explain: bool,
    as_json: bool,
) -> None:
    """JOB's metrics by step: exact per-step values when the script uses tfrun.jobs (its callback or
    Progress), else what the daemon read from its output: Keras and tqdm/Lightning progress bars, prints
    such as `step 100 loss=1.23`, `iter 5: loss 2.1`, dicts and JSON lines, and --metric patterns. Keras
    prints a running mean of each epoch; the values here are the means over the steps between two of its
    prints, worked back from them. A line's step is the one it prints; --explain shows which, line by line."""

    if explain:
        if plot or png is not None or names:
            _fail("--explain shows lines, not curves: leave out --plot, --png and --metric", EXIT_USAGE)
        answer = _ask(ExplainMetrics(job=job, lines=min(last or 30, 1000)), MetricsExplained)
        if as_json:
            click.echo(render.to_json(answer.readings))
        else:
            render.explained(answer.readings, answer.truncated, _console())
        return
    whole = as_json or plot or png is not None
    reply = _ask(GetMetrics(job=job, last=last if (last or whole) else 20), MetricsReply)
    if as_json:
        click.echo(render.to_json(reply.samples))
    elif not (plot or png):
        render.metric_table(reply.source, reply.samples, _console())
    if not (plot or png):
        return
    from tfrun.client import plot as plotting

    wanted = names or plotting.default_names(reply.samples)
    curves = plotting.series(reply.samples, wanted)
    if not curves:
        _fail(f"job {job} has no {' or '.join(wanted)} to plot yet", EXIT_FAILURE)
    if plot:
        console = _console()
        width = max(20, min(console.width, 120) - 12)
        for line in plotting.chart(curves, width=width):
            console.print(line, soft_wrap=True)
    if png is not None:
        try:
            plotting.save_png(png, curves, f"job {job}")
        except ImportError:
            _fail("--png needs matplotlib: pip install 'tfrun[png]'", EXIT_USAGE)
        except OSError as exc:
            _fail(f"cannot write {png}: {exc.strerror}", EXIT_USAGE)
        click.echo(f"wrote {png}", err=True)


# -- files back ---------------------------------------------------------------------------------------------


@main.command()
@host_options
@click.argument("job", shell_complete=completion.jobs)
@click.option("--json", "as_json", is_flag=True, help="Print a JSON list instead of a table.")
def checkpoints(job: str, as_json: bool) -> None:
    """List what is in JOB's checkpoint folder on the box: each checkpoint's step, when it was saved, and
    its size. A restarted job shares its checkpoint folder with the job it runs again.
    `tfrun pull JOB` copies the folder here."""

    points = render.checkpoints(_ask(ListFiles(job=job, path="checkpoints"), FileList).files)
    if as_json:
        click.echo(render.to_json(points))
    else:
        render.checkpoint_table(points, _console())


@main.command()
@host_options
@click.argument("job", shell_complete=completion.jobs)
@click.argument("paths", nargs=-1, metavar="[PATH]...")
@click.option(
    "--to",
    "dest",
    type=click.Path(file_okay=False, path_type=Path),
    default=Path("."),
    show_default=True,
    help="Folder to copy into (created if needed).",
)
def pull(job: str, paths: tuple[str, ...], dest: Path) -> None:
    """Copy a job's checkpoints or files back to this machine.

    PATH is "checkpoints[/...]" (the job's checkpoint folder, the default), "work/..." (its work dir
    snapshot, with whatever the job wrote there), or "output.log". Each lands under --to with its last
    part's name: `tfrun pull 3 work/results` writes ./results/. Symlinks are not followed or copied.
    """
    from tfrun.client.transfer import pull as pull_files

    wanted = list(paths) or ["checkpoints"]

    async def conversation(channel: Channel) -> tuple[int, int]:
        return await pull_files(channel, job, wanted, dest)

    dest.mkdir(parents=True, exist_ok=True)
    files, total = _run(_with_channel(conversation))
    click.echo(f"pulled {files} file(s), {render.size(total)}, into {dest}", err=True)


# -- the daemon's config -------------------------------------------------------------------------------------


@main.group("config", invoke_without_command=True)
@host_options
@click.option("--json", "as_json", is_flag=True, help="Print path, values and sources as JSON.")
@click.pass_context
def config_verb(ctx: click.Context, as_json: bool) -> None:
    """The box's daemon config (config.toml in tfrund's TFRUN_HOME): show it, change it, reload it.

    Without a command: every setting as tfrund uses it now, as TOML, with where it came from when that is
    not the file (the default, or a TFRUN_* variable in tfrund's environment); notify URLs with their
    secrets masked.

    Every change applies without a restart, and says from when: notify, gpus, max_cpu_jobs and the alert
    cooldown at once (notify for the alerts of jobs already running too); job_python, checkpoint_root,
    default_gpus and the alert rules for jobs submitted from then on. Only what tfrund reads from its
    environment at start (TFRUN_HOME: its state and socket; the TFRUN_* overrides) needs `tfrund stop`.

    \b
    Examples:
      tfrun config                                what tfrund uses now (--json for scripts)
      tfrun config set notify 'mailtos://me:app-password@smtp.example.com?to=me@example.com'
      tfrun config set alerts.rules oom failed stall=1h
      tfrun config set max_cpu_jobs 2
      tfrun config unset max_cpu_jobs             back to its default
      tfrun config reload                         after editing config.toml by hand (or: kill -HUP tfrund)
    """
    if ctx.invoked_subcommand is not None:
        return
    reply = _ask(GetConfig(), ConfigReply)
    if as_json:
        click.echo(daemonconfig.as_json(reply))
    else:
        daemonconfig.show(reply)


@config_verb.command("set")
@host_options
@click.argument("key")
@click.argument("values", nargs=-1, required=True, metavar="VALUE...")
@click.option("--json", "as_json", is_flag=True, help="Print path, changes, values and sources as JSON.")
def config_set(key: str, values: tuple[str, ...], as_json: bool) -> None:
    """Set KEY in the box's config.toml to VALUE, then reload it. Only KEY's lines change, comments stay,
    and the whole would-be file is checked first: a value tfrund would refuse changes nothing.

    KEY is a key of the file, TABLE.KEY inside a table (alerts.cooldown); `tfrun config` lists them. A
    list (notify, gpus, alerts.rules, alerts.metric_patterns) takes each VALUE as an item, replacing the
    list."""
    _config_change(SetConfig(key=key, values=list(values)), as_json, f"set {key} in")


@config_verb.command("unset")
@host_options
@click.argument("key")
@click.option("--json", "as_json", is_flag=True, help="Print path, changes, values and sources as JSON.")
def config_unset(key: str, as_json: bool) -> None:
    """Remove KEY from the box's config.toml, back to its default, then reload it."""
    _config_change(SetConfig(key=key, unset=True), as_json, f"unset {key} in")


@config_verb.command("reload")
@host_options
@click.option("--json", "as_json", is_flag=True, help="Print path, changes, values and sources as JSON.")
def config_reload(as_json: bool) -> None:
    """Read the box's config.toml again and use it now (as SIGHUP to tfrund does); say what changed and from
    when. A file tfrund cannot use is refused with its line, and the running config stays."""
    _config_change(ReloadConfig(), as_json, "reloaded")


def _config_change(request: Message, as_json: bool, what: str) -> None:
    reply = _ask(request, ConfigReply)
    if as_json:
        click.echo(daemonconfig.as_json(reply))
    else:
        daemonconfig.changed(reply, what)


# -- hosts --------------------------------------------------------------------------------------------------


@main.group()
def hosts() -> None:
    """The boxes tfrun knows (kept in ~/.config/tfrun/config.toml, or TFRUN_CONFIG)."""


@hosts.command("list")
@click.option("--json", "as_json", is_flag=True, help="Print the hosts as JSON.")
def hosts_list(as_json: bool) -> None:
    """List configured hosts; the default is marked with *."""
    try:
        cfg = config.load()
    except TfrunError as exc:
        _fail(exc.message, exc.exit_code)
    if as_json:
        click.echo(
            render.to_json({"default_host": cfg.default_host, "hosts": {n: h.as_toml() for n, h in cfg.hosts.items()}})
        )
        return
    if not cfg.hosts:
        click.echo("no hosts configured; add one with: tfrun hosts add NAME user@host[:port]")
    for name, host in sorted(cfg.hosts.items()):
        mark = "*" if name == cfg.default_host else " "
        extra = "".join(f" {k}={v}" for k, v in sorted(host.env.items()))
        click.echo(f"{mark} {name}  {host.destination}  tfrund={host.tfrund}{extra}")


@hosts.command("add")
@click.argument("name")
@click.argument("destination")
@click.option("--tfrund", "tfrund_command", default="tfrund", show_default=True, help="tfrund's command on the box.")
@click.option("--python", help="Job interpreter on the box (default: the daemon's).")
@click.option("--identity-file", metavar="PATH", help="The private key to log in with, also on --jump hosts "
              "(default: ~/.ssh/config's IdentityFile, the agent's keys, ~/.ssh/id_*).")  # fmt: skip
@click.option("--jump", metavar="USER@HOST[:PORT][,...]", help="Reach the box through these hosts in turn, "
              "each host key checked (like ssh -J; ProxyJump).")  # fmt: skip
@click.option(
    "--env", "env_pairs", multiple=True, metavar="NAME=VALUE", help="Environment for tfrund, e.g. TFRUN_HOME."
)
@click.option("--accept-new-host-key", is_flag=True, help="Trust the box's host key the first time it is seen.")
@click.option("--default", "make_default", is_flag=True, help="Make it the default host.")
@click.option("--install", is_flag=True, help="Then install this tfrun on the box and start tfrund there, as tfrun "
              f"hosts install does ({WHEELHOUSE_ENV}=DIR: --offline with the wheels in DIR).")  # fmt: skip
def hosts_add(
    name: str,
    destination: str,
    tfrund_command: str,
    python: Optional[str],
    env_pairs: tuple[str, ...],
    accept_new_host_key: bool,
    make_default: bool,
    install: bool,
    identity_file: Optional[str],
    jump: Optional[str],
) -> None:
    """Add (or replace) host NAME reached at DESTINATION (user@host[:port], or a Host of ~/.ssh/config)."""
    if name == config.LOCAL or validate_name(name):
        raise click.BadParameter(f"{name!r} cannot name a host", param_hint="NAME")
    try:
        cfg = config.load()
        cfg.hosts[name] = config.Host(
            destination=destination,
            name=name,
            tfrund=tfrund_command,
            python=python,
            accept_new_host_key=accept_new_host_key,
            env=_parse_env(env_pairs),
            identity_file=config.identity_path(identity_file) if identity_file else None,
            jump=config.check_jump(jump) if jump else None,
        )
        if make_default or cfg.default_host is None:
            cfg.default_host = name
        cfg.save()
    except TfrunError as exc:
        _fail(exc.message, exc.exit_code)
    click.echo(f"added {name} ({destination}){' as the default host' if cfg.default_host == name else ''}")
    if install:
        wheels = os.environ.get(WHEELHOUSE_ENV)
        _install_on(name, accept_new_host_key, offline=False, wheels=Path(wheels) if wheels else None)


@hosts.command("remove")
@click.argument("name")
def hosts_remove(name: str) -> None:
    """Forget host NAME."""
    try:
        cfg = config.load()
    except TfrunError as exc:
        _fail(exc.message, exc.exit_code)
    if name not in cfg.hosts:
        _fail(f"no host {name!r} (see tfrun hosts list)", EXIT_USAGE)
    del cfg.hosts[name]
    if cfg.default_host == name:
        cfg.default_host = None
    cfg.save()
    click.echo(f"removed {name}")


@hosts.command("install")
@click.argument("name", required=False, envvar="TFRUN_HOST")
@click.option("--offline", is_flag=True, help="Send the dependencies along: wheels for the box's Python and "
              "platform, downloaded here, so the box needs no package index.")  # fmt: skip
@click.option("--wheels", type=click.Path(exists=True, file_okay=False, path_type=Path), envvar=WHEELHOUSE_ENV,
              metavar="DIR", help=f"Take those wheels from DIR instead of downloading them; implies --offline "
              f"(env {WHEELHOUSE_ENV}).")  # fmt: skip
@click.option("--python", metavar="PY", help="The box's Python to make the venv with (default: python3, else the "
              "newest python3.X; 3.9 or newer).")  # fmt: skip
@click.option("--venv", default=DEFAULT_BOX_VENV, show_default=True, metavar="DIR", help="Where the venv goes on "
              "the box (~ is the box's home).")  # fmt: skip
@click.option("--force", is_flag=True, help="Install even when the box has this version (e.g. a development build "
              "of other files).")  # fmt: skip
@click.option("--accept-new-host-key", is_flag=True, help="Trust the box's host key the first time it is seen.")
@click.option("--json", "as_json", is_flag=True, help="Print what was done as JSON: action (installed, upgraded, "
              "downgraded, reinstalled, unchanged), version, previous, tfrund, python, daemon_pid, ...")  # fmt: skip
def hosts_install(
    name: Optional[str],
    offline: bool,
    wheels: Optional[Path],
    python: Optional[str],
    venv: str,
    force: bool,
    accept_new_host_key: bool,
    as_json: bool,
) -> None:
    """Install this client's own tfrun on host NAME's box and start tfrund there, with nothing but SSH.

    It builds a wheel of this tfrun, copies it over tfrun's SSH connection, makes a venv on the box with its
    Python (3.9 or newer), installs the wheel there with its dependencies (from the box's package index, or
    with --offline from wheels sent from here), starts tfrund from it and records that tfrund for NAME.
    Run again, it does nothing while the box has this version (--force: install anyway), and upgrades it
    otherwise (tfrund is restarted; jobs keep running). `tfrun hosts check` says when the versions differ.
    Progress goes to stderr.

    \b
    Examples:
      tfrun hosts add box alice@gpu-box --install   # add the host and install at once
      tfrun hosts install box --offline             # for a box that reaches no package index
    """
    _install_on(name, accept_new_host_key, offline, wheels, python, venv, force, as_json)


def _install_on(
    name: Optional[str],
    accept_new: bool,
    offline: bool,
    wheels: Optional[Path],
    python: Optional[str] = None,
    venv: str = DEFAULT_BOX_VENV,
    force: bool = False,
    as_json: bool = False,
) -> None:
    """`hosts install` and `hosts add --install`: the install (client/install.py), then one summary line."""
    from tfrun.client import install

    options = install.Options(venv=venv, python=python, offline=offline, wheels=wheels, force=force)
    result = _run(install.install(name, options, accept_new, lambda line: click.echo(f"tfrun: {line}", err=True)))
    click.echo(render.to_json(result) if as_json else result.summary())


@hosts.command("check")
@click.argument("name", required=False, envvar="TFRUN_HOST")
@click.option("--accept-new-host-key", is_flag=True, help="Trust the box's host key the first time it is seen.")
def hosts_check(name: Optional[str], accept_new_host_key: bool) -> None:
    """Check a host step by step: ssh, host key, tfrund and its version, socket forwarding, then the doctor's
    checks (tfrun doctor) with the interpreter jobs get there (the host's --python, else tfrund's job_python):
    its TensorFlow, CUDA build, GPUs, the driver, the checkpoint root. Exits 125 if any step fails."""
    try:
        host = config.resolve(name, config.load())
    except TfrunError as exc:
        _fail(exc.message, exc.exit_code)
    if host is None:
        _fail("no host given and no default host configured", EXIT_USAGE)
    from tfrun.client import ssh

    ok = _run(ssh.check(host, accept_new_host_key, lambda good, step: click.echo(f"{_STEP_LABEL[good]} {step}")))
    sys.exit(EXIT_OK if ok else EXIT_DAEMON)


# How `hosts check` marks a step: passed or failed, or a doctor's check by its status.
_STEP_LABEL: dict[bool | str, str] = {True: "ok ", False: "FAIL", "ok": "ok ", "warn": "warn", "fail": "FAIL"}


@main.command("ssh-config")
@click.argument("name")
@click.argument("destination", required=False)
@click.option("--identity-file", metavar="PATH", help="The private key to log in with (IdentityFile, and "
              "IdentitiesOnly yes: ssh offers no other key). Written as given, ~ and all; a relative path is made "
              "absolute.")  # fmt: skip
@click.option("--user", metavar="USER", help="The user to log in as, over DESTINATION's (the tfrun container: tf).")
@click.option("--port", type=click.IntRange(1, 65535), metavar="PORT", help="The port, over DESTINATION's (the "
              "tfrun container: 2222).")  # fmt: skip
@click.option("--jump", metavar="USER@HOST[:PORT][,...]", help="Reach the box through these hosts in turn "
              "(ProxyJump, like ssh -J).")  # fmt: skip
@click.option("--write", is_flag=True, help="Add the block to ~/.ssh/config (at the top), or replace the one "
              "written before for NAME; tfrun's host NAME, if any, then reaches the box through it.")  # fmt: skip
@click.option("--json", "as_json", is_flag=True, help="Print name, hostname, port, user, identity_file, jump, block "
              "and written (the file, or null) as JSON.")  # fmt: skip
def ssh_config(
    name: str,
    destination: Optional[str],
    identity_file: Optional[str],
    user: Optional[str],
    port: Optional[int],
    jump: Optional[str],
    write: bool,
    as_json: bool,
) -> None:
    """Print the OpenSSH Host block that names a box NAME; with --write, add it to ~/.ssh/config.

    Written once, it serves everything that reaches the box: `ssh NAME`, VS Code Remote-SSH (whose "Connect
    to Host" lists NAME) and tfrun (`tfrun ps --host NAME`, any verb). DESTINATION is user@host[:port] or ssh://user@host:port
    (default: the destination, identity file and jump hosts of tfrun's host NAME, see tfrun hosts list, or the
    block written before). The block keeps idle connections alive (ServerAliveInterval 30) and sets no
    ControlMaster, which VS Code on Windows cannot use.

    --write puts the block at the top of ~/.ssh/config, where OpenSSH's first match wins, between
    `# >>> tfrun ssh-config NAME >>>` and `# <<< ... <<<`; running it again replaces that block and nothing
    else. A `Host NAME` of your own is left alone: that is an error. tfrun's host NAME, if there is one, then
    reaches the box through the block (destination NAME), so ssh, VS Code and tfrun use one address, user,
    port and key: the same as `tfrun hosts add NAME NAME` after writing the block.

    \b
    Example, for the tfrun container (user tf, port 2222):
      tfrun ssh-config box tf@gpu-host:2222 --identity-file ~/.ssh/id_ed25519 --write
      ssh box
      tfrun submit --host box train.py
    """
    from tfrun.client import sshconfig

    written: Optional[Path] = None
    pointed = False
    try:
        entry = sshconfig.entry_for(name, destination, user, port, identity_file, jump)
        if write:
            written = sshconfig.write(entry)
            pointed = sshconfig.point_host_at_block(name)
    except TfrunError as exc:
        _fail(exc.message, exc.exit_code)
    if as_json:
        fields = dataclasses.asdict(entry)
        click.echo(render.to_json({**fields, "block": entry.block(), "written": str(written) if written else None}))
    elif written is not None:
        click.echo(f"wrote Host {name} to {written}" + (f"; tfrun's host {name} now reaches the box through it"
                                                         if pointed else ""))  # fmt: skip
    else:
        click.echo(entry.block(), nl=False)


# -- shell completion ---------------------------------------------------------------------------------------


@main.command("completion")
@click.argument("shell", type=click.Choice(completion.SHELLS))
def completion_script(shell: str) -> None:
    """Print the Tab-completion script for bash, zsh or fish.

    It completes verbs, options, files for SCRIPT, host names (from your config) and job ids, asked of the
    box that --host or the default host names: a daemon that is not running is not started, and one that
    does not answer within a few seconds offers none.

    \b
      bash:  echo 'eval "$(tfrun completion bash)"' >> ~/.bashrc
      zsh:   echo 'eval "$(tfrun completion zsh)"' >> ~/.zshrc    (after compinit)
      fish:  tfrun completion fish > ~/.config/fish/completions/tfrun.fish
    """
    click.echo(completion.script(click.get_current_context().find_root().command, shell))


# -- housekeeping ---------------------------------------------------------------------------------------------


@main.command()
@host_options
@click.argument("jobs", nargs=-1, required=True, metavar="JOB...", shell_complete=completion.jobs)
@click.option("--checkpoints", is_flag=True, help="Remove their checkpoint folders too (never one a kept job shares).")
@click.option("--dry-run", is_flag=True, help="Only say what would be removed and what it would free.")
@click.option("--json", "as_json", is_flag=True, help="Print the outcome as JSON.")
def rm(jobs: tuple[str, ...], checkpoints: bool, dry_run: bool, as_json: bool) -> None:
    """Remove ended jobs from the box: each one's folder (work dir snapshot, log, metrics) and its records
    (events, alerts). Then the uploaded contents that no kept job needs are collected.

    A job that has not ended is refused (cancel it first), and so is one an unfinished job needs: the
    job it runs again (a restart) or runs --after. Checkpoint folders stay unless --checkpoints, and
    even then one that a kept job shares (a restart chain shares its first job's folder); empty ones go.
    JOB is an id or a name (the newest job of that name). Exit 1 if a job stays, 3 if one does not exist.

    \b
    Examples:
      tfrun rm 3 4                 remove jobs 3 and 4; their checkpoints stay
      tfrun rm --checkpoints bert  the newest job named bert, with its checkpoints
    """
    from tfrun.client.housekeeping import show_removals
    from tfrun.constants import MAX_REMOVE_JOBS
    from tfrun.protocol import Remove, RemoveReply

    if len(jobs) > MAX_REMOVE_JOBS:
        raise click.UsageError(f"at most {MAX_REMOVE_JOBS} jobs at once (tfrun prune removes many)")
    reply = _ask(Remove(jobs=list(jobs), checkpoints=checkpoints, dry_run=dry_run), RemoveReply)
    sys.exit(show_removals(reply, as_json))


def _older_than(ctx: click.Context, param: click.Parameter, value: Optional[str]) -> Optional[float]:
    """--older-than's duration in seconds; a usage error that names the option if it is not one."""
    from tfrun.duration import parse_duration

    seconds = None if value is None else parse_duration(value.strip())
    if value is not None and seconds is None:
        raise click.BadParameter(f"{value!r} is not a duration such as 30d, 12h or 90m", ctx, param)
    return seconds


@main.command()
@host_options
@click.option("--older-than", metavar="DURATION", callback=_older_than,
              help="Remove jobs that ended longer ago than this: 30d, 12h, 90m.")  # fmt: skip
@click.option("--keep-last", type=click.IntRange(0, MAX_INT64), metavar="N", help="Keep the N jobs that ended last.")
@click.option("--checkpoints", is_flag=True, help="Remove their checkpoint folders too (never one a kept job shares).")
@click.option("--dry-run", is_flag=True, help="Only say what would be removed and what it would free.")
@click.option("--json", "as_json", is_flag=True, help="Print the outcome as JSON.")
def prune(
    older_than: Optional[float], keep_last: Optional[int], checkpoints: bool, dry_run: bool, as_json: bool
) -> None:
    """Remove ended jobs in bulk, as `tfrun rm` does, and collect the uploaded contents no job needs.

    Given both options, a job goes if both pick it; given neither, no job goes and only the contents
    that no kept job needs are collected. Jobs that have not ended, and those an unfinished job needs,
    always stay.

    \b
    Examples:
      tfrun prune --older-than 30d --dry-run   what a month-old clean-up would remove
      tfrun prune --keep-last 20               all but the 20 jobs that ended last
      tfrun prune                              only the contents no job needs
    """
    from tfrun.client.housekeeping import show_removals
    from tfrun.protocol import Prune, RemoveReply

    request = Prune(older_than=older_than, keep_last=keep_last, checkpoints=checkpoints, dry_run=dry_run)
    sys.exit(show_removals(_ask(request, RemoveReply), as_json, named=False))


@main.command()
@host_options
@click.option("--json", "as_json", is_flag=True, help="Print the figures as JSON (bytes).")
def df(as_json: bool) -> None:
    """What tfrun's folders take on the box: job folders, their logs, uploaded contents (blobs), spare
    snapshots, checkpoints, the database; sizes on disk, as `du` counts them. `tfrun rm` and
    `tfrun prune` free space; max_blob_bytes in the daemon's config.toml caps the uploaded contents."""
    from tfrun.client.housekeeping import show_disk_report
    from tfrun.protocol import DiskReport, DiskUsage

    target = _target()
    show_disk_report(_ask(DiskUsage(), DiskReport), target.host.label if target.host else "local", as_json)
