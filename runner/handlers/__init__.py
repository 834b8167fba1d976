"""One handler per request of the protocol. Each gets the daemon, the request, and a way to send replies.

Handlers check a request and turn failures into Error replies; what a request does at length lives in its own
module: a job's states in runner/records/lifecycle.py, streaming a log in runner/logs/logstream.py, a job's files
in runner/records/jobfiles.py, its metrics in runner/metrics/jobmetrics.py. The handlers are grouped by what they
serve, one module for each of tfrun/protocol/'s: `submit.py` (submit, uploads; the request made a spec in
`jobspec.py`), `jobs.py` (ps, status, wait, cancel, restart), `logs.py` (logs, attach), `files.py` (checkpoints,
pulls), `storage.py` (checkpoints in object storage, a job resumed from them), `watching.py` (alerts, metrics,
GPUs, top), `services.py` (TensorBoard, Jupyter), `housekeeping.py` (rm, prune, df) and `admin.py` (the daemon,
its config, doctor); each is registered for its request type in `base.HANDLERS` by `@handles`, and takes its
module's `Context`: what it needs of the daemon.
"""

from __future__ import annotations

from tfrun.protocol.jobs import Wait
from tfrun.protocol.logs import ReadLog
from tfrun.protocol.wire import Message

from . import admin, files, housekeeping, jobs, logs, services, storage, submit, watching
from .base import HANDLERS, Connection, RequestError

# Requests that only watch a job: the daemon drops one the moment its client hangs up, rather than when the
# job ends. Nothing else is dropped half way: a submit or a cancel whose client left still runs to its end.
WATCHING: tuple[type[Message], ...] = (Wait, ReadLog)

__all__ = [
    "HANDLERS",
    "WATCHING",
    "Connection",
    "RequestError",
    "admin",
    "files",
    "housekeeping",
    "jobs",
    "logs",
    "services",
    "storage",
    "submit",
    "watching",
]
