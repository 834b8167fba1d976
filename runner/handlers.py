"""One handler per request of the protocol. Each gets the daemon, the request, and a way to send replies.

Handlers check a request and turn failures into Error replies; what a request does at length lives in its
own module: streaming a log in runner/logstream.py, a job's files in runner/jobfiles.py, its metrics in
runner/jobmetrics.py."""

from __future__ import annotations

import asyncio
import functools
import os
import shutil
from collections.abc import Awaitable
from pathlib import Path, PurePosixPath
from typing import TYPE_CHECKING, Any, Callable, Optional

from tfrun import __version__
from tfrun.constants import (
    DEFAULT_GRACE_S,
    FOLLOW_POLL_S,
    MAX_METRIC_SAMPLES,
    METRICS_SETTLE_S,
)
from tfrun.content import ManifestError, check_manifest
from tfrun.protocol import (
    PROTOCOL_VERSION,
    AlertList,
    Attach,
    AttachReply,
    Cancel,
    CancelReply,
    CancelResult,
    ConfigReply,
    DaemonInfo,
    DaemonStatus,
    DiskUsage,
    Doctor,
    DoctorReport,
    ErrorCode,
    ExplainMetrics,
    FileEntry,
    FileList,
    GetConfig,
    GetJob,
    GetMetrics,
    Gpu,
    GpuList,
    HaveBlobs,
    Job,
    JobList,
    JobReply,
    JobState,
    ListAlerts,
    ListFiles,
    ListGpus,
    ListJobs,
    Message,
    MetricsExplained,
    MetricsReply,
    MissingBlobs,
    NotifyReport,
    NotifyTest,
    Ok,
    Prune,
    PutBlob,
    PutBlobs,
    ReadFile,
    ReadLog,
    ReloadConfig,
    Remove,
    Restart,
    SetConfig,
    Shutdown,
    Submit,
    Top,
    TopReply,
    Wait,
    validate_name,
    write_message,
)
from tfrun.runner import housekeeping, jobdir, jobfiles, liveconfig, logstream, rules
from tfrun.runner.config import ConfigError
from tfrun.runner.doctor import job_python, run_checks
from tfrun.runner.explain import explain
from tfrun.runner.faults import crash_point
from tfrun.runner.gpus import read_gpu_memory
from tfrun.runner.job import JobRow, JobSpec
from tfrun.runner.jobmetrics import read_metrics, recent_losses
from tfrun.runner.lines import PatternError
from tfrun.runner.metrics import LogMetrics
from tfrun.runner.metrics import PatternError as MetricPatternError
from tfrun.runner.outbox import diagnose, masked, usable
from tfrun.runner.scheduler import SnapshotError, snapshot_files, tty_socket

if TYPE_CHECKING:
    from tfrun.runner.daemon import Daemon


class Connection:
    """One client's connection, as a handler sees it: a way to reply, and a key for its partial uploads."""

    def __init__(self, writer: asyncio.StreamWriter, key: str) -> None:
        self.writer = writer
        self.key = key

    async def send(self, msg: Message) -> None:
        await write_message(self.writer, msg)


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


async def submit(daemon: Daemon, req: Submit, conn: Connection) -> None:
    """Check the request, build the job's work dir from the uploaded contents, start the job's shim.

    Once per submission id: the same submit sent again (by a client that lost its daemon before the answer,
    to the next daemon or over a new SSH link to this one) gets the job the first one made."""
    sid = req.submission_id
    if sid is None:
        row = await _new_job(daemon, req)
    else:
        pending = daemon.submissions.get(sid)
        if pending is None:  # else the first is still being made here: its answer is this one's too
            pending = daemon.submissions[sid] = asyncio.ensure_future(_submitted_once(daemon, req, sid))
            pending.add_done_callback(lambda _: daemon.submissions.pop(sid, None))
        row = await asyncio.shield(pending)  # its client hanging up does not stop a job half made
    await conn.send(JobReply(public(daemon, row)))


async def _submitted_once(daemon: Daemon, req: Submit, sid: str) -> JobRow:
    """The job of submission `sid`: the one a daemon made before, or a new one."""
    found = daemon.store.find_submission(sid)
    if found is not None and found.prepared:
        return found
    if found is not None:
        # Recorded by a daemon that died before its work dir was built (the next one marked it failed): it
        # never ran and its client never learnt its id, so it makes way for the job it was meant to be.
        daemon.store.delete(found.id)
        shutil.rmtree(daemon.layout.jobs_dir / str(found.id), ignore_errors=True)
    return await _new_job(daemon, req, sid)


async def _new_job(daemon: Daemon, req: Submit, sid: Optional[str] = None) -> JobRow:
    script = _check_submit(daemon, req)
    command = _command(daemon, req, script)
    gpus, after = _resources(daemon, req)  # checked after the command, as they always were
    spec = JobSpec(
        source=req.source,
        script=str(script),
        args=tuple(req.args),
        command=tuple(command),
        env=req.env,
        git_commit=req.git_commit,
        git_dirty=req.git_dirty,
        files=len(req.files),
        bytes=sum(e.size for e in req.files if e.kind == "file"),
        max_restarts=req.max_restarts,
        gpus=gpus,
        priority=req.priority,
        after=after,
        tty=req.tty,
    )
    alert_rules = _alert_rules(daemon, req)
    with daemon.store.transaction():
        row = daemon.lifecycle.create(req.name, spec, submission_id=sid)
        daemon.store.set_job_alerts(row.id, alert_rules, req.notify, req.metric_patterns)
    try:
        started = await daemon.scheduler.build(row, req.files)
    except ManifestError as exc:
        raise _invalid(f"cannot build the work dir: {exc}") from None
    crash_point("submit-accepted")
    daemon.in_background(functools.partial(daemon.spares.prepare, req.files, req.source))
    housekeeping.after_submit(daemon)
    return started


def _resources(daemon: Daemon, req: Submit) -> tuple[int, tuple[int, ...]]:
    """What the job waits for besides its turn: its GPUs, the jobs it runs after (by id); checked."""
    devices = daemon.scheduler.devices
    gpus = daemon.scheduler.default_gpus() if req.gpus is None else req.gpus
    if gpus > len(devices):
        has = f"has {len(devices)} ({', '.join(devices)})" if devices else "has none"
        raise _invalid(f"the job asks for {gpus} GPU(s) and this box {has}")
    after = []
    for ref in req.after:
        dep = daemon.store.find(ref)
        if dep is None:
            raise RequestError(ErrorCode.NO_SUCH_JOB, f"--after: no job {ref!r}")
        after.append(dep.id)
    if req.tty and shutil.which("tmux") is None:
        raise _invalid("--tty needs tmux on the box (apt-get install tmux)")
    return gpus, tuple(after)


def _alert_rules(daemon: Daemon, req: Submit) -> dict[str, Optional[float]]:
    """The job's alert rules from the daemon's and the request's; its URLs and metric patterns checked."""
    try:
        chosen = rules.combine(daemon.config.rules, req.alerts, req.no_alerts)
    except rules.RuleError as exc:
        raise _invalid(str(exc)) from None
    try:
        LogMetrics(req.metric_patterns)
    except MetricPatternError as exc:
        raise _invalid(f"--metric: {exc}") from None
    for url in req.notify:
        if not usable(url):
            raise _invalid(f"--notify: {diagnose(url)}")
    return {name: value for name, value in chosen.items() if name in rules.JOB_RULES}


def public(daemon: Daemon, row: JobRow) -> Job:
    """The job as a client sees it, with its alert rules and its URLs masked."""
    job = row.public()
    stored = daemon.store.job_alerts(row.id)
    chosen, urls = (stored[0], stored[1]) if stored else (daemon.config.rules, [])
    job.alert_rules = rules.texts({k: v for k, v in chosen.items() if k in rules.JOB_RULES})
    job.notify = [masked(url) for url in urls]
    return job


async def doctor(daemon: Daemon, req: Doctor, conn: Connection) -> None:
    python = req.python or job_python(daemon.config.job_python)
    work = functools.partial(run_checks, daemon.config.checkpoint_root, python)
    await conn.send(DoctorReport(await asyncio.get_running_loop().run_in_executor(None, work)))


async def restart(daemon: Daemon, req: Restart, conn: Connection) -> None:
    """Run an ended job again, as a new job with the same snapshot, command and checkpoint folder."""
    row = _find(daemon, req.job)
    if not row.final:
        raise _invalid(f"job {row.id} is still {row.state}: cancel it first, or wait for it")
    files = _snapshot_files(row)
    new = daemon.lifecycle.rerun(row)
    daemon.supervisor.mark_starting(new.id)  # not to be picked up by Daemon.build_restarts as well
    try:
        started = await daemon.scheduler.build(new, files)
    except ManifestError as exc:
        raise _invalid(f"cannot build job {row.id}'s work dir again: {exc}") from None
    finally:
        daemon.supervisor.done_starting(new.id)
    await conn.send(JobReply(public(daemon, started)))


def _snapshot_files(row: JobRow) -> list[FileEntry]:
    """The manifest a job's work dir was built from."""
    try:
        return snapshot_files(row)
    except SnapshotError as exc:
        raise _invalid(str(exc)) from None


def _check_submit(daemon: Daemon, req: Submit) -> PurePosixPath:
    """The script's path in the snapshot, once everything about the request is known to be sound."""
    if req.name is not None:
        problem = validate_name(req.name)
        if problem:
            raise _invalid(problem)
    for key, value in req.env.items():
        if not key or "=" in key or "\0" in key or "\0" in value:
            raise _invalid(f"bad environment variable {key!r}: use NAME=VALUE")
    try:
        check_manifest(req.files)
        lacking = daemon.blobs.missing([e.digest for e in req.files if e.kind == "file" and e.digest])
    except ManifestError as exc:
        raise _invalid(f"bad file list: {exc}") from None
    if lacking:
        raise _invalid(f"{len(lacking)} file content(s) were never uploaded (e.g. {lacking[0][:12]})")
    entry = next((e for e in req.files if e.path == req.script), None)
    if entry is None or entry.kind == "dir":
        raise _invalid(f"script {req.script!r} is not among the files sent (ignored by .gitignore or .tfrunignore?)")
    script = PurePosixPath(req.script)
    if script.suffix != ".py" and entry.kind == "file" and not entry.mode & 0o111:
        raise _invalid(f"script {req.script} is not executable: chmod +x it, or name its interpreter")
    return script


def _command(daemon: Daemon, req: Submit, script: PurePosixPath) -> list[str]:
    """The argv the shim runs: `.py` through the job interpreter, anything else directly."""
    if script.suffix != ".py":
        return [f"./{script}", *req.args]
    python = req.python or job_python(daemon.config.job_python)
    if os.sep in python:
        if not os.access(python, os.X_OK):
            raise _invalid(f"job interpreter {python} does not exist or is not executable")
    else:
        found = shutil.which(python)
        if found is None:
            raise _invalid(f"job interpreter {python!r} is not on the daemon's PATH")
        python = found
    return [python, _as_argument(script), *req.args]


def _as_argument(script: PurePosixPath) -> str:
    """The script's path as no interpreter can read it as an option: `python3 -dash.py` is "Unknown option"."""
    return f"./{script}" if str(script).startswith("-") else str(script)


# -- queries ------------------------------------------------------------------------------------------------


async def list_jobs(daemon: Daemon, req: ListJobs, conn: Connection) -> None:
    await conn.send(JobList([public(daemon, row) for row in daemon.store.list(include_final=req.all)]))


async def get_job(daemon: Daemon, req: GetJob, conn: Connection) -> None:
    await conn.send(JobReply(public(daemon, _find(daemon, req.job))))


async def wait(daemon: Daemon, req: Wait, conn: Connection) -> None:
    row = await daemon.supervisor.wait_final(_find(daemon, req.job).id)
    await conn.send(JobReply(public(daemon, row)))


async def cancel(daemon: Daemon, req: Cancel, conn: Connection) -> None:
    grace = DEFAULT_GRACE_S if req.grace is None else req.grace

    async def one(ref: str, row: Optional[JobRow]) -> CancelResult:
        if row is None:
            return CancelResult(job=ref, ok=False, message=f"no job {ref!r}")
        if row.final:
            return CancelResult(ref, False, f"job {row.id} already ended ({row.state})", row.id, row.state)
        row = await daemon.supervisor.cancel(row, grace)
        return CancelResult(ref, True, f"job {row.id} {row.state}", row.id, row.state)

    rows = await _find_all(daemon, req.jobs)
    await conn.send(CancelReply(list(await asyncio.gather(*(one(ref, row) for ref, row in zip(req.jobs, rows))))))


async def _find_all(daemon: Daemon, refs: list[str]) -> list[Optional[JobRow]]:
    """The job each of `refs` names (None for none), looked up a hundred at a time with other clients served
    in between: the thousand a request may name take the store about 15 ms."""
    rows: list[Optional[JobRow]] = []
    for start in range(0, len(refs), 100):
        rows.extend(daemon.store.find(ref) for ref in refs[start : start + 100])
        await asyncio.sleep(0)
    return rows


async def read_log(daemon: Daemon, req: ReadLog, conn: Connection) -> None:
    """Send the log from `offset`; when following, until the job is final and all is sent (runner/logstream.py)."""
    row = _find(daemon, req.job)
    try:
        chosen = await logstream.selection(req)
    except PatternError as exc:
        raise _invalid(str(exc)) from None
    try:
        await logstream.stream(req, chosen, row, lambda: daemon.store.get(row.id) or row, daemon.log_growth, conn.send)
    except logstream.PastTheEnd as exc:
        raise RequestError(ErrorCode.BAD_REQUEST, str(exc)) from None


# -- uploads and pulls -------------------------------------------------------------------------------------


async def have_blobs(daemon: Daemon, req: HaveBlobs, conn: Connection) -> None:
    try:
        await conn.send(MissingBlobs(daemon.blobs.missing(req.digests, holder=conn.key)))
    except ManifestError as exc:
        raise _invalid(str(exc)) from None


async def put_blobs(daemon: Daemon, req: PutBlobs, conn: Connection) -> None:
    try:
        daemon.blobs.write_many(req.digests, req.sizes, req.data)
    except ManifestError as exc:
        raise _invalid(str(exc)) from None
    await conn.send(Ok())


async def put_blob(daemon: Daemon, req: PutBlob, conn: Connection) -> None:
    try:
        daemon.blobs.write_chunk(conn.key, req.digest, req.offset, req.data, req.last)
    except ManifestError as exc:
        raise _invalid(str(exc)) from None
    if req.last:
        await conn.send(Ok())


async def list_files(daemon: Daemon, req: ListFiles, conn: Connection) -> None:
    """Every entry under the path, named from the path's last part down (as `tfrun pull` writes them)."""
    row = _find(daemon, req.job)
    try:
        await conn.send(FileList(jobfiles.entries(*jobfiles.resolve(row, req.path))))
    except jobfiles.Refused as exc:
        raise _invalid(str(exc)) from None


async def read_file(daemon: Daemon, req: ReadFile, conn: Connection) -> None:
    row = _find(daemon, req.job)
    try:
        f = jobfiles.open_at(row, req.path, req.offset)
    except jobfiles.Refused as exc:
        raise _invalid(str(exc)) from None
    with f:
        for chunk in jobfiles.chunks(f, req.offset):
            await conn.send(chunk)


async def list_alerts(daemon: Daemon, req: ListAlerts, conn: Connection) -> None:
    job_id = _find(daemon, req.job).id if req.job is not None else None
    await conn.send(AlertList(daemon.store.alerts(job_id, req.limit)))


async def notify_test(daemon: Daemon, req: NotifyTest, conn: Connection) -> None:
    """One message to the URL given, or to each of the daemon's; the report says how each went. A URL given
    that apprise cannot use is bad input: the error says what is wrong with it."""
    if req.url and not usable(req.url):
        raise _invalid(diagnose(req.url))
    urls = [req.url] if req.url else daemon.config.notify
    if not urls:
        raise _invalid(
            f"no URL given, and the daemon has no notify URLs (set notify = [...] in {daemon.layout.config_file})"
        )
    host = daemon.alerts.host
    title = f"tfrun: test message from {host}"
    body = f"This is a test message from tfrund on {host}. Alerts about jobs on this box will arrive like this.\n"
    await conn.send(NotifyReport(await daemon.outbox.test(urls, title, body)))


async def get_metrics(daemon: Daemon, req: GetMetrics, conn: Connection) -> None:
    row = _find(daemon, req.job)
    if row.final:
        await _watch_caught_up(daemon, row.id)
    last = min(req.last or MAX_METRIC_SAMPLES, MAX_METRIC_SAMPLES)
    work = functools.partial(read_metrics, Path(row.job_dir), last)
    source, samples = await asyncio.get_running_loop().run_in_executor(None, work)
    await conn.send(MetricsReply(source=source, samples=samples))


async def explain_metrics(daemon: Daemon, req: ExplainMetrics, conn: Connection) -> None:
    row = _find(daemon, req.job)
    patterns = daemon.alerts.settings(row.id).patterns
    work = functools.partial(explain, Path(row.job_dir) / jobdir.OUTPUT, patterns, req.lines)
    try:
        readings, truncated = await asyncio.get_running_loop().run_in_executor(None, work)
    except FileNotFoundError:
        readings, truncated = [], False
    except MetricPatternError as exc:  # a daemon config changed since submit: say so, as the watch logs it
        raise _invalid(str(exc)) from None
    await conn.send(MetricsExplained(readings=readings, truncated=truncated))


async def _watch_caught_up(daemon: Daemon, job_id: int) -> None:
    """Wait (briefly) until the alert watch has read the rest of an ended job's log, which it marks by deleting
    the job's watch row: the metrics it reads from the output are whole only then, and `tfrun wait J && tfrun
    metrics J` must show the last lines' too. A watch that cannot finish (a daemon overloaded) costs at most
    METRICS_SETTLE_S; the reply is then what has been read."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + METRICS_SETTLE_S
    while daemon.store.watch_state(job_id) is not None and loop.time() < deadline:
        await asyncio.sleep(FOLLOW_POLL_S / 2)


async def list_gpus(daemon: Daemon, req: ListGpus, conn: Connection) -> None:
    await conn.send(GpuList(await _gpus(daemon)))


async def top(daemon: Daemon, req: Top, conn: Connection) -> None:
    rows = daemon.store.list(include_final=False)
    ended = daemon.store.recent_final(req.recent)
    shown = sorted([*rows, *ended], key=lambda row: row.id)
    loop = asyncio.get_running_loop()
    losses = {}
    for row in shown:
        found = await loop.run_in_executor(None, recent_losses, Path(row.job_dir), req.losses)
        if found:
            losses[str(row.id)] = found
    jobs = [public(daemon, row) for row in shown]
    await conn.send(TopReply(jobs=jobs, gpus=await _gpus(daemon), losses=losses, host=daemon.alerts.host))


async def _gpus(daemon: Daemon) -> list[Gpu]:
    """The devices jobs are given, with NVML's figures where it has them and the job holding each."""
    readings = await asyncio.get_running_loop().run_in_executor(None, read_gpu_memory)
    held = daemon.scheduler.held()
    gpus = []
    for device in daemon.scheduler.devices:
        reading = next((r for r in readings if r.is_device(device)), None)
        gpu = Gpu(device=device, job=held.get(device))
        if reading is not None:
            gpu.name, gpu.memory_used, gpu.memory_total = reading.name, reading.used, reading.total
            gpu.utilization = reading.utilization
        gpus.append(gpu)
    return gpus


async def attach(daemon: Daemon, req: Attach, conn: Connection) -> None:
    row = _find(daemon, req.job)
    if not row.spec.tty:
        raise _invalid(f"job {row.id} was not submitted with --tty: there is no session to attach to")
    if row.state != JobState.RUNNING:
        raise _invalid(f"job {row.id} is {row.state}: only a running job's session can be attached to")
    socket_path = tty_socket(daemon, row)
    await conn.send(AttachReply(command=["tmux", "-S", str(socket_path), "attach-session", "-t", "job"]))


# -- the daemon itself --------------------------------------------------------------------------------------


async def daemon_status(daemon: Daemon, req: DaemonStatus, conn: Connection) -> None:
    await conn.send(
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


async def shutdown(daemon: Daemon, req: Shutdown, conn: Connection) -> None:
    running = daemon.store.counts()[JobState.RUNNING]
    await conn.send(Ok(f"tfrund (pid {os.getpid()}) stopping; {running} running job(s) keep running"))
    daemon.stop()


# -- the daemon's config -------------------------------------------------------------------------------------


async def get_config(daemon: Daemon, req: GetConfig, conn: Connection) -> None:
    await conn.send(ConfigReply(str(daemon.layout.config_file), liveconfig.effective(daemon)))


async def reload_config(daemon: Daemon, req: ReloadConfig, conn: Connection) -> None:
    changes = _reconfigured(functools.partial(liveconfig.reload, daemon, "tfrun config reload"))
    await conn.send(ConfigReply(str(daemon.layout.config_file), liveconfig.effective(daemon), changes))


async def set_config(daemon: Daemon, req: SetConfig, conn: Connection) -> None:
    """Edit config.toml and reload it, with no await in between: no other request sees the file half done."""
    changes = _reconfigured(functools.partial(liveconfig.set_key, daemon, req.key, req.values, req.unset))
    await conn.send(ConfigReply(str(daemon.layout.config_file), liveconfig.effective(daemon), changes))


def _reconfigured(change: Callable[[], list[str]]) -> list[str]:
    try:
        return change()
    except ConfigError as exc:
        raise _invalid(f"{exc} (nothing changed)") from None


# -- housekeeping (runner/housekeeping.py) ---------------------------------------------------------------


async def remove(daemon: Daemon, req: Remove, conn: Connection) -> None:
    await conn.send(await housekeeping.remove(daemon, req.jobs, req.checkpoints, req.dry_run))


async def prune(daemon: Daemon, req: Prune, conn: Connection) -> None:
    await conn.send(await housekeeping.prune(daemon, req))


async def disk_usage(daemon: Daemon, req: DiskUsage, conn: Connection) -> None:
    await conn.send(await housekeeping.disk_report(daemon))


# Requests that only watch a job: the daemon drops one the moment its client hangs up, rather than when the
# job ends. Nothing else is dropped half way: a submit or a cancel whose client left still runs to its end.
WATCHING: tuple[type[Message], ...] = (Wait, ReadLog)

HANDLERS: dict[type[Message], Callable[[Daemon, Any, Connection], Awaitable[None]]] = {
    HaveBlobs: have_blobs,
    PutBlob: put_blob,
    PutBlobs: put_blobs,
    ListFiles: list_files,
    ReadFile: read_file,
    Submit: submit,
    ListJobs: list_jobs,
    GetJob: get_job,
    Wait: wait,
    Cancel: cancel,
    ReadLog: read_log,
    Doctor: doctor,
    Restart: restart,
    ListAlerts: list_alerts,
    NotifyTest: notify_test,
    GetMetrics: get_metrics,
    ExplainMetrics: explain_metrics,
    ListGpus: list_gpus,
    Top: top,
    Attach: attach,
    DaemonStatus: daemon_status,
    Shutdown: shutdown,
    Remove: remove,
    Prune: prune,
    DiskUsage: disk_usage,
    GetConfig: get_config,
    ReloadConfig: reload_config,
    SetConfig: set_config,
}
