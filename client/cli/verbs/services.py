"""Services on the box and ports from it: `tfrun tensorboard`, `tfrun jupyter` (run by the box's daemon as
jobs of their own, runner/handlers/services.py), `tfrun services`, `tfrun stop`, and `tfrun forward` (a port
on the box, reachable from this machine through tfrun's SSH connection, client/link/forward.py)."""

from __future__ import annotations

import asyncio
import json
import sys
import time
from typing import Callable, Optional, TypeVar

import click

from tfrun.constants import EXIT_USAGE
from tfrun.duration import parse_duration
from tfrun.protocol.jobs import Job
from tfrun.protocol.services import ServiceReply

from ...calls import jobs as job_calls
from ...calls import services as service_calls
from ...config.settings import Host
from ...errors import TfrunError
from ...link.forward import Forward, Opener, direct_opener, keeper_opener, local_port_for, service_guard
from ...views import render
from .. import hostoptions
from .. import main as cli

F = TypeVar("F", bound=Callable[..., None])


@click.command()
@hostoptions.host_options
@click.argument("box_port", type=click.IntRange(1, 65535))
@click.argument("local_port", type=click.IntRange(0, 65535), required=False)
@click.option("--json", "as_json", is_flag=True, help="Print the forward as one JSON line (local and box port).")
def forward(box_port: int, local_port: Optional[int], as_json: bool) -> None:
    """Forward LOCAL_PORT on this machine to BOX_PORT on the box, through tfrun's SSH connection to it, until
    Ctrl-C. Whatever listens on the box's 127.0.0.1:BOX_PORT (TensorBoard, Jupyter, a web server of the
    job's) is then at 127.0.0.1:LOCAL_PORT here, and only here: the local port listens on loopback alone.
    Without LOCAL_PORT, the box's number is used if it is free here, else any free port (printed).

    \b
    Examples:
      tfrun forward --host gpu1 6006          # the box's TensorBoard at http://127.0.0.1:6006
      tfrun forward --host gpu1 8888 9999     # the box's port 8888 at 127.0.0.1:9999
      tfrun forward --host gpu1 8000 --json   # {"local_port": 8000, "box_port": 8000, "host": "gpu1"}
    """
    host = cli.target().host
    if host is None:
        cli.fail("forward needs a box (--host NAME or TFRUN_HOST): this machine's ports need no forwarding", EXIT_USAGE)
    accept_new = cli.target().accept_new_host_key
    cli.run(
        _forward(host, accept_new, box_port, local_port_for(box_port) if local_port is None else local_port, as_json)
    )


async def _forward(host: Host, accept_new: bool, box_port: int, local_port: int, as_json: bool) -> None:
    """Probe the box's port, listen here, say where, and serve until cancelled (Ctrl-C). A port one of the
    daemon's services listens on is forwarded while that service serves it, and no longer."""

    def announce(port: int) -> None:
        if as_json:
            click.echo(json.dumps({"local_port": port, "box_port": box_port, "host": host.label}))
        else:
            click.echo(f"127.0.0.1:{port} -> {host.label} port {box_port} (Ctrl-C stops)")

    await _serve(host, accept_new, box_port, local_port, announce, await _service_on(box_port))


async def _service_on(box_port: int) -> Optional[int]:
    """The job id of the daemon's service on `box_port`, if one serves it; None where none does, or where the
    box has no daemon to ask (a port of anything else: forwarded as it is)."""
    from tfrun.protocol.channel import RemoteError

    try:
        found = await cli.client().call(job_calls.services())
    except (TfrunError, RemoteError):
        return None
    return next((job.id for job in found if job.port == box_port), None)


async def _serve(
    host: Host,
    accept_new: bool,
    box_port: int,
    local_port: int,
    announce: Callable[[int], None],
    service: Optional[int],
) -> None:
    """Forward `local_port` to the box's `box_port` (the keeper's connection, or one of this process's own),
    `announce` the port listened on, and serve until cancelled; each connection to a `service`'s port only
    while that service serves it."""
    from ...link import keeperclient

    close = None
    open_tunnel: Opener
    if keeperclient.enabled():
        open_tunnel = keeper_opener(host, accept_new)
    else:
        open_tunnel, close = await direct_opener(host, accept_new)
    try:
        guard = None if service is None else service_guard(cli.client(), service)
        tunnel = Forward(open_tunnel, box_port, lambda line: click.echo(f"tfrun: {line}", err=True), guard)
        nothing = await tunnel.probe()
        if nothing is not None:
            click.echo(f"tfrun: nothing answers on {host.label} port {box_port} yet ({nothing}); forwarding anyway",
                       err=True)  # fmt: skip
        server = await tunnel.listen(local_port)
        announce(server.sockets[0].getsockname()[1])
        sys.stdout.flush()
        async with server:
            await asyncio.Event().wait()  # until Ctrl-C
    finally:
        if close is not None:
            close()


# -- services ----------------------------------------------------------------------------------------------------

_SERVICE_OPTIONS = (
    click.option("--port", "local_port", type=click.IntRange(0, 65535), metavar="PORT",
                 help="The local port to forward (default: the box's port number if it is free here, else any)."),
    click.option("--open", "open_browser", is_flag=True, help="Open the URL in a web browser."),
    click.option("--detach", is_flag=True, help="Start it and return, leaving it running on the box (tfrun services "
                 "lists it, tfrun stop NAME ends it); `tfrun forward` reaches it later."),
    click.option("--json", "as_json", is_flag=True, help="Print the service as one JSON line (name, id, ports, url)."),
)  # fmt: skip


def _service_options(command: F) -> F:
    for option in reversed(_SERVICE_OPTIONS):
        command = option(command)
    return command


@click.command()
@hostoptions.host_options
@click.argument("jobs", nargs=-1, shell_complete=cli.complete_jobs)
@click.option("--since", default="1d", metavar="DURATION", show_default=True,
              help="Without JOB: the jobs made in this last while.")  # fmt: skip
@_service_options
def tensorboard(
    jobs: tuple[str, ...], since: str, local_port: Optional[int], open_browser: bool, detach: bool, as_json: bool
) -> None:
    """Show jobs in TensorBoard: the box runs it (as a service its daemon supervises) over each JOB's TensorBoard
    folder, one run per job named ID-name, and this forwards a local port to it until Ctrl-C, which stops it.
    Without JOB: every job of the last day. A job's folder holds what it wrote to $TFRUN_TENSORBOARD_DIR (a
    Keras TensorBoard callback, or tfrun.jobs' callback with tensorboard=True) and, in its run `printed`, the
    metrics the daemon read from its output: every script gets curves.

    \b
    Examples:
      tfrun tensorboard --host gpu1                  # the last day's jobs at http://127.0.0.1:PORT
      tfrun tensorboard --host gpu1 12 14 --open     # two jobs side by side, in the browser
      tfrun tensorboard --host gpu1 --detach         # leave it running; tfrun services, tfrun stop tensorboard
    """
    seconds = parse_duration(since)
    if seconds is None or not 0 < seconds <= _MAX_SINCE_S:
        raise click.BadParameter(f"{since!r} is not a duration such as 12h or 2d", param_hint="--since")
    reply = cli.run(cli.client().call(service_calls.tensorboard(list(jobs), seconds)))
    _show(reply, local_port, open_browser, detach, as_json)


@click.command()
@hostoptions.host_options
@click.option("--dir", "root_dir", metavar="DIR", help="The folder on the box it opens (default: the home folder).")
@click.option("--gpus", type=click.IntRange(0, 1024), default=0, show_default=True,
              help="GPUs of its own, which jobs do not get meanwhile (the kernels see only these).")  # fmt: skip
@_service_options
def jupyter(
    root_dir: Optional[str], gpus: int, local_port: Optional[int], open_browser: bool, detach: bool, as_json: bool
) -> None:
    """Open JupyterLab on the box: the box's daemon runs it (as a service it supervises, with the job
    interpreter, the same environment jobs get and --gpus GPUs of its own) with a fresh token, and this
    forwards a local port to it and prints the URL with the token, until Ctrl-C, which stops it. It outlives
    a lost connection and a daemon restart; OOM and end alerts apply to it as to jobs.

    \b
    Examples:
      tfrun jupyter --host gpu1 --gpus 1 --open         # a notebook with one GPU, in the browser
      tfrun jupyter --host gpu1 --dir /data/notebooks    # in that folder of the box
      tfrun jupyter --host gpu1 --detach                 # leave it running; tfrun stop jupyter ends it
    """
    reply = cli.run(cli.client().call(service_calls.jupyter(root_dir, gpus)))
    _show(reply, local_port, open_browser, detach, as_json)


_MAX_SINCE_S = 3650 * 86400.0


def _show(reply: ServiceReply, local_port: Optional[int], open_browser: bool, detach: bool, as_json: bool) -> None:
    """Say where the service is; unless detached, forward to it (from a box) and stay until Ctrl-C, then stop
    it, unless it was running before this command (another one's)."""
    host = cli.target().host
    job = reply.job
    name = job.name or str(job.id)

    def announce(port: int) -> None:
        url = f"http://127.0.0.1:{port}{reply.path}"
        if as_json:
            click.echo(json.dumps({"name": name, "id": job.id, "kind": job.service, "box_port": reply.port,
                                   "local_port": port, "url": url, "reused": reply.reused}))  # fmt: skip
        else:
            click.echo(url)
            state = "already running" if reply.reused else "started"
            click.echo(f"tfrun: {name} (job {job.id}) {state} on {cli.place()}, port {reply.port}; "
                       f"{'tfrun stop ' + name + ' ends it' if detach else 'Ctrl-C stops it'}", err=True)  # fmt: skip
        sys.stdout.flush()
        if open_browser:
            from ..browser import open_page

            open_page(url, keep=detach)

    if host is not None and detach:
        if as_json:
            click.echo(json.dumps({"name": name, "id": job.id, "kind": job.service, "box_port": reply.port,
                                   "path": reply.path, "reused": reply.reused}))  # fmt: skip
        else:
            click.echo(f"{name} (job {job.id}) runs on {host.label}, port {reply.port}: "
                       f"tfrun forward --host {host.label} {reply.port}")  # fmt: skip
        return
    if host is None:
        announce(reply.port)  # this machine: its port is here already
        if detach:
            return
    local = local_port_for(reply.port) if local_port is None else local_port
    cli.run(_attached(host, reply, local, announce))


async def _attached(
    host: Optional[Host], reply: ServiceReply, local_port: int, announce: Callable[[int], None]
) -> None:
    """Forward (from a box) until cancelled; then stop the service if this command started it."""
    try:
        if host is None:
            await asyncio.Event().wait()
        else:
            await _serve(host, cli.target().accept_new_host_key, reply.port, local_port, announce, reply.job.id)
    finally:
        if not reply.reused:
            name = reply.job.name or str(reply.job.id)
            await cli.client().cancel([reply.job.id])
            click.echo(f"tfrun: stopped {name} (job {reply.job.id})", err=True)


@click.command()
@hostoptions.host_options
@click.option("--json", "as_json", is_flag=True, help="Print the services as JSON, as ps --json prints jobs.")
def services(as_json: bool) -> None:
    """List the services on the box (TensorBoard, Jupyter) that have not ended: name, job id, state, the box
    port each listens on, its GPUs and how long it has run. `tfrun forward --host BOX PORT` reaches one,
    `tfrun stop NAME` ends it, `tfrun logs NAME` shows its output."""
    found = cli.call(job_calls.services())
    if as_json:
        click.echo(render.to_json(found))
        return
    out = cli.output()
    if not found:
        out.write(f"no services on {cli.place(full=True)}", style="dim")
        return
    now = time.time()
    body = [[job.name or str(job.id), str(job.id), job.service or "", job.state, str(job.port or ""),
             ",".join(job.gpus) or "-", render.duration(now - job.started_at) if job.started_at else "-",
             _over(job)] for job in found]  # fmt: skip
    render.print_table(out, ("NAME", "ID", "KIND", "STATE", "PORT", "GPUS", "UP", "OVER"), body)


def _over(job: Job) -> str:
    """What a service shows: TensorBoard's runs (its --logdir_spec's names), Jupyter's folder."""
    if not job.args:
        return ""
    if job.service == "tensorboard":
        return " ".join(run.split(":", 1)[0] for run in job.args[0].split(","))
    return job.args[0]


@click.command()
@hostoptions.host_options
@click.argument("name", shell_complete=cli.complete_jobs)
def stop(name: str) -> None:
    """Stop a service: NAME as `tfrun services` shows it (tensorboard, jupyter-2) or its job id. It gets
    SIGTERM, and SIGKILL 10 s later if it is still there. A job is stopped with `tfrun cancel`."""
    client = cli.client()
    job = cli.run(client.status(cli.job_refs(name)))
    if job.service is None:
        cli.fail(f"{name} is job {job.id}, not a service: tfrun cancel {name}", EXIT_USAGE)
    (result,) = cli.run(client.cancel([job.id]))
    if not result.ok:
        cli.fail(result.message, EXIT_USAGE)
    click.echo(f"stopped {job.name or job.id} (job {job.id})")
