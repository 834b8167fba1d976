"""`tfrun forward`: a port on the box, reachable from this machine through tfrun's SSH connection
(client/forward.py)."""

from __future__ import annotations

import asyncio
import json
import sys
from typing import Optional

import click

from tfrun.client import cli
from tfrun.client.config import Host
from tfrun.client.forward import Forward, direct_opener, keeper_opener, local_port_for
from tfrun.constants import EXIT_USAGE


@click.command()
@cli.host_options
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
    """Probe the box's port, listen here, say where, and serve until cancelled (Ctrl-C)."""
    from tfrun.client import keeper

    close = None
    if keeper.enabled():
        open_tunnel = keeper_opener(host, accept_new)
    else:
        open_tunnel, close = await direct_opener(host, accept_new)
    try:
        tunnel = Forward(open_tunnel, box_port, lambda line: click.echo(f"tfrun: {line}", err=True))
        nothing = await tunnel.probe()
        if nothing is not None:
            click.echo(f"tfrun: nothing answers on {host.label} port {box_port} yet ({nothing}); forwarding anyway",
                       err=True)  # fmt: skip
        server = await tunnel.listen(local_port)
        port = server.sockets[0].getsockname()[1]
        if as_json:
            click.echo(json.dumps({"local_port": port, "box_port": box_port, "host": host.label}))
        else:
            click.echo(f"127.0.0.1:{port} -> {host.label} port {box_port} (Ctrl-C stops)")
        sys.stdout.flush()
        async with server:
            await asyncio.Event().wait()  # until Ctrl-C
    finally:
        if close is not None:
            close()
