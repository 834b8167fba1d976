"""Starting a service (TensorBoard, Jupyter): made a job of its kind, or found running, and answered once it
listens (runner/services/commands.py says what it runs); and whether one still serves, asked by a forward before
each connection it tunnels."""

from __future__ import annotations

import asyncio
import os
import time
from typing import TYPE_CHECKING, Optional, Protocol

from tfrun.duration import format_duration
from tfrun.protocol.fields import JobState
from tfrun.protocol.services import CheckService, ServiceReply, StartService

from ..doctor import job_python
from ..records.job import JobRow, JobSpec
from ..services import commands as services
from ..shim import jobdir, process
from .base import Connection, Shown, find, handles, invalid, public

if TYPE_CHECKING:
    from ..executors.executor import Executor
    from ..queue.scheduler import Scheduler
    from ..records.lifecycle import Lifecycle

_LOOK_S = 0.2
_LOG_TAIL_BYTES = 2000


class Context(Shown, Protocol):
    """What starting TensorBoard and Jupyter needs of the daemon (runner/daemon.py's Daemon is one)."""

    executor: Executor
    lifecycle: Lifecycle
    scheduler: Scheduler


@handles(StartService)
async def start_service(daemon: Context, req: StartService, conn: Connection) -> None:
    """The service asked for: the same one if it runs (same kind, runs or folder, GPUs), else a new one."""
    refused = daemon.executor.capabilities.no_services
    if refused:
        raise invalid(f"{req.kind}: {refused}")
    devices = daemon.scheduler.devices
    if req.gpus > len(devices):
        has = f"has {len(devices)} ({', '.join(devices)})" if devices else "has none"
        raise invalid(f"--gpus {req.gpus}: this box {has}")
    python = job_python(daemon.config.job_python)
    try:
        spec = await _spec(daemon, req, python)
    except services.ServiceError as exc:
        raise invalid(str(exc)) from None
    running = _running_same(daemon, spec)
    if running is not None:
        _listens(running)  # still its own port: not one another user took since
        await conn.send(_reply(daemon, running, reused=True))
        return
    watched = {name: value for name, value in daemon.config.rules.items() if name in services.SERVICE_RULES}
    with daemon.store.transaction():
        row = daemon.lifecycle.create(_name(daemon, req.kind), spec)
        daemon.store.set_job_alerts(row.id, watched, [], [])
    row = await daemon.scheduler.build(row, [])
    await conn.send(_reply(daemon, await _ready(daemon, row)))


@handles(CheckService)
async def check_service(daemon: Context, req: CheckService, conn: Connection) -> None:
    """The service, if it still runs and its own processes listen on its port: anything else listening there
    since it ended (any user of the box may bind a free port) is refused, as nothing listening is."""
    row = find(daemon, req.job)
    if row.spec.service is None or row.spec.port is None:
        raise invalid(f"job {row.id} is not a service")
    name = f"{row.spec.service} (job {row.id})"
    if row.state != JobState.RUNNING:
        raise invalid(f"{name} is {row.state}, not serving port {row.spec.port}: nothing was forwarded; start it "
                      f"again with tfrun {row.spec.service}")  # fmt: skip
    if not _listens(row):
        raise invalid(f"{name} does not listen on port {row.spec.port} now: nothing was forwarded")
    await conn.send(_reply(daemon, row, reused=True))


async def _spec(daemon: Context, req: StartService, python: str) -> JobSpec:
    """The service's spec: its command with a free port, its GPUs; `args` holds what makes two the same. The
    job interpreter is asked whether it has the service in a worker thread (it takes a process)."""
    port = services.free_port()
    loop = asyncio.get_running_loop()
    if req.kind == services.TENSORBOARD:
        rows = [find(daemon, ref) for ref in req.jobs] if req.jobs else _recent(daemon, req.since)
        rows = [row for row in rows if row.spec.service is None]
        if not rows:
            recent = f" (none made in the last {format_duration(req.since)}): name some"
            raise services.ServiceError("no jobs to show" + ("" if req.jobs else recent))
        runs = [(services.run_name(row.id, row.name), services.tensorboard_folder(row.job_dir)) for row in rows]
        command = await loop.run_in_executor(None, services.tensorboard_command, python, runs, port)
        return JobSpec(script=req.kind, args=(command[4],), command=tuple(command), env={}, gpus=req.gpus,
                       service=req.kind, port=port)  # fmt: skip
    root = os.path.abspath(os.path.expanduser(req.root_dir or "~"))
    command = await loop.run_in_executor(None, services.jupyter_command, python, port, root)
    return JobSpec(script=req.kind, args=(root,), command=tuple(command), env={"JUPYTER_TOKEN": services.new_token()},
                   gpus=req.gpus, service=req.kind, port=port)  # fmt: skip


def _recent(daemon: Context, since: float) -> list[JobRow]:
    """The jobs made in the last `since` seconds, oldest first."""
    after = time.time() - since
    return [row for row in daemon.store.list(include_final=True) if row.created_at >= after]


def _running_same(daemon: Context, spec: JobSpec) -> Optional[JobRow]:
    """An unfinished service of the same kind over the same runs or folder, with as many GPUs."""
    for row in daemon.store.list(include_final=False):
        if (row.spec.service, row.spec.args, row.spec.gpus) == (spec.service, spec.args, spec.gpus):
            return row
    return None


def _name(daemon: Context, kind: str) -> str:
    """`kind`, or `kind-2`, `kind-3`...: a name no unfinished job has, so `tfrun stop NAME` means one service."""
    taken = {row.name for row in daemon.store.list(include_final=False)}
    return next(name for n in range(1, len(taken) + 2) if (name := kind if n == 1 else f"{kind}-{n}") not in taken)


async def _ready(daemon: Context, row: JobRow) -> JobRow:
    """Wait until the service itself listens on its port; refused with its last output if it ends first or
    never listens (then it is left running: `tfrun logs NAME` shows why, `tfrun stop NAME` ends it), and with
    the squatter's uid if another process holds its port."""
    assert row.spec.port is not None
    deadline = time.monotonic() + services.READY_TIMEOUT_S
    while time.monotonic() < deadline:
        current = daemon.store.get(row.id) or row
        if current.final:
            _listens(current)  # a port taken first is why it ended: say so
            raise invalid(f"{row.spec.service} ended ({current.state}) before it listened: {_tail(current)}")
        if current.state == JobState.RUNNING and _listens(current):
            return current
        if current.state == JobState.QUEUED and current.waiting:
            raise invalid(f"{row.spec.service} (job {row.id}) is queued: {current.waiting}; it starts when that "
                          f"changes (tfrun stop {row.name or row.id} drops it)")  # fmt: skip
        await asyncio.sleep(_LOOK_S)
    raise invalid(f"{row.spec.service} (job {row.id}) did not listen within {services.READY_TIMEOUT_S:g}s: "
                  f"tfrun logs {row.id}")  # fmt: skip


def _listens(row: JobRow) -> bool:
    """Whether the service's own processes (its shim's tree) listen on its port: anything accepting there is
    not enough, since any user of the box may bind a loopback port; another's listener is refused, naming it."""
    assert row.spec.port is not None
    shim = jobdir.read_shim(os.path.join(row.job_dir, jobdir.SHIM))
    pids = process.descendants(shim["shim_pid"]) if shim and shim.get("shim_pid") else []
    try:
        return services.listens(row.spec.port, pids)
    except services.ServiceError as exc:
        raise invalid(f"{row.spec.service} (job {row.id}) is not served: {exc}; tfrun stop {row.name or row.id}, "
                      "then start it again (it gets another port)") from None  # fmt: skip


def _tail(row: JobRow) -> str:
    """The last lines of a service's output, on one line, or its reason."""
    try:
        with open(os.path.join(row.job_dir, jobdir.OUTPUT), "rb") as f:
            f.seek(max(0, os.fstat(f.fileno()).st_size - _LOG_TAIL_BYTES))
            lines = f.read().decode(errors="replace").strip().splitlines()
    except OSError:
        lines = []
    return " | ".join(lines[-3:]) or row.reason or "no output"


def _reply(daemon: Context, row: JobRow, reused: bool = False) -> ServiceReply:
    """The answer: the job, its port, and the path to open (Jupyter's with its token)."""
    assert row.spec.port is not None
    token = row.spec.env.get("JUPYTER_TOKEN")
    return ServiceReply(public(daemon, row), row.spec.port, f"/?token={token}" if token else "/", reused)
