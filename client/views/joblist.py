"""A job listing as `ps` shows it, with or without --host POOL: the newest jobs of a reply, and the line under a
table that says how many older ones it left out. Apart from either verb's module, which both use it.
"""

from __future__ import annotations

from typing import Optional

import click

from tfrun.protocol.jobs import Job, JobList


def newest(reply: JobList, last: Optional[int]) -> tuple[list[Job], int]:
    """The newest `last` jobs of a listing, and how many older ones it left out: a tfrund older than
    `ListJobs.last` sends every job, and is cut here."""
    cut = 0 if last is None else max(0, len(reply.jobs) - last)
    return reply.jobs[cut:], reply.older + cut


def left_out(older: int) -> None:
    """The line under a table that `-n` cut (on stderr: a pipe's reader gets only rows), and how to see all."""
    if older:
        click.echo(f"tfrun: {older} older job{'s' if older > 1 else ''} not shown (-n 0 shows every job)", err=True)
