"""`tfrun pools`: each pool and its members, asked at once (client/pools/members.py). The pool side of the other verbs
given `--host POOL` is client/cli/poolviews.py's."""

from __future__ import annotations

from typing import Any

import click

from ...calls import watching
from ...config import settings as config
from ...errors import TfrunError
from ...pools.members import ask_all, distinct, note_skipped
from ...pools.placement import Figures
from ...views import render
from ...views.styled import Styled
from .. import main as cli
from .. import poolviews


@click.command()
@click.option("--json", "as_json", is_flag=True, help="Print each pool's members and their figures as JSON.")
def pools(as_json: bool) -> None:
    """List each pool with its members: whether each answers, its free and total GPUs, its running and
    queued jobs. Every member is asked at once, each for at most TFRUN_POOL_TIMEOUT (default 5s, or
    pool_timeout in the client config); one that does not answer is marked so and named on stderr.

    \b
    Examples:
      tfrun hosts add box1 alice@gpu1 --pool gpu     box1 joins pool gpu (--pool repeats)
      tfrun pools                                    gpu: box1 2/4 GPUs free, 1 running, 0 queued, ...
      tfrun ps --host gpu                            the jobs of every member, each as HOST:ID
      tfrun submit --host gpu --gpus 2 train.py      on the member that can start it soonest
    """
    try:
        cfg = config.load()
    except TfrunError as exc:
        cli.fail(exc.message, exc.exit_code)
    named = config.pools(cfg)
    members = distinct([host for hosts in named.values() for host in hosts])
    answers = cli.run(ask_all(members, watching.top(recent=0, losses=0), poolviews.wait_s()))
    note_skipped(answers)
    found = {answer.host.identity: answer for answer in answers}
    table: dict[str, list[dict[str, Any]]] = {}
    for pool, hosts in named.items():
        rows = table.setdefault(pool, [])
        for host in hosts:
            answer = found[host.identity]
            row: dict[str, Any] = {"host": host.label, "reachable": answer.reply is not None}
            if answer.reply is not None:
                figures = Figures.of(host, answer.reply)
                row.update(free_gpus=figures.free, gpus=figures.total, running=figures.running,
                           queued=figures.queued)  # fmt: skip
            else:
                row["reason"] = answer.skipped
            rows.append(row)
    if as_json:
        click.echo(render.to_json(table))
        return
    if not table:
        click.echo("no pools; add a host to one with: tfrun hosts add NAME user@host --pool POOL")
        return
    body: list[list[render.Cell]] = []
    for pool, rows in table.items():
        for row in rows:
            if row["reachable"]:
                figures_cells = [f"{row['free_gpus']}/{row['gpus']}", str(row["running"]), str(row["queued"])]
                body.append([pool, row["host"], "yes", *figures_cells])
            else:
                body.append([pool, row["host"], Styled("no", "red"), "-", "-", "-"])
    render.print_table(cli.output(), ("POOL", "HOST", "REACHABLE", "FREE/GPUS", "RUNNING", "QUEUED"), body)
