"""`tfrun submit`: a script and a snapshot of its work dir sent to the box as a detached job (or an array of them,
`--array`), with its resources, alerts and restarts."""

from __future__ import annotations

import dataclasses
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Callable, Optional

import click

from tfrun.constants import (
    EXIT_OK,
    MAX_PRIORITY,
    MAX_RESTARTS,
    UPLOAD_WARN_BYTES,
)
from tfrun.protocol.fields import validate_name

from ...config import settings as config
from ...library import submission
from ...views import render
from .. import hostoptions
from .. import main as cli

if TYPE_CHECKING:
    from tfrun.protocol.fields import Cause
    from tfrun.protocol.jobs import Job

    from ...files.snapshot import Snapshot
    from ...library.submission import Submission, Submitted


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


@click.command(context_settings={"ignore_unknown_options": True, "allow_interspersed_args": False})
@click.option("--name", help="A name to refer to the job by (the newest job of a name wins).")
@click.option(
    "--workdir",
    type=click.Path(path_type=Path),
    help="Folder to snapshot and run in (default: the script's folder). SCRIPT must be inside it.",
)
@click.option("--env", "env_pairs", multiple=True, metavar="NAME[=VALUE]", help="Set a variable for the job; "
              "repeatable. NAME alone takes its value from your environment, off the command line (which every "
              "user's ps shows): HF_TOKEN=... tfrun submit --env HF_TOKEN train.py.")  # fmt: skip
@click.option(
    "--python",
    metavar="PATH",
    help="Interpreter for a .py script (default: the host's python setting, else the daemon's job_python, "
    "else python3 on the daemon's PATH).",
)
@click.option("-f", "--follow", is_flag=True, help="Follow the job's output and exit with its exit code.")
@click.option("--max-restarts", type=click.IntRange(0, MAX_RESTARTS), default=0, metavar="N", help="If the job "
              "fails or is lost (not cancelled) for a cause of --restart-on, run it again as a new job with the "
              "same snapshot and checkpoint folder, up to N times; with tfrun.jobs it resumes from its last "
              "checkpoint.")  # fmt: skip
@click.option("--restart-on", "restart_on", callback=lambda ctx, param, value: _restart_on(value),
              metavar="CAUSE[,...]", help="The failures --max-restarts restarts: lost (its shim, tfrund or the "
              "machine went; on Slurm a node failure or preemption), oom (out of memory: the OOM killer, Slurm's "
              "memory limit, or an OOM traceback), signal (killed by a signal, not a cancel), error (any other "
              "failure: a non-zero exit), or all. Default lost,oom,signal: an error is mostly the script's own "
              "bug, which fails the same way again (all: after any failure, as tfrun did before "
              "--restart-on).")  # fmt: skip
@click.option("--gpus", type=click.IntRange(min=0), metavar="N", help="GPUs of its own (CUDA_VISIBLE_DEVICES); "
              "it waits until N are free. Default: the daemon's default_gpus, else 1 if the box has GPUs.")  # fmt: skip
@click.option("--priority", type=click.IntRange(-MAX_PRIORITY, MAX_PRIORITY), default=0, metavar="P",
              help="Among waiting jobs, higher P starts first (default 0); equal ones start in the order they "
              "were submitted. On Slurm, a negative P is sbatch --nice=-P (a negative nice needs a Slurm "
              "operator, so P >= 0 is nice 0).")  # fmt: skip
@click.option("--after", "after", multiple=True, metavar="JOB[,JOB...]", help="Start only once these jobs have "
              "succeeded; if one fails, is cancelled or lost, this job fails without starting. An array's name "
              "(submit --array --name N) stands for all of its tasks; an address HOST:ID sends the job to "
              "HOST.")  # fmt: skip
@click.option("--tty", is_flag=True, help="Run it in a tmux session on the box that `tfrun attach JOB` opens (for "
              "breakpoint() or input()); its output still goes to its log.")  # fmt: skip
@click.option("--partition", metavar="P", help="Slurm hosts only: the partition to submit to (sbatch --partition; "
              "default: the host's [slurm] partition, else the cluster's default).")  # fmt: skip
@click.option("--time", "time_limit", metavar="T", help="Slurm hosts only: the job's time limit in Slurm's forms "
              "(60, 4:00:00, 1-12) or 2h (sbatch --time; default: the host's [slurm] time)")  # fmt: skip
@click.option("--nodes", type=click.IntRange(min=1), metavar="N", help="Slurm hosts only: nodes for the "
              "job (sbatch --nodes), one task each with --gpus N of its own and a TF_CONFIG naming them all, for "
              "MultiWorkerMirroredStrategy (tfrun.jobs.setup_gpus).")  # fmt: skip
@click.option("--alert", "alerts", multiple=True, metavar="RULE[=VALUE][,...]", help="Turn on or tune alert rules "
              "for this job: oom, spike[=FACTOR], stall[=TIME], failed, done, lost, storage (e.g. --alert "
              "stall=10m); all are on unless the daemon's config says otherwise (its gpu-memory and disk-full are "
              "the box's).")  # fmt: skip
@click.option("--no-alert", "no_alerts", multiple=True, metavar="RULE[,...]", help="Turn alert rules off for this "
              "job (`all` for every one), e.g. --no-alert done.")  # fmt: skip
@click.option("--notify", multiple=True, metavar="URL", help="Also send this job's alerts to URL (any apprise URL: "
              "mailto://, slack://, json://, ...); repeatable. Kept on the box, never shown unmasked.")  # fmt: skip
@click.option("--notify-file", "notify_files", multiple=True, metavar="FILE", help="As --notify, for each URL in "
              "FILE, one a line (- reads stdin; # comments): a URL holding a secret then never sits on the command "
              "line, which every user's ps shows.")  # fmt: skip
@click.option("--metric", "metric_patterns", multiple=True, metavar="REGEX", help="Read more metrics from the "
              "output: each named group is one, `step`/`epoch` are counters, e.g. 'it (?P<step>\\d+) "
              "f1=(?P<f1>[0-9.]+)'.")  # fmt: skip
@click.option("--array", "array", multiple=True, metavar="KEY=V1,V2,...", help="Run one job per value, a task of "
              "one array: each gets KEY in capitals as a variable (LR=0.1) and --KEY=VALUE after its arguments; "
              "repeated: every combination (at most 1000). Prints the task ids. Slurm: one sbatch --array")  # fmt: skip
@click.option("--checkpoints-to", "checkpoints_to", metavar="URL", help="Copy each checkpoint, once complete, to "
              "object storage under URL (s3://BUCKET/PREFIX; gs://, az://), in a folder of the job's own, so that "
              "`tfrun restart JOB --host OTHER` resumes it elsewhere. Credentials are the box's (~/.aws, AWS_*). "
              "Default: the pool's [pools.NAME] checkpoints_to, else the box's [storage] checkpoints_to; "
              "'none' for no copy.")  # fmt: skip
@click.option("--json", "as_json", is_flag=True, help="Print the job's record as JSON instead of its id (with "
              "--array, a list of the tasks').")  # fmt: skip
@click.option("-y", "--yes", is_flag=True, help="Send a large upload without asking: on a terminal, submit asks "
              "before sending more than confirm_upload_bytes (client config, default 1GB) the box lacks.")  # fmt: skip
@click.option("--dry-run", is_flag=True, help="With --host POOL: print each member's figures, the member it would "
              "go to and why; submit nothing.")  # fmt: skip
@hostoptions.pool_options
@click.argument("script", shell_complete=cli.complete_files)
@click.argument("args", nargs=-1, type=click.UNPROCESSED)
def submit(
    name: Optional[str],
    workdir: Optional[Path],
    env_pairs: tuple[str, ...],
    python: Optional[str],
    follow: bool,
    max_restarts: int,
    restart_on: Optional[tuple[Cause, ...]],
    gpus: Optional[int],
    priority: int,
    after: tuple[str, ...],
    tty: bool,
    partition: Optional[str],
    time_limit: Optional[str],
    nodes: Optional[int],
    alerts: tuple[str, ...],
    no_alerts: tuple[str, ...],
    notify: tuple[str, ...],
    notify_files: tuple[str, ...],
    metric_patterns: tuple[str, ...],
    array: tuple[str, ...],
    checkpoints_to: Optional[str],
    as_json: bool,
    yes: bool,
    dry_run: bool,
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
    notify URLs and to each --notify URL; `tfrun alerts` lists them. Secrets stay off the command line,
    which every user of the machine can read: `--env NAME` takes NAME's value from your environment, and
    `--notify-file FILE` (`-`: stdin) the URLs from a file. Metrics come from tfrun.jobs when the
    script uses it, else from its Keras, Lightning or plain `loss` prints: `tfrun metrics`.

    With --host POOL (a pool of `tfrun hosts add --pool`, or `all`), every member is asked at once and the
    job goes to the one that can start it soonest: one with --gpus N free now (without --gpus, N is what
    that box gives: its default_gpus) and nothing queued (the most free first), else the shortest queue;
    ties go to fewer running jobs, then the name. The choice is said on stderr, and the job's address
    (HOST:ID) printed; a member that does not answer within TFRUN_POOL_TIMEOUT (default 5s) is skipped with
    a line on stderr. --dry-run shows the figures only.

    With --array KEY=V1,V2,... the submit makes one job per value, the tasks of one array (the first task's
    id is the array's): each has its own id, log, state and restarts, gets KEY in capitals as a variable
    (lr=... sets LR), TFRUN_ARRAY_ID and TFRUN_ARRAY_INDEX, and --KEY=VALUE after its arguments. Repeated
    --array options make every combination. A --name is given to each task with its index (sweep-0, sweep-1).
    The task ids are printed one a line; `ps` shows the tasks together under the array's id. On a Slurm host
    the tasks go to Slurm as one array (sbatch --array).

    \b
    Examples:
      tfrun submit train.py --epochs 5                 on the default host; prints the job id
      tfrun submit --host gpu --gpus 2 train.py        on the member of pool gpu that starts it soonest
      tfrun submit --host gpu --dry-run train.py       where it would go, and why
      tfrun submit --array lr=0.1,0.01,0.001 train.py  3 jobs: train.py --lr=0.1 (LR=0.1), ...
      tfrun submit --checkpoints-to s3://ml/ckpt train.py
                                                       checkpoints copied to S3 as they complete
      pass show slack | tfrun submit --env HF_TOKEN --notify-file - train.py
                                                       secrets from your env and stdin, not argv
    """
    from tfrun.protocol.submit import JobOptions

    from ..diskspace import UploadQuestion

    if name is not None and validate_name(name):
        raise click.BadParameter(str(validate_name(name)), param_hint="--name")
    if restart_on is not None and not max_restarts:
        raise click.UsageError("--restart-on goes with --max-restarts N (how many restarts at most)")
    env = cli.parse_env(env_pairs)
    axes = _array(array, env)
    if axes and follow:
        raise click.UsageError("--follow takes one job: follow a task of the array with tfrun logs -f ID")
    args = _script_args(script, args)
    after_jobs = hostoptions.addressed_jobs(tuple(_split(after)))  # --after box2:3: the job goes to box2
    pool = hostoptions.pool()
    if dry_run and pool is None:
        raise click.UsageError("--dry-run goes with --host POOL")
    checkpoints_to = _destination(checkpoints_to, pool[0] if pool else None)
    if pool is not None:
        from ...link.connection import Target
        from ..poolviews import place

        chosen = place(*pool, gpus, dry_run)
        click.get_current_context().obj = Target(chosen, cli.target().accept_new_host_key)
    target = cli.target()
    where = target.host.label if target.host else "the local tfrund"
    options = JobOptions(
        name=name,
        env=env,
        python=python,
        max_restarts=max_restarts,
        restart_on=None if restart_on is None else list(restart_on),
        alerts=_split(alerts),
        no_alerts=_split(no_alerts),
        notify=[*notify, *(url for source in notify_files for url in cli.lines_of(source, "--notify-file"))],
        metric_patterns=list(metric_patterns),
        gpus=gpus,
        priority=priority,
        after=list(after_jobs),
        tty=tty,
        partition=partition,
        time=time_limit,
        nodes=nodes,
        checkpoints_to=checkpoints_to,
    )

    confirm = UploadQuestion(config.confirm_upload_bytes(config.load()), yes, where)
    ready = cli.guarded(lambda: submission.prepare(target, script, args, options, workdir, axes, _snapshot_notes))
    done = _sent_here(ready, confirm) if target.local else None
    if done is None:
        done = cli.run(cli.client().send(ready, confirm))
    job = done.job
    if job.checkpoints_to:  # where `pull`, `checkpoints` and `restart --host` find them with the box gone
        from ...files import storedjobs

        for made in done.tasks or [job]:
            storedjobs.remember(cli.box_name(), made.id, made.name, made.checkpoints_to)
    click.echo(f"tfrun: uploaded {done.files_sent} of {done.files} files ({render.size(done.bytes_sent)})", err=True)
    # Named by address where the host was chosen for the user: placed on a pool's member, or by --after HOST:ID.
    host = f"{target.host.label}:" if target.host and (pool is not None or hostoptions.addressed()) else ""
    address = f"{host}{job.id}"
    if done.tasks:
        _print_array(done.tasks, as_json, host)
    elif as_json:
        click.echo(render.to_json({**dataclasses.asdict(job), "host": target.host.label, "address": address}
                                  if host and target.host else job))  # fmt: skip
    elif follow:
        from ..logprint import follow_job

        click.echo(f"job {address} submitted" + (f", {job.waiting}" if job.waiting else ""), err=True)
        sys.exit(cli.run(follow_job(cli.client(), str(job.id))))
    else:
        click.echo(address)
    sys.exit(EXIT_OK)


def _sent_here(ready: Submission, confirm: Callable[[int, int], None]) -> Optional[Submitted]:
    """The submit over a plain socket, to a daemon up on this machine (client/library/submission.py's `send_here`):
    no asyncio and no API to import, a third of a submit's start. None where the API's way is needed: no
    daemon up (it starts one), a big upload, a daemon that went away meanwhile."""
    channel = cli.guarded(cli.running_daemon)
    if channel is None:
        return None
    where = cli.target()
    return cli.guarded(
        lambda: cli.on_running_daemon(channel, where, lambda: submission.send_here(channel, where, ready, confirm))
    )


def _destination(given: Optional[str], pool: Optional[str]) -> Optional[str]:
    """--checkpoints-to as the request carries it: checked here (a mistake is one line before any upload), the
    pool's default where none is given, "" for 'none' (no copy, whatever the box's default), None for the box's."""
    if given is None and pool is not None:
        settings = config.load().pools.get(pool)
        given = settings.checkpoints_to if settings else None
    if given is None:
        return None
    if given.strip().lower() in ("none", ""):
        return ""
    from tfrun.storage import place

    try:
        return place.parse(given).url
    except place.PlaceError as exc:
        raise click.BadParameter(str(exc), param_hint="--checkpoints-to") from None


def _array(options: tuple[str, ...], env: dict[str, str]) -> list[tuple[str, list[str]]]:
    """The --array options as (key, values), checked as the daemon checks them: a usage error in one line."""
    from tfrun import arrays

    try:
        axes = [arrays.parse(option) for option in options]
        if axes:
            arrays.check(axes, env)
    except arrays.ArrayError as exc:
        raise click.BadParameter(str(exc), param_hint="--array") from None
    return axes


def _restart_on(value: Optional[str]) -> Optional[tuple[Cause, ...]]:
    """--restart-on's causes, checked here as the daemon checks them: an unknown one is a usage error in one
    line that names the valid ones, before anything is uploaded."""
    from tfrun import restarts

    if value is None:
        return None
    try:
        return restarts.parse(value)
    except ValueError as exc:
        raise click.BadParameter(str(exc), param_hint="--restart-on") from None


def _print_array(tasks: list[Job], as_json: bool, host: str) -> None:
    """An array's tasks: their ids one a line (HOST:ID where a pool or an address chose the host), or their
    records as a JSON list."""
    if as_json:
        click.echo(render.to_json(tasks))
        return
    click.echo(f"tfrun: array {host}{tasks[0].array_id}: {len(tasks)} tasks", err=True)
    click.echo("".join(f"{host}{job.id}\n" for job in tasks), nl=False)


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


def _split(values: tuple[str, ...]) -> list[str]:
    """Options that may repeat and take comma-separated lists: --alert oom,stall=5m --alert done."""
    return [part.strip() for value in values for part in value.split(",") if part.strip()]
