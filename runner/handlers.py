"""One handler per request of the protocol. Each gets the daemon, the request, and a way to send replies."""

from __future__ import annotations

import asyncio
import os
import shutil
import sys
from collections.abc import Awaitable
from pathlib import Path, PurePosixPath
from typing import TYPE_CHECKING, Any, Callable, Optional

from tfrun import __version__
from tfrun.constants import DEFAULT_GRACE_S, FOLLOW_POLL_S, LOG_CHUNK_BYTES, MAX_GRACE_S
from tfrun.protocol import (
    PROTOCOL_VERSION,
    Cancel,
    CancelReply,
    CancelResult,
    DaemonInfo,
    DaemonStatus,
    ErrorCode,
    GetJob,
    JobList,
    JobReply,
    JobState,
    ListJobs,
    LogChunk,
    LogEnd,
    Message,
    Ok,
    ReadLog,
    Shutdown,
    Submit,
    Wait,
    validate_name,
)
from tfrun.runner import jobdir, snapshot
from tfrun.runner.store import JobRow

if TYPE_CHECKING:
    from tfrun.runner.daemon import Daemon

Send = Callable[[Message], Awaitable[None]]


class RequestError(Exception):
    """A request that cannot be served; becomes an `Error` reply, and the connection stays open."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


def _find(daemon: Daemon, ref: str) -> JobRow:
    row = daemon.store.find(ref)
    if row is None:
        raise RequestError(ErrorCode.NO_SUCH_JOB, f"no job {ref!r}")
    return row


def _invalid(message: str) -> RequestError:
    return RequestError(ErrorCode.INVALID_INPUT, message)


# -- submit -------------------------------------------------------------------------------------------------


async def submit(daemon: Daemon, req: Submit, send: Send) -> None:
    """Check the request, snapshot the work dir into a new job's folder, start the job's shim."""
    source = Path(req.workdir)
    script = _check_submit(req, source)
    command = _command(daemon, req, script)
    spec: dict[str, Any] = {
        "source": str(source),
        "script": str(script),
        "args": req.args,
        "command": command,
        "env": req.env,
    }
    row = daemon.store.create_job(req.name, spec, daemon.layout.jobs_dir, daemon.config.checkpoint_root)
    job_dir = Path(row.job_dir)
    try:
        await asyncio.get_running_loop().run_in_executor(None, snapshot.take, source, job_dir / jobdir.WORK)
        Path(row.checkpoint_dir).mkdir(parents=True, exist_ok=True)
    except (snapshot.SnapshotError, OSError) as exc:
        daemon.store.delete(row.id)  # nothing was started: leave no trace of a job that never was
        shutil.rmtree(job_dir, ignore_errors=True)
        raise _invalid(str(exc)) from None
    try:
        await daemon.supervisor.start(row, _job_env(daemon, row, req.env), DEFAULT_GRACE_S)
    except OSError as exc:  # e.g. a full disk: the job is recorded as failed, not left queued forever
        daemon.supervisor.mark_failed(row, f"could not start: {exc}")
        raise RequestError(ErrorCode.INTERNAL, f"job {row.id} could not start: {exc.strerror or exc}") from None
    started = daemon.store.get(row.id) or row
    await send(JobReply(started.public()))


def _check_submit(req: Submit, source: Path) -> PurePosixPath:
    """The script's path inside the work dir, once everything about the request is known to be sound."""
    if req.name is not None:
        problem = validate_name(req.name)
        if problem:
            raise _invalid(problem)
    if not source.is_absolute():
        raise _invalid(f"work dir must be an absolute path, got {req.workdir!r}")
    if not source.is_dir():
        raise _invalid(f"work dir {source} does not exist or is not a directory")
    script = PurePosixPath(req.script)
    if script.is_absolute() or ".." in script.parts or not script.parts:
        raise _invalid(f"script {req.script!r} must be a path inside the work dir")
    path = source / script
    if not path.is_file():
        raise _invalid(f"script {path} does not exist or is not a file")
    if path.suffix != ".py" and not os.access(path, os.X_OK):
        raise _invalid(f"script {path} is not executable: chmod +x it, or name its interpreter")
    for key, value in req.env.items():
        if not key or "=" in key or "\0" in key or "\0" in value:
            raise _invalid(f"bad environment variable {key!r}: use NAME=VALUE")
    return script


def _command(daemon: Daemon, req: Submit, script: PurePosixPath) -> list[str]:
    """The argv the shim runs: `.py` through the job interpreter, anything else directly."""
    if script.suffix != ".py":
        return [f"./{script}", *req.args]
    python = req.python or daemon.config.job_python or shutil.which("python3") or sys.executable
    if os.sep in python:
        if not os.access(python, os.X_OK):
            raise _invalid(f"job interpreter {python} does not exist or is not executable")
    else:
        found = shutil.which(python)
        if found is None:
            raise _invalid(f"job interpreter {python!r} is not on the daemon's PATH")
        python = found
    return [python, str(script), *req.args]


def _job_env(daemon: Daemon, row: JobRow, user_env: dict[str, str]) -> dict[str, str]:
    """The daemon's environment, the user's --env on top, and tfrun's own variables, which always win."""
    env = dict(os.environ)
    env["PYTHONUNBUFFERED"] = "1"
    env.update(user_env)
    pythonpath = [str(daemon.layout.job_pythonpath), env.get("PYTHONPATH", "")]
    env["PYTHONPATH"] = os.pathsep.join(p for p in pythonpath if p)
    env["TFRUN_JOB_ID"] = str(row.id)
    env["TFRUN_JOB_DIR"] = row.job_dir
    env["TFRUN_CHECKPOINT_DIR"] = row.checkpoint_dir
    return env


# -- queries ------------------------------------------------------------------------------------------------


async def list_jobs(daemon: Daemon, req: ListJobs, send: Send) -> None:
    await send(JobList([row.public() for row in daemon.store.list(include_final=req.all)]))


async def get_job(daemon: Daemon, req: GetJob, send: Send) -> None:
    await send(JobReply(_find(daemon, req.job).public()))


async def wait(daemon: Daemon, req: Wait, send: Send) -> None:
    row = await daemon.supervisor.wait_final(_find(daemon, req.job).id)
    await send(JobReply(row.public()))


async def cancel(daemon: Daemon, req: Cancel, send: Send) -> None:
    grace = DEFAULT_GRACE_S if req.grace is None else req.grace
    if not 0 <= grace <= MAX_GRACE_S:
        raise _invalid(f"grace must be between 0 and {MAX_GRACE_S:g} seconds")

    async def one(ref: str) -> CancelResult:
        row = daemon.store.find(ref)
        if row is None:
            return CancelResult(job=ref, ok=False, message=f"no job {ref!r}")
        if row.final:
            return CancelResult(ref, False, f"job {row.id} already ended ({row.state})", row.id, row.state)
        row = await daemon.supervisor.cancel(row, grace)
        return CancelResult(ref, True, f"job {row.id} {row.state}", row.id, row.state)

    await send(CancelReply(list(await asyncio.gather(*(one(ref) for ref in req.jobs)))))


async def read_log(daemon: Daemon, req: ReadLog, send: Send) -> None:
    """Send the log from `offset` in chunks; when following, until the job is final and all is sent."""
    row = _find(daemon, req.job)
    if req.offset < 0:
        raise RequestError(ErrorCode.BAD_REQUEST, "offset must not be negative")
    path = Path(row.job_dir) / jobdir.OUTPUT
    offset = req.offset
    handle: Optional[Any] = None
    try:
        while True:
            # Final is read before the file: a job is final only once nothing of it can write any more.
            current = daemon.store.get(row.id) or row
            if handle is None and path.exists():
                handle = open(path, "rb")  # noqa: SIM115 - held across awaits, closed in finally
                if offset > os.fstat(handle.fileno()).st_size:
                    raise RequestError(ErrorCode.BAD_REQUEST, f"offset {offset} is past the end of the log")
            data = b""
            if handle is not None:
                handle.seek(offset)
                data = handle.read(LOG_CHUNK_BYTES)
            if data:
                await send(LogChunk(offset=offset, data=data))
                offset += len(data)
                continue
            if current.final or not req.follow:
                await send(LogEnd(offset=offset, state=current.state, exit_code=current.exit_code))
                return
            await asyncio.sleep(FOLLOW_POLL_S)
    finally:
        if handle is not None:
            handle.close()


# -- the daemon itself --------------------------------------------------------------------------------------


async def daemon_status(daemon: Daemon, req: DaemonStatus, send: Send) -> None:
    await send(
        DaemonInfo(
            pid=os.getpid(),
            version=__version__,
            protocol=PROTOCOL_VERSION,
            home=str(daemon.layout.home),
            socket=str(daemon.layout.socket),
            started_at=daemon.started_at,
            jobs=daemon.store.counts(),
        )
    )


async def shutdown(daemon: Daemon, req: Shutdown, send: Send) -> None:
    running = daemon.store.counts()[JobState.RUNNING]
    await send(Ok(f"tfrund (pid {os.getpid()}) stopping; {running} running job(s) keep running"))
    daemon.stop()


HANDLERS: dict[type[Message], Callable[[Daemon, Any, Send], Awaitable[None]]] = {
    Submit: submit,
    ListJobs: list_jobs,
    GetJob: get_job,
    Wait: wait,
    Cancel: cancel,
    ReadLog: read_log,
    DaemonStatus: daemon_status,
    Shutdown: shutdown,
}
