"""`tfrun checkpoints` and `tfrun pull`: what a job saved, and copying it here."""

from __future__ import annotations

from pathlib import Path

import click

from ...calls import files as file_calls
from ...views import render, reports
from .. import hostoptions
from .. import main as cli


@click.command()
@hostoptions.host_options
@click.argument("job", shell_complete=cli.complete_jobs)
@click.option("--json", "as_json", is_flag=True, help="Print a JSON list instead of a table.")
def checkpoints(job: str, as_json: bool) -> None:
    """List what is in JOB's checkpoint folder on the box: each checkpoint's step, when it was saved, and
    its size. A restarted job shares its checkpoint folder with the job it runs again.
    `tfrun pull JOB` copies the folder here."""

    points = reports.checkpoints(cli.call(file_calls.files(job)))
    if as_json:
        click.echo(render.to_json(points))
    else:
        reports.checkpoint_table(points, cli.output())


@click.command()
@hostoptions.host_options
@click.argument("job", shell_complete=cli.complete_jobs)
@click.argument("paths", nargs=-1, metavar="[PATH]...")
@click.option(
    "--to",
    "dest",
    type=click.Path(file_okay=False, path_type=Path),
    default=Path("."),
    show_default=True,
    help="Folder to copy into (created if needed).",
)
def pull(job: str, paths: tuple[str, ...], dest: Path) -> None:
    """Copy a job's checkpoints or files back to this machine.

    PATH is "checkpoints[/...]" (the job's checkpoint folder, the default), "work/..." (its work dir
    snapshot, with whatever the job wrote there), "output.log", or "task-I.log" (the output of task I > 0 of
    a job on several Slurm nodes, submit --nodes). Each lands under --to with its last part's name:
    `tfrun pull 3 work/results` writes ./results/. Symlinks are not followed or copied, neither those the
    box lists nor those already under --to; nothing is written into or over another user's folder or file,
    and modes follow your umask. What the box lists outside what was asked is refused, and named.
    """
    from ...files.transfer import landed

    asked = list(paths) or ["checkpoints"]
    dest.mkdir(parents=True, exist_ok=True)
    files, total = cli.run(cli.client().pull(job, asked, dest))
    click.echo(f"pulled {files} file(s), {render.size(total)}, into {landed(dest, asked)}", err=True)
