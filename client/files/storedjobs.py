"""Where each job of a box stores its checkpoints, remembered here (~/.cache/tfrun/stored.json, this user's
alone: client/config/privatefiles.py), so that `tfrun pull`, `tfrun checkpoints` and `tfrun restart --host`
find a job's stored folder when its box cannot be reached. Only the folder's URL is kept, never a credential;
`tfrun status` on the box shows it too (`checkpoints_to`), and any of those verbs takes the URL itself."""

from __future__ import annotations

import json
from typing import Optional

from ..config import privatefiles

STORED_JOBS_FILE = "stored.json"
MAX_KEPT = 5000  # jobs remembered; the oldest are forgotten first


def remember(box: str, job_id: Optional[int], name: Optional[str], place: Optional[str]) -> None:
    """Note that job `job_id` of `box` (a host's name, or "local") stores to `place`; by its name too (the
    newest job of a name wins, as on the box)."""
    if not place:
        return
    known = _read()
    keys = ([f"{box}:{job_id}"] if job_id is not None else []) + ([f"{box}:{name}"] if name else [])
    if all(known.get(key) == place for key in keys):
        return
    for key in keys:
        known.pop(key, None)
        known[key] = place
    data = json.dumps(dict(list(known.items())[-MAX_KEPT:]), indent=0).encode()
    privatefiles.write(privatefiles.cache_dir() / STORED_JOBS_FILE, data)


def recall(box: str, job: str) -> Optional[str]:
    """The stored folder of job `job` (an id or a name) of `box`, if this machine learnt it."""
    return _read().get(f"{box}:{job}")


def _read() -> dict[str, str]:
    data = privatefiles.read(privatefiles.cache_dir() / STORED_JOBS_FILE)
    if not data:
        return {}
    try:
        raw = json.loads(data)
    except ValueError:
        return {}
    return {str(k): str(v) for k, v in raw.items()} if isinstance(raw, dict) else {}
