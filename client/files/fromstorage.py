"""A job's checkpoints read straight from its stored folder, from this machine, with this machine's credentials
(tfrun/storage/credentials.py): what `tfrun checkpoints` shows and `tfrun pull` copies when the job's box
cannot be reached."""

from __future__ import annotations

import contextlib
import os
from pathlib import Path
from typing import BinaryIO, Callable

from tfrun.protocol.storage import StoredReply, StoredState
from tfrun.storage import place, stored
from tfrun.storage.remote import Remote

from .landing import Landing, new_file


def listing(where: str) -> StoredReply:
    """The checkpoints in the stored folder `where`, as the box would list them (none known to be on it)."""
    manifests = stored.stored_checkpoints(Remote(place.parse(where)))
    states = [StoredState(m.name, m.kind, m.saved_at, m.size, False, "stored", m.stored_at, step=m.step)
              for m in manifests]  # fmt: skip
    return StoredReply(states, where)


def pull(where: str, dest: Path) -> tuple[int, int]:
    """Copy every stored checkpoint of `where` into DEST/checkpoints/, as `tfrun pull` lands files (through
    client/files/landing.py: never through a link, never into another user's folder or over their file), each
    verified before it takes its name; TensorFlow's state file names the newest TF checkpoint. Files and bytes
    copied; NotHere for what the destination does not take."""
    remote = Remote(place.parse(where))
    manifests = stored.stored_checkpoints(remote)
    landing = Landing(dest)
    files = total = 0
    try:
        for manifest in manifests:
            for entry in manifest.files:
                _land(landing, ["checkpoints", *entry.path.split("/")], _fetched(remote, entry))
                files, total = files + 1, total + entry.size
        newest = [m for m in manifests if m.kind == stored.TENSORFLOW][-1:]
        if newest:
            prefix = newest[0].name.split("/")
            state = stored.tf_state_text(prefix[-1]).encode()
            _land(landing, ["checkpoints", *prefix[:-1], stored.TF_STATE], lambda f: f.write(state))
    finally:
        landing.close()
    return files, total


def _fetched(remote: Remote, entry: stored.StoredFile) -> Callable[[BinaryIO], None]:
    """What fills a landed file with `entry`'s stored bytes, checked against its size and SHA-256."""
    return lambda f: remote.get_into(entry.path, f, entry.size, entry.sha256)


def _land(landing: Landing, parts: list[str], fill: Callable[[BinaryIO], object]) -> None:
    """A new file at `parts` under the destination, filled by `fill`, renamed over its name once whole."""
    folder = landing.folder(parts[:-1])
    try:
        landing.check_replaceable(folder, parts)
        fd, tmp = new_file(folder, parts[-1], 0o644)
        try:
            with os.fdopen(fd, "wb") as f:
                fill(f)
            os.replace(tmp, parts[-1], src_dir_fd=folder, dst_dir_fd=folder)
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(tmp, dir_fd=folder)
            raise
    finally:
        os.close(folder)
