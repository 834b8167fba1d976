"""`tfrun checkpoints` and `tfrun pull`: what a job saved, and copying it here."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Optional

import click

from tfrun.constants import EXIT_DAEMON, EXIT_FAILURE
from tfrun.protocol.fields import is_job_id
from tfrun.storage.place import is_url

from ...calls import storage as storage_calls
from ...views import render
from .. import hostoptions
from .. import main as cli

if TYPE_CHECKING:
    from tfrun.protocol.storage import StoredReply


@click.command()
@hostoptions.host_options
@click.argument("job", shell_complete=cli.complete_jobs)
@click.option("--json", "as_json", is_flag=True, help="Print the checkpoints, the stored folder and any problem as "
              "JSON instead of a table.")  # fmt: skip
def checkpoints(job: str, as_json: bool) -> None:
    """List JOB's checkpoints: each one's step, when it was saved, its size, and whether it is in its folder
    on the box. A restarted job shares its checkpoint folder with the job it runs again.

    For a job with object storage (submit --checkpoints-to), STORAGE says what became of each: stored (copied
    and verified), waiting (not complete yet, or its upload failed and is retried: why), or gone (deleted on the
    box before it was stored); and a last line says what keeps the uploads back (an unreachable server, refused
    credentials, a missing bucket). When the box cannot be reached, the stored folder is read from here, with
    this machine's credentials. JOB may also be the stored folder's URL.

    `tfrun pull JOB` copies the checkpoints here."""
    from ...files import storedjobs
    from ...views.stored import stored_table

    if is_url(job):
        reply, box_known = _from_storage(job), False
    else:
        asked, why = _ask_box(job)
        box_known = asked is not None
        reply = asked if asked is not None else _from_storage(_known_place(job, why))
        if asked is not None and asked.place:
            job_id, name = (int(job), None) if is_job_id(job) else (None, job)
            storedjobs.remember(cli.box_name(), job_id, name, reply.place)
    if as_json:
        click.echo(render.to_json(reply))
    else:
        stored_table(reply, cli.output(), box_known)


def _ask_box(job: str) -> tuple[Optional[StoredReply], str]:
    """The box's answer, or None and why when it cannot be reached (a local daemon is started: always there)."""
    asked = storage_calls.stored(job)
    if cli.target().local:
        return cli.call(asked), ""
    return cli.reached(lambda: cli.client().call(asked))


def _known_place(job: str, why: str) -> str:
    """The stored folder this machine remembers for `job` of the unreachable box; else the verb fails, saying
    why the box did not answer."""
    from ...files import storedjobs

    where = storedjobs.recall(cli.box_name(), job)
    if where is None:
        cli.fail(f"{why} (and this machine knows of no stored folder of job {job}: give its URL instead)", EXIT_DAEMON)
    click.echo(f"tfrun: {cli.box_name()} cannot be reached; reading {where}", err=True)
    return where


def _from_storage(where: str) -> StoredReply:
    from tfrun.storage.place import PlaceError
    from tfrun.storage.remote import StorageError

    from ...files import fromstorage

    try:
        return fromstorage.listing(where)
    except (PlaceError, StorageError) as exc:
        cli.fail(str(exc), EXIT_FAILURE)


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
    """Copy a job's checkpoints or files back to this machine (from object storage when the box cannot be
    reached and the job stored its checkpoints there: JOB may also be the stored folder's URL).

    PATH is "checkpoints[/...]" (the job's checkpoint folder, the default), "work/..." (its work dir
    snapshot, with whatever the job wrote there), "output.log", or "task-I.log" (the output of task I > 0 of
    a job on several Slurm nodes, submit --nodes). Each lands under --to with its last part's name:
    `tfrun pull 3 work/results` writes ./results/. Symlinks are not followed or copied, neither those the
    box lists nor those already under --to; nothing is written into or over another user's folder or file,
    and modes follow your umask. What the box lists outside what was asked is refused, and named.
    """
    from ...files.transfer import landed

    asked = list(paths) or ["checkpoints"]
    if is_url(job):
        _pull_stored(job, asked, dest)
        return
    dest.mkdir(parents=True, exist_ok=True)
    pulled, why = cli.reached(lambda: cli.client().pull(job, asked, dest))
    if pulled is None:
        _pull_stored(_known_place(job, why), asked, dest)
        return
    files, total = pulled
    click.echo(f"pulled {files} file(s), {render.size(total)}, into {landed(dest, asked)}", err=True)


def _pull_stored(where: str, asked: list[str], dest: Path) -> None:
    """Every stored checkpoint of the stored folder `where` into DEST/checkpoints/, each file verified."""
    from tfrun.storage.place import PlaceError
    from tfrun.storage.remote import StorageError

    from ...files import fromstorage
    from ...files.landing import NotHere

    if asked != ["checkpoints"]:
        cli.fail(f"only checkpoints are kept in {where}: pull {' '.join(asked)} from the box", EXIT_FAILURE)
    into = dest / "checkpoints"
    dest.mkdir(parents=True, exist_ok=True)
    try:
        files, total = fromstorage.pull(where, dest)
    except (PlaceError, StorageError, ValueError) as exc:
        cli.fail(str(exc), EXIT_FAILURE)
    except NotHere as exc:
        cli.fail(f"nothing pulled there: {exc}", EXIT_FAILURE)
    except OSError as exc:
        cli.fail(f"cannot write under {into}: {exc.strerror or exc}", EXIT_FAILURE)
    click.echo(f"pulled {files} file(s), {render.size(total)}, from {where} into {into}", err=True)
