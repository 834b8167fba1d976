"""A job's log printed as the CLI prints it: its bytes to stdout as they come, and a followed job's exit code
(`tfrun logs`, `submit -f`, `wait --logs`)."""

from __future__ import annotations

import sys
from collections.abc import AsyncIterator
from typing import Optional

import click

from tfrun.protocol.logs import LogEnd, LogQuery
from tfrun.protocol.wire import ProtocolError

from ..library.api import AsyncClient
from ..link.follow import LogCursor
from . import main as cli


async def print_chunks(chunks: AsyncIterator[bytes]) -> None:
    """Write a log's bytes to stdout as they come."""
    out = sys.stdout.buffer
    async for data in chunks:
        try:
            out.write(data)
            out.flush()
        except BrokenPipeError:
            raise cli.StdoutClosed from None


async def follow_job(client: AsyncClient, job: str, query: Optional[LogQuery] = None) -> int:
    """Print the job's output until it ends (client/link/follow.py), through daemon restarts and into the job
    that runs it again after a failure; return its exit code."""
    cursor = LogCursor()
    await print_chunks(client.log_chunks(job, follow=True, query=query, cursor=cursor, on_restart=_restarted))
    if cursor.end is None:
        raise ProtocolError("the log ended without a log_end")
    return cli.job_exit_code(cursor.end.state, cursor.end.exit_code)


def _restarted(job: str, end: LogEnd) -> None:
    click.echo(f"tfrun: job {job} {end.state} (exit code {end.exit_code}); restarted as job {end.restarted_as}",
               err=True)  # fmt: skip
