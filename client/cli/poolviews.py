"""The pool side of `ps`, `submit`, `top`, `alerts` and `notify-test` given `--host POOL`: many boxes as one,
each member asked at once with a short wait (client/pools/members.py), placement by client/pools/placement.py,
top's view by client/pools/top.py. Jobs are named by their addresses, HOST:ID."""

from __future__ import annotations

import sys
from typing import Any, Optional

import click

from tfrun.constants import EXIT_DAEMON, EXIT_FAILURE, EXIT_OK, EXIT_USAGE
from tfrun.protocol.jobs import Job
from tfrun.protocol.watching import Delivery

from ..calls import jobs as job_calls
from ..calls import watching
from ..config import settings as config
from ..config.settings import Host
from ..errors import TfrunError, error_line
from ..pools.members import Answer, ask_all, distinct, member_wait, note_skipped
from ..pools.placement import Figures, choose
from ..views import render, reports
from . import main as cli


def wait_s() -> float:
    try:
        return member_wait(config.load())
    except TfrunError as exc:
        cli.fail(exc.message, exc.exit_code)


def accept_new_keys() -> bool:
    return cli.target().accept_new_host_key


def ps_pool(
    name: str, members: list[Host], show_all: bool, last: Optional[int], quiet: bool, as_json: bool, services: bool
) -> None:
    """`tfrun ps --host POOL`: every member's jobs (and services, if asked), each once, as HOST:ID; with `last`,
    each member's newest `last`."""
    from ..views.joblist import left_out, newest

    listing = job_calls.job_list(show_all, last, services)
    answers = note_skipped(cli.run(ask_all(distinct(members), listing, wait_s(), accept_new_keys())))
    listed = [(a.host.label, newest(a.reply, last)) for a in answers if a.reply]
    jobs: list[tuple[str, Job]] = [(host, job) for host, (shown, _) in listed for job in shown]
    if as_json:
        click.echo(render.to_json([{**as_record(job), "host": host, "address": f"{host}:{job.id}"}
                                   for host, job in jobs]))  # fmt: skip
    elif quiet:
        click.echo("".join(f"{host}:{job.id}\n" for host, job in jobs), nl=False)
    else:
        render.pool_job_table(jobs, cli.output(), f"pool {name} ({len(answers)} of {len(members)} hosts)")
        left_out(sum(older for _, (_, older) in listed))


def as_record(item: Any) -> dict[str, Any]:
    """A reply's dataclass (a job, an alert, a delivery) as a JSON record."""
    import dataclasses

    found: dict[str, Any] = dataclasses.asdict(item)
    return found


def place(name: str, members: list[Host], gpus: Optional[int], dry_run: bool) -> Host:
    """`submit --host POOL`: the member that can start the job soonest (client/pools/placement.py), said on
    stderr; with `dry_run`, each member's figures, the choice and why, on stdout, and exit."""
    answers = note_skipped(cli.run(ask_all(distinct(members), watching.top(recent=0, losses=0),
                                                       wait_s(), accept_new_keys())))  # fmt: skip
    figures = [Figures.of(a.host, a.reply) for a in answers if a.reply is not None]
    choice = choose(figures, gpus)
    code = EXIT_OK if choice else EXIT_FAILURE if figures else EXIT_DAEMON  # 125 only where none was reached
    if dry_run:
        for member in figures:
            click.echo(f"{member.host.label}: {member.line()}")
        click.echo(f"would place on {choice.figures.host.label}: {choice.why}" if choice else "no member can run it")
        sys.exit(code)
    if choice is None:
        wanted = f"{gpus} GPUs" if gpus is not None else "it"
        cli.fail(f"no member of pool {name} that answered can run {wanted}" if figures else
                 f"no member of pool {name} answered", code)  # fmt: skip
    chosen = choice.figures
    click.echo(f"tfrun: placed on {chosen.host.label} ({chosen.free} of {chosen.total} GPUs free"
               + ("" if chosen.starts_now(gpus) else f", {chosen.queued} queued") + ")", err=True)  # fmt: skip
    return chosen.host


def top_pool(name: str, members: list[Host], interval: float, once: bool) -> None:
    """`tfrun top --host POOL`: client/pools/top.py's view of every member."""
    from ..pools import top as pooltop

    wait, accept_new = wait_s(), accept_new_keys()
    if once:
        cli.run(pooltop.print_once(name, members, cli.output(), wait, accept_new))
    else:
        cli.run(pooltop.show(name, members, cli.console(), interval, wait, accept_new))


def alerts_pool(members: list[Host], last: int, verbose: bool, as_json: bool) -> None:
    """`tfrun alerts --host POOL`: the newest `last` of every member's alerts, merged by time, each naming its
    job by address."""
    listing = watching.alerts(limit=last)
    answers = note_skipped(cli.run(ask_all(distinct(members), listing, wait_s(), accept_new_keys())))
    merged = [(a.host.label, alert) for a in answers if a.reply for alert in a.reply]
    merged = sorted(merged, key=lambda pair: pair[1].at)[-last:]  # stable: ties keep the members' order
    where = [host if alert.job_id is None else f"{host}:{alert.job_id}" for host, alert in merged]
    if as_json:
        records = [{**as_record(alert), "host": host, "address": address if alert.job_id is not None else None}
                   for (host, alert), address in zip(merged, where)]  # fmt: skip
        click.echo(render.to_json(records))
    else:
        reports.alert_lines([alert for _, alert in merged], verbose, cli.output(), where)


def notify_test_pool(members: list[Host], url: Optional[str], as_json: bool) -> int:
    """`tfrun notify-test --host POOL`: every member sends at once; a line (or a JSON record) per member,
    and the exit code: 1 if any member failed, refused or did not answer."""
    if not members:  # `all` with no hosts: nothing was tested, which is no success
        cli.fail("no hosts to test: add one with tfrun hosts add NAME user@host", EXIT_USAGE)
    answers = cli.run(ask_all(distinct(members), watching.notify_test(url), wait_s(), accept_new_keys()))
    records = [_notify_record(answer) for answer in answers]
    if as_json:
        click.echo(render.to_json(records))
    for record in [] if as_json else records:
        if record["ok"]:
            click.echo(f"{record['host']}: sent to " + ", ".join(r["target"] for r in record["results"]))
        elif not record["reachable"]:
            click.echo(error_line(f"{record['host']}: unreachable ({record['error']})"), err=True)
        elif "results" not in record:
            click.echo(error_line(f"{record['host']}: not tested: {record['error']}"), err=True)
        else:
            said = [f"sent to {r['target']}" if r["state"] == "sent" else f"not sent to {r['target']}: {r['error']}"
                    for r in record["results"]]  # fmt: skip
            click.echo(error_line(f"{record['host']}: " + "; ".join(said)), err=True)
    return EXIT_OK if all(record["ok"] for record in records) else EXIT_FAILURE


def _notify_record(answer: Answer[list[Delivery]]) -> dict[str, Any]:
    """One member's notify-test, as --json prints it: reachable, ok, and its results or why there are none."""
    record: dict[str, Any] = {"host": answer.host.label, "reachable": answer.reply is not None or answer.refused}
    if answer.reply is None:
        return {**record, "ok": False, "error": answer.skipped}
    results = [as_record(result) for result in answer.reply]
    return {**record, "ok": all(r["state"] == "sent" for r in results), "results": results}
