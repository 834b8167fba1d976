"""`tfrun rm`, `prune` and `df`: removing ended jobs and what they leave, and what tfrun takes on the box
(rendered by client/cli/diskspace.py)."""

from __future__ import annotations

import sys
from typing import Optional

import click

from tfrun.constants import MAX_INT64

from .. import hostoptions
from .. import main as cli


@click.command()
@hostoptions.host_options
@click.argument("jobs", nargs=-1, required=True, metavar="JOB...", shell_complete=cli.complete_jobs)
@click.option("--checkpoints", is_flag=True, help="Remove their checkpoint folders too (never one a kept job shares).")
@click.option("--storage", is_flag=True, help="Remove their stored copies in object storage too (submit "
              "--checkpoints-to; never a folder a kept job stores to).")  # fmt: skip
@click.option("--dry-run", is_flag=True, help="Only say what would be removed and what it would free.")
@click.option("--json", "as_json", is_flag=True, help="Print the outcome as JSON.")
def rm(jobs: tuple[str, ...], checkpoints: bool, storage: bool, dry_run: bool, as_json: bool) -> None:
    """Remove ended jobs from the box: each one's folder (work dir snapshot, log, metrics) and its records
    (events, alerts). Then the uploaded contents that no kept job needs are collected.

    A job that has not ended is refused (cancel it first), and so is one an unfinished job needs: the
    job it runs again (a restart) or runs --after. Checkpoint folders stay unless --checkpoints, and
    even then one that a kept job shares (a restart chain shares its first job's folder) or one holding a
    checkpoint not yet copied to object storage; empty ones go. A job's stored copies in object storage
    (submit --checkpoints-to) stay unless --storage, which the box deletes with its credentials.
    JOB is an id or a name (the newest job of that name). Exit 1 if a job stays, 3 if one does not exist.

    \b
    Examples:
      tfrun rm 3 4                 remove jobs 3 and 4; their checkpoints stay
      tfrun rm --checkpoints bert  the newest job named bert, with its checkpoints
      tfrun rm --checkpoints --storage 3   job 3, its checkpoints on the box and in object storage
    """
    from tfrun.constants import MAX_REMOVE_JOBS

    from ...calls import housekeeping
    from ..diskspace import show_removals

    if len(jobs) > MAX_REMOVE_JOBS:
        raise click.UsageError(f"at most {MAX_REMOVE_JOBS} jobs at once (tfrun prune removes many)")
    reply = cli.call(housekeeping.remove(list(jobs), checkpoints, dry_run, storage))
    sys.exit(show_removals(reply, as_json, cli.place()))


def _older_than(ctx: click.Context, param: click.Parameter, value: Optional[str]) -> Optional[float]:
    """--older-than's duration in seconds; a usage error that names the option if it is not one."""
    from tfrun.duration import parse_duration

    seconds = None if value is None else parse_duration(value.strip())
    if value is not None and seconds is None:
        raise click.BadParameter(f"{value!r} is not a duration such as 30d, 12h or 90m", ctx, param)
    return seconds


@click.command()
@hostoptions.host_options
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
    from ...calls import housekeeping
    from ..diskspace import show_removals

    removed = cli.call(housekeeping.prune(older_than, keep_last, checkpoints, dry_run))
    sys.exit(show_removals(removed, as_json, cli.place(), named=False))


@click.command()
@hostoptions.host_options
@click.option("--json", "as_json", is_flag=True, help="Print the figures as JSON (bytes).")
def df(as_json: bool) -> None:
    """What tfrun's folders take on the box: job folders, their logs, uploaded contents (blobs), spare
    snapshots, checkpoints, the database; sizes on disk, as `du` counts them. `tfrun rm` and
    `tfrun prune` free space; max_blob_bytes in the daemon's config.toml caps the uploaded contents."""
    from ...calls import housekeeping
    from ..diskspace import show_disk_report

    target = cli.target()
    show_disk_report(cli.call(housekeeping.disk_usage()), target.host.label if target.host else "local", as_json)
