"""Services: TensorBoard and Jupyter on the box, run by the daemon as jobs of a kind of their own (issue 20).

A service is a job (`Job.service` names its kind), so it has what a job has: a shim that outlives the daemon,
a log, GPUs of its own, alerts, reconciliation after a restart. `StartService` makes one (or finds the same
one running) and is answered once the service listens on its port of the box's loopback; the client then
forwards a local port to it (client/link/forward.py). It is stopped as a job is cancelled. `CheckService` asks, before
each connection a forward tunnels to it, whether it still serves its port.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Annotated, Literal, Optional

from tfrun.constants import MAX_CANCEL_JOBS, MAX_INT64
from tfrun.protocol.fields import JobRef, Limit, Range, Text
from tfrun.protocol.jobs import Job
from tfrun.protocol.wire import Message, Request, tagged

ServiceKind = Literal["tensorboard", "jupyter"]


@tagged("service")
@dataclass
class ServiceReply(Message):
    """The service's job, the box port it listens on (127.0.0.1 there), and the path a browser opens
    (Jupyter's carries its token); `reused`: it was running already."""

    job: Job
    port: int
    path: str = "/"
    reused: bool = False


@tagged("start_service")
@dataclass
class StartService(Request[ServiceReply]):
    """Start a service, or find it running: TensorBoard over `jobs` (their TensorBoard folders, a run each;
    none: the jobs made in the last `since` seconds), or Jupyter in `root_dir` with `gpus` GPUs."""

    kind: ServiceKind
    jobs: Annotated[list[JobRef], Limit(items=MAX_CANCEL_JOBS)] = field(default_factory=list)
    since: Annotated[float, Range(1, MAX_INT64)] = 86400.0
    root_dir: Optional[Text] = None
    gpus: Annotated[int, Range(0, 1024)] = 0


@tagged("check_service")
@dataclass
class CheckService(Request[ServiceReply]):
    """Whether service `job` still serves: answered with it while it runs and its own processes listen on its
    port; refused (INVALID_INPUT, saying why) once it ended, or while nothing or another user's process listens
    there. A forward to a service asks before each connection (client/link/forward.py): after the service ends,
    anyone may bind its port, and a browser's requests (a Jupyter token with them) must not reach them."""

    job: JobRef
