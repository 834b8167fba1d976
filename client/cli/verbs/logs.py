"""`tfrun logs` and `tfrun attach`: a job's output, and its terminal; following a log, which `submit -f` and
`restart -f` do too."""

from __future__ import annotations

import sys
from typing import Optional

import click

from tfrun.constants import EXIT_OK, MAX_CONTEXT, MAX_INT64, MAX_NODES, MAX_PATTERN_CHARS, MAX_PATTERNS
from tfrun.protocol.logs import LogQuery

from ...errors import TfrunError
from .. import hostoptions
from .. import main as cli
from ..logprint import follow_job, print_chunks
from ..timespec import Since, since_option


@click.command()
@hostoptions.host_options
@click.argument("job", required=False, shell_complete=cli.complete_jobs)
@click.option("-f", "--follow", is_flag=True, help="Keep printing until the job ends; exit with its exit code. "
              "Through daemon restarts and dropped SSH links it resumes at the next byte; it gives up only "
              "once no tfrund answered for TFRUN_RECONNECT_TIMEOUT (default 5m, see config.toml).")  # fmt: skip
@click.option("-e", "--regexp", "patterns", multiple=True, metavar="PATTERN", help="Only lines matching PATTERN "
              "(an extended regular expression, as grep -E); repeat to match any of several.")  # fmt: skip
@click.option("--grep", "grep_patterns", multiple=True, metavar="PATTERN", help="The same as -e.")
@click.option("-v", "--invert-match", "invert", is_flag=True, help="Only lines that do NOT match.")
@click.option("-i", "--ignore-case", is_flag=True, help="Match upper and lower case alike.")
@click.option("-F", "--fixed-strings", "fixed", is_flag=True, help="Patterns are plain strings, not expressions.")
@click.option("-n", "--tail", type=click.IntRange(0), metavar="N", help="Start with the last N lines "
              "(that match); any count, more than the log has prints all of it.")  # fmt: skip
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
@click.option("--task", type=click.IntRange(0, MAX_NODES - 1), default=0, metavar="I", help="The output of task "
              "I of a job on several Slurm nodes (submit --nodes), e.g. the worker that crashed; 0, the default, is "
              "the job's own log. A task's log has no times: not with --since or -t.")  # fmt: skip
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
    task: int,
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
      tfrun logs 12 --task 1 -n 30             the last 30 lines of task 1 (submit --nodes 2)
    """
    wanted = LogQuery(
        patterns=[*patterns, *grep_patterns],
        invert=invert,
        ignore_case=ignore_case,
        fixed=fixed,
        tail=None if tail is None else min(tail, MAX_INT64),  # beyond the wire's integers: all the same
        after=after if context is None else context,
        before=before if context is None else context,
        since=since.at if since else None,
        since_ago=since.ago if since else None,
        timestamps=timestamps,
        task=task,
    )
    if (invert or ignore_case or fixed or wanted.after or wanted.before) and not wanted.patterns:
        raise click.UsageError("-v, -i, -F, -A, -B and -C need a pattern (-e PATTERN or --grep PATTERN)")
    if len(wanted.patterns) > MAX_PATTERNS or sum(map(len, wanted.patterns)) > MAX_PATTERN_CHARS:
        raise click.UsageError(f"at most {MAX_PATTERNS} patterns of {MAX_PATTERN_CHARS} characters in all")
    if job is None:
        newest = cli.run(cli.client().newest())
        job = str(newest.id)
        named = f" ({newest.name})" if newest.name else ""
        click.echo(f"tfrun: job {job}{named}, the newest on {cli.place()}", err=True)
    client = cli.client()
    if follow:
        sys.exit(cli.run(follow_job(client, job, wanted)))
    cli.run(print_chunks(client.log_chunks(job, query=wanted)))
    sys.exit(EXIT_OK)


@click.command()
@hostoptions.host_options
@click.argument("job", shell_complete=cli.complete_jobs)
def attach(job: str) -> None:
    """Open JOB's terminal: a job submitted with --tty runs in a tmux session on the box; this attaches to
    it, to answer input() or drive a breakpoint(). Ctrl-b d detaches and leaves the job running."""
    from ..attach import attach_here, attach_remote

    command = cli.run(cli.client().attach_command(job))
    host = cli.target().host
    if host is None:
        try:
            attach_here(command)
        except TfrunError as exc:
            cli.fail(exc.message, exc.exit_code)
    else:
        sys.exit(cli.run(attach_remote(host, cli.target().accept_new_host_key, command)))
