"""`tfrun rm`, `prune` and `df` as people and scripts read them, and the question before a large upload."""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING

import click

from tfrun.constants import EXIT_FAILURE, EXIT_NO_SUCH_JOB, EXIT_OK

from ..errors import TfrunError, error_line
from ..views import render

if TYPE_CHECKING:  # a submit asks its upload question here, and needs none of housekeeping's messages
    from tfrun.protocol.housekeeping import DiskReport, Removal, RemoveReply


def should_ask(upload_bytes: int, threshold: int, yes: bool, interactive: bool) -> bool:
    """Whether to ask before sending `upload_bytes`: only above `threshold` (0: never), without --yes, and
    only where a person can answer. In a pipe or a script nobody can, and a question would hang it or fail
    it: there the upload goes ahead as it always did, with the size warning."""
    return interactive and not yes and threshold > 0 and upload_bytes > threshold


class UploadQuestion:
    """Asks once per submit, before the first content is sent (the contents the box lacks, not the whole
    snapshot: a re-submit that sends little is never asked about)."""

    def __init__(self, threshold: int, yes: bool, where: str) -> None:
        self.threshold = threshold
        self.yes = yes
        self.where = where
        self.answered = False  # a submit that reconnects and uploads the rest is not asked again

    def __call__(self, files: int, upload_bytes: int) -> None:
        interactive = sys.stdin.isatty() and sys.stderr.isatty()
        if self.answered or not should_ask(upload_bytes, self.threshold, self.yes, interactive):
            return
        prompt = f"tfrun: send {render.size(upload_bytes)} in {files} file(s) to {self.where}?"
        try:
            go = click.confirm(prompt, default=False, err=True)
        except click.Abort:  # Ctrl-D or Ctrl-C at the question
            go = False
        if not go:
            raise TfrunError(
                "not sent (--yes skips the question; confirm_upload_bytes in the client's config.toml sets when "
                f"it is asked: above {render.size(self.threshold)})",
                EXIT_FAILURE,
            )
        self.answered = True


def show_removals(reply: RemoveReply, as_json: bool, where: str, named: bool = True) -> int:
    """Print what `rm` or `prune` did on `where` (the box, in words); the exit code. A job `named` (rm) that
    stays is an error, said as errors are, and 3 if one does not exist, else 1. `prune` picks its jobs
    itself: one that stays (an unfinished job needs it) is no failure, and its line a note. How much was
    freed follows what was removed, or collected: after nothing but errors there is nothing to count."""
    if as_json:
        click.echo(render.to_json(reply))
    else:
        for removal in reply.results:
            if removal.ok:
                click.echo(_removal_line(removal, reply.dry_run))
            elif named:
                click.echo(error_line(removal.message + (f" on {where}" if removal.id is None else "")), err=True)
            else:
                click.echo(f"tfrun: {removal.message}", err=True)
        jobs = [r for r in reply.results if r.ok]
        if jobs or reply.blobs or not named:
            freed = sum(r.bytes for r in jobs) + reply.blob_bytes
            verb = "would free" if reply.dry_run else "freed"
            click.echo(
                f"{verb} {render.size(freed)}: {len(jobs)} job(s), {reply.blobs} uploaded content(s) no job needs "
                f"({render.size(reply.blob_bytes)})",
                err=True,
            )
    if not named:
        return EXIT_OK
    if any(r.id is None and not r.ok for r in reply.results):
        return EXIT_NO_SUCH_JOB
    return EXIT_OK if all(r.ok for r in reply.results) else EXIT_FAILURE


# What `rm` and `prune` say of a removed job's checkpoint folder ({} its path) and of its stored folder ({} its
# URL), by the fate the daemon gave each (tfrun/protocol/housekeeping.py's Removal).
_CHECKPOINT_FATES = {
    "kept": "; its checkpoints stay in {} (--checkpoints removes them)",
    "shared": "; its checkpoints stay in {}, which a kept job shares",
    "foreign": "; {} stays: tfrun did not make it for this job (an older tfrun's, or not yours)",
    "waiting": "; its checkpoints stay in {}: some are not in object storage yet (delete the folder yourself once "
    "they are)",
}
_STORAGE_FATES = {
    "kept": "; its stored copies stay in {} (--storage removes them)",
    "shared": "; its stored copies stay in {}, where a kept job stores too",
    "removed": "; {verb} its stored copies in {}",
}


def _removal_line(removal: Removal, dry_run: bool) -> str:
    if not removal.ok:
        return removal.message
    text = f"{'would remove' if dry_run else 'removed'} job {removal.id} ({render.size(removal.bytes)})"
    if removal.checkpoints in _CHECKPOINT_FATES:
        text += _CHECKPOINT_FATES[removal.checkpoints].format(removal.checkpoint_dir)
    if removal.storage in _STORAGE_FATES:
        verb = "would remove" if dry_run else "removed"
        text += _STORAGE_FATES[removal.storage].format(removal.stored_at, verb=verb)
    if removal.message:
        text += f"; {removal.message}"
    return text


_WHAT = {
    "jobs": "job folders: work dirs, metrics (logs apart)",
    "logs": "job output logs and their time index",
    "blobs": "uploaded contents, kept so a re-submit sends only changes",
    "spares": "ready copies of recent snapshots for re-submits",
    "checkpoints": "the jobs' checkpoint folders",
    "database": "the job store",
    "other": "the daemon's log, socket folder, job-side code",
}


def show_disk_report(report: DiskReport, where: str, as_json: bool) -> None:
    if as_json:
        click.echo(render.to_json(report))
        return
    click.echo(f"{where}: {report.home} ({report.jobs} jobs; {render.size(report.free)} free on its disk)")
    width = max(len(folder.name) for folder in report.folders)
    for folder in report.folders:
        note = _WHAT.get(folder.name, "")
        if folder.name == "blobs" and report.unneeded:
            note += f"; {render.size(report.unneeded)} no job needs: tfrun prune frees it"
        click.echo(f"{folder.name:<{width}}  {render.size(folder.bytes):>9}  {folder.files:>7} files  {note}")
    total = sum(folder.bytes for folder in report.folders)
    click.echo(f"{'total':<{width}}  {render.size(total):>9}")
