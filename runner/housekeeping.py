"""Housekeeping on the box: removing ended jobs (`tfrun rm`, `tfrun prune`), collecting the uploaded contents
that no job needs (after a removal, and after each submit while the store is over `max_blob_bytes`), and the
figures of what tfrun's folders take (`tfrun df`).

What goes with a job: its folder (work dir, log and its index, metrics, exit records), its spare exit record,
and its rows: events, alert settings, the watch, and its alerts with their deliveries, all in one
transaction. The outbox sends only deliveries the database still lists, so an alert of a removed job is
never sent afterwards (one being sent at that moment finishes, and its record update finds no row), and
`tfrun alerts` no longer lists it. A job that has just ended is removed once its end alerts are stored
(a few seconds at most), so `tfrun wait 3 && tfrun rm 3` still sends its `done` message.

What stays:
- a job that has not ended: cancel it first;
- a job that an unfinished job needs: the job it runs again (a restart is built from its manifest) and the
  jobs it runs `--after` (the scheduler fails a job whose dependency is gone);
- checkpoint folders, unless asked (`--checkpoints`; empty ones go anyway), and even then one that a kept
  job shares (a restart chain shares its first job's folder) or one this daemon did not make (another home's
  or another user's on a shared root, a link, one named by an older tfrun: `checkpoints.made_here`), or one
  that holds a checkpoint not yet in object storage (runner/storage/: it goes once they are stored);
- a job's folder in object storage, unless asked (`rm --storage`), and even then one a kept job stores to;
- contents a kept job's manifest names (what `tfrun restart` builds from), that a spare names (a re-submit
  from that folder would otherwise send them again), that a connection holds (a submit between `HaveBlobs`
  and `Submit`), or that arrived less than `blob_grace` ago (runner/workdir/blobs.py).

A job folder is renamed to `N.removed` before its rows go and deleted after them: a daemon killed half way
leaves at worst a `N.removed` folder, which the next rm or prune deletes, never an unaccounted folder that
looks like a job's.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import functools
import logging
import os
import shutil
import stat
import time
from collections.abc import Collection, Coroutine, Iterable
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Optional, Protocol, Union

from tfrun.constants import END_ALERTS_WAIT_S
from tfrun.paths import Layout
from tfrun.protocol.housekeeping import DiskReport, FolderUsage, Prune, Removal, RemoveReply
from tfrun.storage.remote import Remote, StorageError

from .executors.slurm import arrays as slurm_arrays
from .records import jobfiles
from .records.job import JobRow
from .shim import jobdir
from .storage import complete
from .storage.uploader import Uploader
from .workdir.blobs import BlobStore, Collected, manifest_digests
from .workdir.checkpoints import made_here

if TYPE_CHECKING:
    from .config.settings import Config
    from .records.store import Store

log = logging.getLogger("tfrund")

REMOVED_SUFFIX = ".removed"  # a job folder on its way out (see the module's docstring)
LOG_FILES = frozenset({jobdir.OUTPUT, jobdir.INDEX})  # what `tfrun df` counts as a job's log
DATABASE_FILES = ("tfrun.db", "tfrun.db-wal", "tfrun.db-shm")


class Context(Protocol):
    """What removing jobs and collecting blobs need of the daemon (runner/daemon.py's Daemon is one)."""

    store: Store
    layout: Layout
    config: Config
    blobs: BlobStore
    uploader: Uploader

    def in_background(self, work: Union[Callable[[], object], Coroutine[Any, Any, None]]) -> None: ...


# -- choosing ------------------------------------------------------------------------------------------------


def needed_by(rows: Iterable[JobRow]) -> dict[int, str]:
    """Ended jobs that an unfinished job needs, with why: the job it runs again, the jobs it runs after."""
    needs: dict[int, str] = {}
    for row in rows:
        if row.final:
            continue
        source = row.spec.restart_of
        if source is not None:
            needs.setdefault(int(source), f"job {row.id} ({row.state}) runs it again")
        for dep in row.spec.after:
            needs.setdefault(int(dep), f"job {row.id} ({row.state}) runs after it")
    return needs


def ended_at(row: JobRow) -> float:
    return row.finished_at if row.finished_at is not None else row.created_at


def for_prune(
    rows: Iterable[JobRow], now: float, older_than: Optional[float], keep_last: Optional[int]
) -> list[JobRow]:
    """The ended jobs that `prune` picks: those that ended more than `older_than` seconds ago, less the
    `keep_last` that ended last; given both, a job must be picked by both; given neither, none."""
    if older_than is None and keep_last is None:
        return []
    ended = sorted((row for row in rows if row.final), key=lambda row: (ended_at(row), row.id), reverse=True)
    if keep_last is not None:
        ended = ended[keep_last:]
    if older_than is not None:
        ended = [row for row in ended if ended_at(row) < now - older_than]
    return sorted(ended, key=lambda row: row.id)


# -- removing ------------------------------------------------------------------------------------------------


async def remove(
    daemon: Context, refs: list[str], checkpoints: bool, dry_run: bool, storage: bool = False
) -> RemoveReply:
    """`tfrun rm`: the jobs named, each refused with its reason where it must stay."""
    needs = needed_by(daemon.store.list(include_final=True))
    outcomes: list[tuple[str, Union[Removal, int]]] = []  # per reference: why it stays, or the job's id
    doomed: dict[int, JobRow] = {}
    for ref in dict.fromkeys(refs):  # a reference given twice is reported once
        row = daemon.store.find(ref)
        if row is None:
            outcomes.append((ref, Removal(ref, False, f"no job {ref!r}")))
        elif not row.final:
            outcomes.append((ref, Removal(ref, False, f"job {row.id} is {row.state}: cancel it first", row.id)))
        elif row.id in needs:
            outcomes.append((ref, Removal(ref, False, f"job {row.id} stays: {needs[row.id]}", row.id)))
        else:
            doomed[row.id] = row
            outcomes.append((ref, row.id))
    removed, collected = await _remove_jobs(daemon, list(doomed.values()), checkpoints, dry_run, storage)
    by_id = {removal.id: removal for removal in removed}
    results = [
        outcome if isinstance(outcome, Removal) else dataclasses.replace(by_id[outcome], job=ref)
        for ref, outcome in outcomes
    ]
    return RemoveReply(results, collected.removed, collected.freed, dry_run)


async def prune(daemon: Context, req: Prune) -> RemoveReply:
    """`tfrun prune`: the ended jobs picked by age and rank, less those an unfinished job needs."""
    rows = daemon.store.list(include_final=True)
    needs = needed_by(rows)
    chosen = for_prune(rows, time.time(), req.older_than, req.keep_last)
    kept = [
        Removal(str(row.id), False, f"job {row.id} stays: {needs[row.id]}", row.id) for row in chosen if row.id in needs
    ]
    doomed = [row for row in chosen if row.id not in needs]
    removed, collected = await _remove_jobs(daemon, doomed, req.checkpoints, req.dry_run)
    results = sorted([*removed, *kept], key=lambda removal: removal.id or 0)
    return RemoveReply(results, collected.removed, collected.freed, req.dry_run)


async def _remove_jobs(
    daemon: Context, rows: list[JobRow], checkpoints: bool, dry_run: bool, storage: bool = False
) -> tuple[list[Removal], Collected]:
    """Remove `rows` (ended, needed by none), then collect the contents no kept job needs. A checkpoint folder
    that holds checkpoints not yet in object storage stays whatever was asked; a stored folder goes only with
    `storage`."""
    if rows and not dry_run:
        await _end_alerts_stored(daemon, [row.id for row in rows])
    ids = {row.id for row in rows}
    kept = [row for row in daemon.store.list(include_final=True) if row.id not in ids]
    shared = {row.checkpoint_dir for row in kept}
    stored = {
        row.checkpoint_dir: daemon.uploader.stored_in(row.checkpoint_dir) for row in rows if row.spec.checkpoints_to
    }
    loop = asyncio.get_running_loop()
    measure = functools.partial(_measure, rows, checkpoints, shared, daemon.store.daemon_id, stored)
    removals = await loop.run_in_executor(None, measure)
    if not dry_run:
        needs = needed_by(daemon.store.list(include_final=True))  # again: a restart may have begun meanwhile
        for removal in removals:
            if removal.id in needs:
                removal.ok, removal.message = False, f"job {removal.id} stays: {needs[removal.id]}"
        present = [row for row in rows if row.id not in needs and daemon.store.get(row.id) is not None]
        _forget(daemon, present)
        work = functools.partial(_delete, daemon.layout, present, removals)
        await loop.run_in_executor(None, work)
        daemon.uploader.rows.forget([r.checkpoint_dir or "" for r in removals if r.checkpoints == "removed"])
        for row in present:
            log.info("job %d removed", row.id)
    await stored_folders(daemon, rows, removals, {row.spec.checkpoints_to for row in kept}, storage, dry_run)
    collected = await collect_blobs(daemon, excluding=ids, dry_run=dry_run)
    return removals, collected


async def _end_alerts_stored(daemon: Context, ids: list[int]) -> None:
    """Wait, a few seconds at most, until the watch has stored the end alerts of jobs that just ended."""
    deadline = time.monotonic() + END_ALERTS_WAIT_S
    while daemon.store.watched(ids) and time.monotonic() < deadline:
        await asyncio.sleep(0.1)


def _measure(
    rows: list[JobRow], checkpoints: bool, shared: set[str], daemon_id: str, stored: dict[str, set[tuple[str, float]]]
) -> list[Removal]:
    """What removing each of `rows` frees, and what becomes of its checkpoint folder: only one this daemon
    made may go (runner/workdir/checkpoints.py), never another home's or another user's on a shared root, nor,
    for a job with object storage, one holding a checkpoint not among those `stored` (being written, not found
    complete yet, waiting for its upload)."""
    seen: set[tuple[int, int]] = set()
    counted: set[str] = set()  # checkpoint folders measured already: a restart chain removed whole shares one
    removals = []
    for row in rows:
        size, _ = tree_usage(row.job_dir, seen)
        folder = Path(row.checkpoint_dir)
        fate = ""
        if os.path.lexists(folder):
            if row.checkpoint_dir in shared:
                fate = "shared"
            elif not made_here(folder, daemon_id):
                fate = "foreign"
            elif row.checkpoint_dir in stored and _unstored(folder, stored[row.checkpoint_dir]):
                fate = "waiting"
            elif checkpoints or _empty(folder):
                fate = "removed"
                size += 0 if row.checkpoint_dir in counted else tree_usage(folder, seen)[0]
                counted.add(row.checkpoint_dir)
            else:
                fate = "kept"
        removals.append(Removal(str(row.id), True, "", row.id, size, row.checkpoint_dir, fate))
    return removals


async def stored_folders(
    daemon: Context, rows: list[JobRow], removals: list[Removal], kept: set[Optional[str]], storage: bool,
    dry_run: bool,
) -> None:  # fmt: skip
    """What becomes of each removed job's folder in object storage: deleted with `storage` where no kept job
    stores there too (a restart on this box shares it), else left, and said so on its result."""
    by_id = {removal.id: removal for removal in removals}
    loop = asyncio.get_running_loop()
    done: dict[str, str] = {}
    for row in rows:
        removal, place = by_id.get(row.id), row.spec.checkpoints_to
        if removal is None or not removal.ok or place is None:
            continue
        removal.stored_at = place
        if place in kept:
            removal.storage = "shared"
        elif not storage:
            removal.storage = "kept"
        elif dry_run:
            removal.storage = "removed"
        else:
            if place not in done:
                try:
                    await loop.run_in_executor(None, _delete_stored, daemon.uploader.remote(place))
                    done[place] = "removed"
                except StorageError as exc:
                    done[place] = exc.message
            removal.storage = "removed" if done[place] == "removed" else "kept"
            if done[place] != "removed":
                removal.message = f"its stored folder stays: {done[place]}"


def _unstored(folder: Path, stored: set[tuple[str, float]]) -> bool:
    """Whether `folder` holds a checkpoint that is not stored (or cannot be read to tell: then it stays)."""
    try:
        return any((found.name, found.saved_at) not in stored for found in complete.on_box(folder))
    except (OSError, jobfiles.Refused):
        return True


def _delete_stored(remote: Remote) -> None:
    remote.delete(sorted(remote.listing()))


def _empty(folder: Path) -> bool:
    try:
        return folder.is_dir() and not folder.is_symlink() and not any(folder.iterdir())
    except OSError:
        return False


def _forget(daemon: Context, rows: list[JobRow]) -> None:
    """Move the jobs' folders aside, then delete their rows: what is left of a job is never half of it."""
    for row in rows:
        with contextlib.suppress(FileNotFoundError):
            os.rename(row.job_dir, row.job_dir + REMOVED_SUFFIX)
    daemon.store.remove_jobs([row.id for row in rows])


def _delete(layout: Layout, rows: list[JobRow], removals: list[Removal]) -> None:
    """Delete the folders of jobs whose rows are gone (their checkpoints where asked), and any folder that
    a removal cut short by a daemon's death left behind. A failure is noted on the job's result."""
    fates = {removal.id: removal for removal in removals}
    for row in rows:
        removal = fates[row.id]
        problems = _remove_tree(Path(row.job_dir + REMOVED_SUFFIX))
        layout.spare_exit(row.id).unlink(missing_ok=True)
        if removal.checkpoints == "removed":
            problems += _remove_tree(Path(row.checkpoint_dir))
        if problems:
            removal.message = f"could not delete {problems[0]}" + (
                f" and {len(problems) - 1} more" if len(problems) > 1 else ""
            )
    for leftover in layout.jobs_dir.glob(f"*{REMOVED_SUFFIX}"):
        shutil.rmtree(leftover, ignore_errors=True)
    slurm_arrays.remove_unused(layout.home)


def _remove_tree(path: Path) -> list[str]:
    """Delete `path` (a link itself, never what it points to); what could not be deleted, and why."""
    problems: list[str] = []

    def failed(_: object, name: str, exc_info: tuple[type[BaseException], BaseException, object]) -> None:
        error = exc_info[1]
        problems.append(f"{name}: {error.strerror if isinstance(error, OSError) else error}")

    if path.is_symlink():
        path.unlink()
    elif path.exists():
        shutil.rmtree(path, onerror=failed)
    return problems


# -- contents ------------------------------------------------------------------------------------------------


async def collect_blobs(
    daemon: Context, excluding: Collection[int] = (), limit: Optional[int] = None, dry_run: bool = False
) -> Collected:
    """Collect the contents that no job (less `excluding`, for a dry run) and no spare names; with `limit`,
    only the oldest of them, until the store takes at most `limit` bytes."""
    start = daemon.blobs.begin_collection()  # before the jobs are read: see BlobStore.begin_collection
    manifests = [Path(r.job_dir) / jobdir.FILES for r in daemon.store.list(include_final=True) if r.id not in excluding]
    spares = daemon.layout.spares_dir

    def needed() -> set[str]:
        return manifest_digests([*manifests, *spares.glob(f"*/{jobdir.FILES}")])

    work = functools.partial(daemon.blobs.collect, start, needed, daemon.config.blob_grace, limit, dry_run)
    collected = await asyncio.get_running_loop().run_in_executor(None, work)
    if collected.removed and not dry_run:
        log.info("collected %d content(s) no job needs (%d bytes)", collected.removed, collected.freed)
    return collected


def after_submit(daemon: Context) -> None:
    """Keep the blob store within max_blob_bytes, in the background once a submit has made its job."""
    if daemon.config.max_blob_bytes:
        daemon.in_background(_cap(daemon, daemon.config.max_blob_bytes))


async def _cap(daemon: Context, limit: int) -> None:
    collected = await collect_blobs(daemon, limit=limit)
    if collected.left > limit:
        log.warning(
            "the blob store takes %d bytes, over max_blob_bytes (%d): jobs still need them", collected.left, limit
        )


# -- disk usage ----------------------------------------------------------------------------------------------


async def disk_report(daemon: Context) -> DiskReport:
    """`tfrun df`: what each of tfrun's folders takes on the box."""
    rows = daemon.store.list(include_final=True)
    manifests = [Path(row.job_dir) / jobdir.FILES for row in rows]
    checkpoints = daemon.config.checkpoint_root
    work = functools.partial(_disk_report, daemon.layout, daemon.blobs, checkpoints, manifests, len(rows))
    return await asyncio.get_running_loop().run_in_executor(None, work)


def _disk_report(layout: Layout, blobs: BlobStore, checkpoints: Path, manifests: list[Path], jobs: int) -> DiskReport:
    """Each of the home's entries counted once, under the heading it belongs to; the checkpoint root too,
    wherever it is."""
    seen: set[tuple[int, int]] = set()
    paths = {
        "jobs": layout.jobs_dir, "logs": layout.jobs_dir, "blobs": layout.blobs_dir, "spares": layout.spares_dir,
        "checkpoints": checkpoints, "database": layout.database, "other": layout.home,
    }  # fmt: skip
    sizes = dict.fromkeys(paths, (0, 0))

    def add(name: str, usage: tuple[int, int]) -> None:
        sizes[name] = (sizes[name][0] + usage[0], sizes[name][1] + usage[1])

    add("other", (_own_blocks(str(layout.home)), 0))
    with os.scandir(layout.home) as entries:
        for entry in sorted(entries, key=lambda e: e.name):
            path = Path(entry.path)
            if path == layout.jobs_dir:
                _jobs_usage(entry.path, seen, add)
            elif path == checkpoints:
                add("checkpoints", tree_usage(entry.path, seen))
            elif path in (layout.blobs_dir, layout.spares_dir):
                add(entry.name, tree_usage(entry.path, seen))
            else:
                add("database" if entry.name in DATABASE_FILES else "other", tree_usage(entry.path, seen))
    if not checkpoints.is_relative_to(layout.home):
        add("checkpoints", tree_usage(str(checkpoints), seen))
    needed = manifest_digests([*manifests, *layout.spares_dir.glob(f"*/{jobdir.FILES}")])
    unneeded = sum(size for _, digest, size in blobs.contents() if digest not in needed)
    folders = [FolderUsage(name, str(paths[name]), size, files) for name, (size, files) in sizes.items()]
    disk = os.statvfs(layout.home)
    return DiskReport(str(layout.home), folders, disk.f_bavail * disk.f_frsize, jobs, unneeded)


def _jobs_usage(jobs_dir: str, seen: set[tuple[int, int]], add: Callable[[str, tuple[int, int]], None]) -> None:
    """The job folders, their logs (output and its index) counted apart."""
    add("jobs", (_own_blocks(jobs_dir), 0))
    with os.scandir(jobs_dir) as folders:
        for folder in folders:
            if not folder.is_dir(follow_symlinks=False):
                add("jobs", tree_usage(folder.path, seen))
                continue
            add("jobs", (_own_blocks(folder.path), 0))
            with os.scandir(folder.path) as entries:
                for entry in entries:
                    add("logs" if entry.name in LOG_FILES else "jobs", tree_usage(entry.path, seen))


def tree_usage(path: str | os.PathLike[str], seen: set[tuple[int, int]]) -> tuple[int, int]:
    """(bytes on disk, regular files) of `path` and everything under it, as `du` counts them: links are not
    followed, a file with several links is counted once (`seen` holds those met already), a folder that
    cannot be read counts as itself only. A stack, not recursion: a work dir may nest deeper than Python."""
    size = files = 0
    stack = [os.fspath(path)]
    while stack:
        current = stack.pop()
        try:
            st = os.lstat(current)
        except OSError:
            continue
        if st.st_nlink > 1 and not stat.S_ISDIR(st.st_mode):
            if (st.st_dev, st.st_ino) in seen:
                continue
            seen.add((st.st_dev, st.st_ino))
        size += st.st_blocks * 512
        files += stat.S_ISREG(st.st_mode)
        if stat.S_ISDIR(st.st_mode):
            with contextlib.suppress(OSError):
                stack.extend(os.path.join(current, name) for name in os.listdir(current))
    return size, files


def _own_blocks(folder: str) -> int:
    return os.lstat(folder).st_blocks * 512
