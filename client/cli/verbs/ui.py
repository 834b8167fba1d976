"""`tfrun ui`: every box's jobs, their logs and loss curves in a web browser (client/ui/)."""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING, Optional

import click

from tfrun.constants import EXIT_USAGE

from ...errors import TfrunError
from .. import hostoptions
from .. import main as cli

if TYPE_CHECKING:
    from ...config.settings import Host


@click.command()
@hostoptions.every_box_options
@click.option("--port", type=click.IntRange(0, 65535), default=0, metavar="PORT",
              help="The local port to serve on, 127.0.0.1 only (default: any free one).")  # fmt: skip
@click.option("--open", "open_browser", is_flag=True, help="Open the page in a web browser.")
@click.option("--read-only", is_flag=True, help="Show jobs only: no cancel or restart buttons, and the server refuses "
              "both.")  # fmt: skip
def ui(port: int, open_browser: bool, read_only: bool) -> None:
    """See training in a web browser: every box's jobs, each job's log followed live and its metrics by step,
    jobs compared, the GPUs and the alerts. The jobs page is one table of every box's jobs (box, state, runtime,
    last loss and its trend), newest first; a job's page has its command, the names of its --env, its log
    (filtered on the box, as `tfrun logs` filters), a chart of each metric, its alerts and checkpoints, with
    cancel and restart. Compare overlays one metric of the jobs ticked (or an array's tasks) and tables their
    arguments and final and best values; GPUs shows each box's GPUs, their job and their last hour; Alerts,
    every alert and its delivery. It serves on this machine's 127.0.0.1 and talks to each
    box's tfrund as every verb does: nothing new listens on a box. It prints its URL, with a key for this run
    (asked once, then kept by the browser as a cookie); only you, in your browser, can use it: another user
    of this machine is refused at the port. Ctrl-C stops it.

    Without --host it shows this machine's daemon and every configured host; with --host, that box or pool's.

    \b
    Examples:
      tfrun ui --open                  # every box, in the browser
      tfrun ui --host gpu --read-only  # the pool gpu's boxes, without the cancel and restart buttons
      tfrun ui --port 8765             # a fixed port, to keep a bookmark
    """
    shown = _shown()
    cli.run(_serve(shown, port, open_browser, read_only))


def _shown() -> tuple[Optional[list[Host]], bool]:
    """Which boxes: the configured hosts and this machine (None, True) unless --host or TFRUN_HOST named a
    host, `local` or a pool."""
    from click.core import ParameterSource

    ctx = click.get_current_context()
    source = ctx.get_parameter_source("host")
    if source not in (ParameterSource.COMMANDLINE, ParameterSource.ENVIRONMENT):
        return None, True
    pool = hostoptions.pool()
    if pool is not None:
        return pool[1], False
    host = cli.target().host
    return ([], True) if host is None else ([host], False)


async def _serve(shown: tuple[Optional[list[Host]], bool], port: int, open_browser: bool, read_only: bool) -> None:
    """Listen, print the URL (the only place its key is written), open the browser if asked, serve until Ctrl-C."""
    from ...ui import boxes, server
    from ...ui.auth import Guard
    from ..browser import open_page

    try:
        sock = server.listen(port)
    except OSError as exc:
        raise TfrunError(f"cannot listen on 127.0.0.1:{port}: {exc.strerror or exc}", EXIT_USAGE) from None
    guard = Guard(sock.getsockname()[1], lambda line: click.echo(f"tfrun: {line}", err=True))
    ui = server.Ui(boxes.boxes(shown[0], shown[1], cli.target().accept_new_host_key), read_only)

    def ready() -> None:
        click.echo(guard.url())
        names = ", ".join(ui.boxes) or "no box"
        click.echo(f"tfrun: showing {names}{' (read-only)' if read_only else ''}; Ctrl-C stops", err=True)
        sys.stdout.flush()
        if open_browser:
            open_page(guard.url(), keep=False)

    await server.serve(ui, sock, guard, ready)
