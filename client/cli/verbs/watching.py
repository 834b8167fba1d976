"""`tfrun top`, `alerts`, `notify-test`, `metrics` and `gpus`: watching jobs and the box."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Optional

import click

from tfrun.constants import EXIT_FAILURE, EXIT_OK, EXIT_USAGE, MAX_ALERTS

from ...calls import watching
from ...errors import error_line
from ...views import render, reports
from .. import hostoptions
from .. import main as cli


@click.command()
@hostoptions.host_options
@click.option("--json", "as_json", is_flag=True, help="Print a JSON list of GPUs.")
def gpus(as_json: bool) -> None:
    """The box's GPUs: memory in use, utilisation, and the job each is given to (`submit --gpus N` gives a
    job N GPUs of its own), or who holds it outside your daemon (another user's job, a process outside
    tfrun), which keeps your jobs off it. The devices are those NVML sees, or those the daemon's config or
    TFRUN_GPUS names."""

    found = cli.call(watching.gpus())
    if as_json:
        click.echo(render.to_json(found))
    else:
        reports.gpu_table(found, cli.output())


@click.command()
@hostoptions.pool_options
@click.option("-d", "--interval", type=click.FloatRange(0.2, 3600), default=1.0, show_default=True, metavar="SECONDS",
              help="Time between two frames.")  # fmt: skip
@click.option("--once", is_flag=True, help="Print one frame and exit (for scripts, or a terminal that is not one).")
def top(interval: float, once: bool) -> None:
    """A live view of the box: its unfinished and last ended jobs with their state, GPUs, runtime, last
    loss and its trend, and its GPUs with their memory, load and job. Redrawn in place every second;
    `q` or Ctrl-C quits. Works the same over SSH.

    With --host POOL (or all): every member's jobs and GPUs in one view, each job as HOST:ID. Each member
    is asked on its own, for at most TFRUN_POOL_TIMEOUT (default 5s): one that does not answer is marked
    unreachable, one that stops answering keeps its last view, marked stale, and neither holds up the rest.

    \b
    Examples:
      tfrun top                        this box (or the default host), live
      tfrun top --host gpu             every member of pool gpu, live
      tfrun top --host all --once      every host, one frame, for a script
    """
    pooled = hostoptions.pool()
    if pooled is not None:
        from .. import poolviews

        poolviews.top_pool(*pooled, interval, once)
        return
    from ...views import top as view

    client = cli.client()
    if once:
        cli.run(view.print_once(client.connect, cli.output()))
    else:
        cli.run(view.show(client.connect, cli.console(), interval, client.place))


# -- alerts and metrics -------------------------------------------------------------------------------------


@click.command()
@hostoptions.pool_options
@click.argument("job", required=False, shell_complete=cli.complete_jobs)
@click.option("-n", "--last", type=click.IntRange(1, MAX_ALERTS), default=20, show_default=True, metavar="N",
              help="Show the newest N alerts.")  # fmt: skip
@click.option("--verbose", is_flag=True, help="Show each alert's whole message, as it was sent.")
@click.option("--json", "as_json", is_flag=True, help="Print a JSON list of alerts with their deliveries.")
def alerts(job: Optional[str], last: int, verbose: bool, as_json: bool) -> None:
    """What fired, when, and whether it was delivered: the alerts of JOB, or of every job and the box.

    Each alert is stored on the box before it is sent, then delivered to the daemon's notify URLs (its
    config.toml) and the job's --notify URLs, retried with backoff for a day while a server is down.
    URLs are shown with their secrets masked.

    With --host POOL (or all): every member's alerts merged by time, the newest N of them, each job named
    by its address (HOST:ID); --json gives each alert its `host` (and `address`). A member that does not
    answer within TFRUN_POOL_TIMEOUT is named on stderr and left out. An alert names its box by the
    daemon's `name` setting (tfrun config --host box2 set name box2), else by its hostname.

    \b
    Examples:
      tfrun alerts                     the newest 20 alerts of this box (or the default host)
      tfrun alerts box2:14 --verbose   job 14 of host box2, each message whole
      tfrun alerts --host gpu -n 50    the newest 50 of every member of pool gpu
    """
    pooled = hostoptions.pool()
    if pooled is not None:
        from .. import poolviews

        if job is not None:
            cli.fail(f"{pooled[0]} is a pool: give JOB as an address HOST:ID (without --host), or leave it out",
                     EXIT_USAGE)  # fmt: skip
        poolviews.alerts_pool(pooled[1], last, verbose, as_json)
        return
    found = cli.call(watching.alerts(job, last))
    if as_json:
        click.echo(render.to_json(found))
    else:
        reports.alert_lines(found, verbose, cli.output())


@click.command("notify-test")
@hostoptions.pool_options
@click.argument("url", required=False)
@click.option("--json", "as_json", is_flag=True, help="Print one JSON result per URL.")
def notify_test(url: Optional[str], as_json: bool) -> None:
    """Send a test message from the box to URL (any apprise URL), or to each notify URL of the daemon's
    config; say for each whether it was sent or why not. Exits 1 if any failed. Nothing is retried.

    A URL apprise cannot use is refused with what is wrong with it (exit 2), e.g. `mailto://HOST?to=ADDR`:
    "needs a sender: add from=ADDRESS"; a slack:// short of a token; an unknown service. Secrets in URLs
    are never shown.

    With --host POOL (or all): every member sends at once, and says in one line how it went (`box1: sent
    to json://...`; failures on stderr, `tfrun: box3: unreachable (...)`); --json gives one record per
    member. Exits 1 if any member failed, refused or did not answer within TFRUN_POOL_TIMEOUT.

    \b
    Examples:
      tfrun notify-test                            each notify URL of the box's config
      tfrun notify-test 'json://hooks.local/tfrun'  that URL, from the box
      pass show slack | tfrun notify-test -         the URL on stdin: off the command line (ps)
      tfrun notify-test --host gpu                 every member of pool gpu, a line each
    """
    if url == "-":  # read from stdin, as `config set notify -` reads its URLs
        (url, *more) = cli.lines_of("-", "URL")
        if more:
            raise click.BadParameter("stdin holds more than one URL: test one at a time", param_hint="URL")
    pooled = hostoptions.pool()
    if pooled is not None:
        from .. import poolviews

        sys.exit(poolviews.notify_test_pool(pooled[1], url, as_json))
    results = cli.call(watching.notify_test(url))
    if as_json:
        click.echo(render.to_json(results))
    else:
        for result in results:
            if result.state == "sent":
                click.echo(f"sent to {result.target}")
            else:
                click.echo(error_line(f"not sent to {result.target}: {result.error}"), err=True)
    sys.exit(EXIT_OK if all(result.state == "sent" for result in results) else EXIT_FAILURE)


@click.command()
@hostoptions.host_options
@click.argument("job", shell_complete=cli.complete_jobs)
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
    such as `step 100 loss=1.23`, `iter 5: loss 2.1`, dicts and JSON lines, boosting rounds
    (`[10] training's l1: 0.34`), column tables, boxes of `| name | value |` rows, and --metric patterns.
    Evaluation figures (val, valid, test, eval) are kept apart from training's. Keras prints a running mean of
    each epoch; the values here are the means over the steps between two of its prints, worked back from them.
    A line's step is the one it prints; --explain shows which, line by line, and which figure is the training
    loss where none is named `loss`."""

    if explain:
        if plot or png is not None or names:
            cli.fail("--explain shows lines, not curves: leave out --plot, --png and --metric", EXIT_USAGE)
        answer = cli.call(watching.explain_metrics(job, min(last or 30, 1000)))
        if as_json:
            click.echo(render.to_json(answer.readings))
        else:
            reports.explained(answer.readings, answer.truncated, cli.output())
        return
    whole = as_json or plot or png is not None
    reply = cli.call(watching.metrics(job, last if (last or whole) else 20))
    if as_json:
        click.echo(render.to_json(reply.samples))
    elif not (plot or png):
        reports.metric_table(reply.source, reply.samples, cli.output())
    if not (plot or png):
        return
    from ...views import plot as plotting

    wanted = names or plotting.default_names(reply.samples)
    curves = plotting.series(reply.samples, wanted)
    if not curves:
        cli.fail(f"job {job} has no {' or '.join(wanted)} to plot yet", EXIT_FAILURE)
    if plot:
        out = cli.output()
        out.write(*plotting.chart(curves, width=max(20, min(out.width, 120) - 12)))
    if png is not None:
        try:
            plotting.save_png(png, curves, f"job {job}")
        except ImportError:
            cli.fail("--png needs matplotlib: pip install 'tfrun[png]'", EXIT_USAGE)
        except OSError as exc:
            cli.fail(f"cannot write {png}: {exc.strerror}", EXIT_USAGE)
        click.echo(f"wrote {png}", err=True)
