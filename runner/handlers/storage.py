"""Handlers of checkpoints in object storage: each checkpoint of a job on the box and in storage
(`tfrun checkpoints`), and a job resumed here from its stored folder (`tfrun restart --host`). The uploads
themselves are runner/storage/uploader.py's."""

from __future__ import annotations

import asyncio
import functools
from pathlib import Path
from typing import Optional, Protocol

from tfrun.constants import MAX_NAME
from tfrun.protocol.fields import CAUSES
from tfrun.protocol.jobs import JobReply
from tfrun.protocol.storage import ListStored, Resume, StoredReply, StoredState
from tfrun.protocol.submit import Submit
from tfrun.storage import place, stored
from tfrun.storage.remote import StorageError

from ..records import jobfiles
from ..records.job import JobRow
from ..records.uploads import GONE, STORED, Upload
from ..storage import complete, restore
from ..storage.uploader import Uploader
from . import submit
from .base import Connection, find, handles, invalid, public

LISTING_TIMEOUT_S = 20.0  # a storage that does not answer is said in the reply, not waited for


class Context(submit.Context, Protocol):
    uploader: Uploader


@handles(ListStored)
async def list_stored(daemon: Context, req: ListStored, conn: Connection) -> None:
    """The checkpoints in the job's folder, what became of each one's upload, and those in its stored folder
    (some saved by another box, before a resume)."""
    row = find(daemon, req.job)
    loop = asyncio.get_running_loop()
    try:
        on_box = await loop.run_in_executor(
            None, _on_box, Path(row.checkpoint_dir), f"job {row.id}'s checkpoint folder"
        )
    except jobfiles.Refused as exc:
        raise invalid(str(exc)) from None
    uploads = {u.name: u for u in daemon.uploader.state_of(row.checkpoint_dir)}  # the newest of each name
    states = {c.name: _state(c, uploads.get(c.name), row) for c in on_box}
    place_url, problem = row.spec.checkpoints_to, None
    if place_url is not None:
        for name, upload in uploads.items():
            if name not in states and upload.state != STORED:
                states[name] = _gone_state(upload)
        listing = functools.partial(stored.stored_checkpoints, daemon.uploader.remote(place_url))
        try:
            for manifest in await asyncio.wait_for(loop.run_in_executor(None, listing), LISTING_TIMEOUT_S):
                _merge(states, manifest)
        except StorageError as exc:
            problem = exc.message
        except asyncio.TimeoutError:
            problem = f"{place_url} did not answer in {LISTING_TIMEOUT_S:g} s"
        problem = daemon.uploader.problems.get(place_url) or problem
    for state in states.values():
        state.step = stored.step_of(state.name)
    failing = [u.failing_since for u in uploads.values() if u.failing_since]
    reply = StoredReply(sorted(states.values(), key=lambda s: (s.saved_at, s.name)), place_url, problem,
                        min(failing) if failing else None)  # fmt: skip
    await conn.send(reply)


def _on_box(folder: Path, what: str) -> list[complete.Checkpoint]:
    try:
        return complete.on_box(folder, what)
    except FileNotFoundError:
        return []


def _state(found: complete.Checkpoint, upload: Optional[Upload], row: JobRow) -> StoredState:
    size = sum(f.size for f in found.files)
    if row.spec.checkpoints_to is None:
        return StoredState(found.name, found.kind, found.saved_at, size, True, "")
    if upload is None:
        return StoredState(found.name, found.kind, found.saved_at, size, True, "waiting", error="not complete yet")
    return StoredState(found.name, found.kind, found.saved_at, size, True, upload.state, upload.stored_at,
                       upload.error if upload.state != STORED else None)  # fmt: skip


def _gone_state(upload: Upload) -> StoredState:
    size = sum(f[1] for f in upload.files)
    state = GONE if upload.state == GONE else "waiting"
    return StoredState(upload.name, upload.kind, upload.saved_at, size, False, state, None, upload.error)


def _merge(states: dict[str, StoredState], manifest: stored.Manifest) -> None:
    """A checkpoint in storage: stored, whatever the box says (it may be gone from the box, or another's)."""
    known = states.get(manifest.name)
    if known is None:
        states[manifest.name] = StoredState(manifest.name, manifest.kind, manifest.saved_at, manifest.size, False,
                                            STORED, manifest.stored_at)  # fmt: skip
    elif known.storage != STORED and abs(known.saved_at - manifest.saved_at) < 1e-3:
        known.storage, known.stored_at, known.error = STORED, manifest.stored_at, None


@handles(Resume)
async def resume(daemon: Context, req: Resume, conn: Connection) -> None:
    """A new job from the stored folder: the record and snapshot fetched (contents verified) into this box's
    content store, then made as a submit of them would be, storing to the same folder, its newest checkpoint
    restored into its own checkpoint folder before it starts."""
    try:
        where = place.parse(req.place)
    except place.PlaceError as exc:
        raise invalid(str(exc)) from None
    remote = daemon.uploader.remote(where.url)
    try:
        record, files = await daemon.off_loop(lambda: restore.fetch_job(remote, daemon.blobs))
    except StorageError as exc:
        raise invalid(f"cannot resume from {where.url}: {exc.message}") from None
    name = _text(record.get("name"))
    request = Submit(
        files=files, script=str(record.get("script", "")), args=[str(a) for a in record.get("args", [])],
        name=name, env=dict(req.env), python=req.python,
        gpus=req.gpus if req.gpus is not None else _count(record.get("gpus")),
        max_restarts=_count(record.get("max_restarts")) or 0, source=_text(record.get("source")),
        git_commit=_text(record.get("git_commit")), checkpoints_to="",
        restart_on=[c for c in record.get("restart_on", []) if c in CAUSES] or None,
    )  # fmt: skip
    (row,) = await submit.new_jobs(daemon, request, [], resume_from=where.url)
    await conn.send(JobReply(public(daemon, row)))


def _text(value: object) -> Optional[str]:
    return value[: MAX_NAME * 8] if isinstance(value, str) else None


def _count(value: object) -> Optional[int]:
    return value if isinstance(value, int) and not isinstance(value, bool) and 0 <= value < 1 << 16 else None
