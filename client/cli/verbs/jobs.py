"""`tfrun ps`, `status`, `wait`, `cancel` and `restart`: jobs looked at, waited for, stopped and run again."""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING, Optional

import click

from tfrun.constants import (
    DEFAULT_GRACE_S,
    EXIT_DAEMON,
    EXIT_FAILURE,
    EXIT_NO_SUCH_JOB,
    EXIT_OK,
    EXIT_USAGE,
    MAX_CANCEL_JOBS,
    PS_ALL_LAST,
)
from tfrun.protocol.fields import JobState
from tfrun.protocol.jobs import Job, JobList

from ...calls import jobs as job_calls
from ...errors import error_line
from ...views import render
from ...views.joblist import left_out, newest
from .. import hostoptions
from .. import main as cli

if TYPE_CHECKING:
    from ...calls import Call


# -- looking at jobs ----------------------------------------------------------------------------------------


@click.command()
@hostoptions.pool_options
@click.option("-a", "--all", "show_all", is_flag=True, help="Include jobs that have ended (in the table, the "
              f"newest {PS_ALL_LAST} unless -n says).")  # fmt: skip
@click.option("-n", "--last", type=click.IntRange(0), metavar="N", help="Only the newest N jobs (0: every job). "
              f"Default: every job, but the table of -a shows the newest {PS_ALL_LAST}.")  # fmt: skip
@click.option("-q", "--quiet", is_flag=True, help="Print only the job ids, one a line (for xargs or $(...)); with "
              "--host POOL, their addresses (HOST:ID).")  # fmt: skip
@click.option("--json", "as_json", is_flag=True, help="Print a JSON list of job records (with --host POOL, each "
              "with its host and address).")  # fmt: skip
@click.option("--services", "with_services", is_flag=True, help="Include the box's services (TensorBoard, Jupyter: "
              "tfrun services).")  # fmt: skip
def ps(show_all: bool, last: Optional[int], quiet: bool, as_json: bool, with_services: bool) -> None:
    """List jobs that have not ended (with -a, every job).

    The first line names the box (`jobs on box (alice@gpu-box)`, or `this machine`), then one row per job,
    never wrapped: in a pipe each row is whole, so `tfrun ps -a -n 0 | grep NAME` finds the job; on a
    terminal a row too wide for it is cut with an ellipsis. With -a the table shows the newest 100 jobs and
    says on stderr how many older ones it left out (-n N: the newest N; -n 0: every job); -q and --json list
    every job.

    With --host POOL (or `all`: every configured host), every member is asked at once and each job is listed
    once, with its host and its address (HOST:ID), which every verb taking a JOB accepts without --host. A
    member that does not answer within TFRUN_POOL_TIMEOUT (default 5s) is skipped with a line on stderr; -n
    counts the newest of each member.

    \b
    Examples:
      tfrun ps -a                    the default host's newest 100 jobs
      tfrun ps -a -n 0 | grep bert   every job whose row names bert
      tfrun ps --host all            the unfinished jobs of every host
      tfrun logs -f box2:12          follow job 12 of host box2"""
    if quiet and as_json:
        raise click.UsageError("-q and --json do not go together")
    if last is None:  # every job, but the table of -a shows the newest PS_ALL_LAST
        last = PS_ALL_LAST if show_all and not (quiet or as_json) else 0
    newest_only = last or None  # -n 0: every job
    pool = hostoptions.pool()
    if pool is not None:
        from ..poolviews import ps_pool

        ps_pool(*pool, show_all, newest_only, quiet, as_json, with_services)
        return
    if as_json:
        _print_records(job_calls.job_list(show_all, newest_only, with_services, text=True), newest_only)
        return
    jobs, older = newest(cli.call(job_calls.job_list(show_all, newest_only, with_services)), newest_only)
    if quiet:
        click.echo("".join(f"{job.id}\n" for job in jobs), nl=False)
        return
    render.job_table(jobs, cli.output(), cli.place(full=True))
    left_out(older)


def _print_records(listing: Call[JobList, JobList], last: Optional[int]) -> None:
    """`ps --json`: the daemon's JSON text of the list, written part by part as it comes (a long history is
    never held whole here); an older tfrund's records are written as JSON here, cut to `last` as it did not."""

    def take(part: JobList) -> bool:
        if part.data:
            _write(part.data + (b"" if part.more else b"\n"))
        else:
            click.echo(render.to_json(newest(part, last)[0]))
        return part.more

    cli.each(listing, take)


def _write(data: bytes) -> None:
    """Bytes to stdout as they come; a reader that went away (`| head`) ends the verb quietly."""
    try:
        sys.stdout.buffer.write(data)
        sys.stdout.buffer.flush()
    except BrokenPipeError:
        raise cli.StdoutClosed from None


@click.command()
@hostoptions.host_options
@click.argument("job", required=False, shell_complete=cli.complete_jobs)
@click.option("--json", "as_json", is_flag=True, help="Print the job's record as JSON.")
def status(job: Optional[str], as_json: bool) -> None:
    """Show one job: state, exit code, times, folders. JOB is an id or a name; without it, the newest job.

    JOB may be an address, HOST:ID or HOST:NAME (as `ps --host POOL` lists them): it names the job on that
    configured host without --host, as it does for every verb that takes a JOB."""
    record = cli.call(job_calls.job(job)) if job is not None else cli.run(cli.client().newest())
    if as_json:
        click.echo(render.to_json(record))
    else:
        render.job_detail(record, cli.output(), hostoptions.address(record.id))


@click.command()
@hostoptions.host_options
@click.argument("job", shell_complete=cli.complete_jobs)
@click.option("--json", "as_json", is_flag=True, help="Print the final record as JSON.")
def wait(job: str, as_json: bool) -> None:
    """Wait until JOB ends, then exit with its exit code (128+N for signal N, 255 if lost).

    A job restarted after a failure (submit --max-restarts) ends when its last restart does. Through
    daemon restarts and dropped SSH links it reconnects and waits on, however often; it gives up (exit
    125) only once no tfrund answered for TFRUN_RECONNECT_TIMEOUT (default 5m; or reconnect_timeout in
    the client's config.toml).
    """
    record = cli.run(cli.client().wait(job))
    if as_json:
        click.echo(render.to_json(record))
    else:
        code = "-" if record.exit_code is None else record.exit_code
        click.echo(f"job {hostoptions.address(record.id)} {record.state} (exit code {code})", err=True)
    sys.exit(cli.job_exit_code(record.state, record.exit_code))


@click.command()
@hostoptions.host_options
@click.argument("jobs", nargs=-1, metavar="[JOB]...", shell_complete=cli.complete_jobs)
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
    client = cli.client()
    wanted = list(jobs) or [str(job.id) for job in cli.run(client.jobs())]
    if not wanted:
        click.echo(f"tfrun: no unfinished jobs on {cli.place()}", err=True)
    results = cli.run(client.cancel(wanted, grace))
    if as_json:
        click.echo(render.to_json(results))
    for result in [] if as_json else results:
        line = result.message + (f" on {cli.place()}" if result.id is None else "")
        if result.ok:
            click.echo(line)
        elif every and result.state in JobState.FINAL:  # --all: it ended by itself meanwhile, no failure
            click.echo(f"tfrun: {line}", err=True)
        else:
            click.echo(error_line(line), err=True)
    if any(r.id is None for r in results):
        sys.exit(EXIT_NO_SUCH_JOB)
    ended = every and all(r.ok or r.state in JobState.FINAL for r in results)
    sys.exit(EXIT_OK if ended or all(r.ok for r in results) else EXIT_FAILURE)


@click.command()
@hostoptions.moving_options
@click.argument("job", shell_complete=cli.complete_jobs)
@click.option(
    "--env",
    "env_pairs",
    multiple=True,
    metavar="NAME[=VALUE]",
    help="On another box: set a variable "
    "for the job (its --env values are never stored; those of a box that answers are carried over).",
)
@click.option("--gpus", type=click.IntRange(min=0), metavar="N", help="On another box: GPUs of its own (default: "
              "what it had).")  # fmt: skip
@click.option("--python", metavar="PATH", help="On another box: the interpreter of a .py script there (default: "
              "that box's job_python).")  # fmt: skip
@click.option("-f", "--follow", is_flag=True, help="Follow the new job's output and exit with its exit code.")
@click.option("--json", "as_json", is_flag=True, help="Print the new job's record as JSON instead of its id.")
def restart(
    job: str, env_pairs: tuple[str, ...], gpus: Optional[int], python: Optional[str], follow: bool, as_json: bool
) -> None:
    """Run an ended JOB again, as a new job: the same snapshot (not your files as they are now), command,
    environment, and the same checkpoint folder, so a job using tfrun.jobs resumes where it stopped.

    On another box: give the job's address and that box (`tfrun restart box1:3 --host box2`), or a pool
    (`--host gpu`: the member that starts it soonest, never box1), or the job's stored folder
    (`tfrun restart s3://bucket/ckpt/train-1a2b3c4d --host box2`). That needs a job whose checkpoints went to
    object storage (submit --checkpoints-to): the new box fetches its snapshot and its newest stored
    checkpoint into the new job's checkpoint folder before the script starts, and it goes on storing to the
    same folder. It works with box1 gone: the stored folder is what this machine remembers of the job.

    \b
    Examples:
      tfrun restart 3                       job 3 again, on its own box
      tfrun restart box1:3 --host box2      job 3 of box1, on box2, from its newest stored checkpoint
      tfrun restart box1:3 --host gpu       on the member of pool gpu that starts it soonest
    """
    from ..logprint import follow_job

    client = cli.client()
    from tfrun.storage.place import is_url

    moved = is_url(job) or hostoptions.source() is not None
    if moved:
        record = _resume_elsewhere(job, cli.parse_env(env_pairs), gpus, python)
        client = cli.client()  # on the box chosen (a pool's member)
    elif env_pairs or gpus is not None or python is not None:
        raise click.UsageError("--env, --gpus and --python go with a restart on another box (JOB's address and --host)")
    else:
        pool = hostoptions.pool()
        if pool is not None:
            raise click.UsageError(
                f"{pool[0]} is a pool: name where JOB ran with its address (HOST:ID --host {pool[0]})"
            )
        record = cli.run(client.restart(job))
    if as_json:
        click.echo(render.to_json(record))
    elif follow:
        click.echo(f"job {record.id} runs job {record.restart_of or job} again", err=True)
    else:
        click.echo(f"{cli.box_name()}:{record.id}" if moved and cli.target().host else hostoptions.address(record.id))
    sys.exit(cli.run(follow_job(client, str(record.id))) if follow else EXIT_OK)


def _resume_elsewhere(job: str, env: dict[str, str], gpus: Optional[int], python: Optional[str]) -> Job:
    """The job made on --host (or the pool's member chosen) from JOB's stored folder: the folder asked of the
    box JOB ran on, else the one this machine remembers; the env of a box that answers carried over."""
    from tfrun.storage.place import is_url

    from ...calls import storage as storage_calls
    from ...files import storedjobs

    source, where = hostoptions.source(), job if is_url(job) else None
    if where is None and source is not None:
        record = _source_record(source, job)
        if record is not None:
            where, env = record.checkpoints_to, {**record.env, **env}
            if where is None:
                cli.fail(f"job {job} of {source} stores no checkpoints in object storage (submit "
                         "--checkpoints-to): it runs again only on its own box (tfrun restart {source}:{job})",
                         EXIT_USAGE)  # fmt: skip
        else:
            where = storedjobs.recall(source, job)
            if where is None:
                cli.fail(f"{source} cannot be reached, and this machine knows of no stored folder of job {job}: "
                         "give the folder's URL (tfrun checkpoints shows it)", EXIT_DAEMON)  # fmt: skip
            click.echo(f"tfrun: {source} cannot be reached; resuming from {where} (--env values are never stored: "
                       "give them again with --env)", err=True)  # fmt: skip
    assert where is not None
    pool = hostoptions.pool()
    if pool is not None:
        from ...link.connection import Target
        from ..poolviews import place

        members = [host for host in pool[1] if host.name != source]
        chosen = place(pool[0], members, gpus, False)
        click.get_current_context().obj = Target(chosen, cli.target().accept_new_host_key)
    new = cli.call(storage_calls.resume(where, env, gpus, python))
    storedjobs.remember(cli.box_name(), new.id, new.name, new.checkpoints_to)
    click.echo(f"tfrun: job {new.id} on {cli.place()} resumes {where}", err=True)
    return new


def _source_record(source: str, job: str) -> Optional[Job]:
    """JOB's record on the box it ran on, or None when that box cannot be reached."""
    from ...config import settings as config
    from ...library.asyncclient import AsyncClient
    from ...link.connection import Target

    target = Target(config.resolve(source, config.load()), cli.target().accept_new_host_key)
    return cli.reached(lambda: AsyncClient(target).call(job_calls.job(job)))[0]
