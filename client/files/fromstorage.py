"""A job's checkpoints read straight from its stored folder, from this machine, with this machine's credentials
(tfrun/storage/credentials.py): what `tfrun checkpoints` shows and `tfrun pull` copies when the job's box
cannot be reached."""

from __future__ import annotations

from pathlib import Path

from tfrun.protocol.storage import StoredReply, StoredState
from tfrun.storage import place, stored
from tfrun.storage.remote import Remote


def listing(where: str) -> StoredReply:
    """The checkpoints in the stored folder `where`, as the box would list them (none known to be on it)."""
    manifests = stored.stored_checkpoints(Remote(place.parse(where)))
    states = [StoredState(m.name, m.kind, m.saved_at, m.size, False, "stored", m.stored_at) for m in manifests]
    return StoredReply(states, where)


def pull(where: str, into: Path) -> tuple[int, int]:
    """Copy every stored checkpoint of `where` into the folder `into` (made if needed), each file verified
    before it takes its name; TensorFlow's state file names the newest. Files and bytes copied."""
    remote = Remote(place.parse(where))
    manifests = stored.stored_checkpoints(remote)
    into.mkdir(parents=True, exist_ok=True)
    files = total = 0
    for manifest in manifests:  # oldest first: the newest TF checkpoint's state file is written last
        total += stored.restore(remote, manifest, into)
        files += len(manifest.files)
    return files, total
