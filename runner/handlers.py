"""One handler per request of the protocol. Each gets the daemon, the request, and a way to send replies."""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import functools
import os
import shutil
import stat
import time
from collections.abc import Awaitable
from pathlib import Path, PurePosixPath
from typing import TYPE_CHECKING, Any, BinaryIO, Callable, Optional

from tfrun import __version__
from tfrun.constants import (
    DEFAULT_GRACE_S,
    FILE_CHUNK_BYTES,
    FILTER_THREADS,
    FOLLOW_POLL_S,
    LOG_CHUNK_BYTES,
    MAX_METRIC_SAMPLES,
    METRICS_SETTLE_S,
)
from tfrun.content import ManifestError, check_manifest, check_relative
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
    FileChunk,
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
    LogChunk,
    LogEnd,
    LogLines,
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
from tfrun.runner import housekeeping, jobdir, liveconfig, rules
from tfrun.runner.alerts import read_metrics, recent_losses
from tfrun.runner.blobs import read_manifest, write_manifest
from tfrun.runner.config import ConfigError
from tfrun.runner.doctor import job_python, run_checks
from tfrun.runner.explain import explain
from tfrun.runner.faults import crash_point
from tfrun.runner.gpus import read_gpu_memory
from tfrun.runner.lines import BlockMatcher, LineFilter, PatternError, Selector, Tail, TerminalLines, display
from tfrun.runner.logindex import LogIndex, Stamper
from tfrun.runner.metrics import LogMetrics
from tfrun.runner.metrics import PatternError as MetricPatternError
from tfrun.runner.outbox import diagnose, masked, usable
from tfrun.runner.scheduler import tty_socket
from tfrun.runner.store import JobRow

if TYPE_CHECKING:
    from tfrun.runner.daemon import Daemon


# Threads that compile and match `logs` patterns, apart from the default pool (doctor, metrics, GPUs), so that
# costly filters queue behind each other instead of in front of everything else.
_FILTERS = concurrent.futures.ThreadPoolExecutor(FILTER_THREADS, thread_name_prefix="tfrund-filter")


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
    spec: dict[str, Any] = {
        "source": req.source,
        "script": str(script),
        "args": req.args,
        "command": _command(daemon, req, script),
        "env": req.env,
        "git_commit": req.git_commit,
        "git_dirty": req.git_dirty,
        "files": len(req.files),
        "bytes": sum(e.size for e in req.files if e.kind == "file"),
        "max_restarts": req.max_restarts,
    }
    spec.update(_resources(daemon, req))
    alert_rules = _alert_rules(daemon, req)
    with daemon.store.transaction():
        row = daemon.store.create_job(
            req.name, spec, daemon.layout.jobs_dir, daemon.config.checkpoint_root, submission_id=sid
        )
        daemon.store.set_job_alerts(row.id, alert_rules, req.notify, req.metric_patterns)
    try:
        started = await _start(daemon, row, req.files)
    except ManifestError as exc:
        raise _invalid(f"cannot build the work dir: {exc}") from None
    crash_point("submit-accepted")
    daemon.in_background(functools.partial(daemon.spares.prepare, req.files, req.source))
    housekeeping.after_submit(daemon)
    return started


def _resources(daemon: Daemon, req: Submit) -> dict[str, Any]:
    """What the job waits for: its GPUs, its priority, the jobs it runs after (by id)."""
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
    return {"gpus": gpus, "priority": req.priority, "after": after, "tty": req.tty}


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
    job.alert_rules = rules.specs({k: v for k, v in chosen.items() if k in rules.JOB_RULES})
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
    new = rerun(daemon, row, reason="restarted by request")
    daemon.supervisor.preparing(new.id)  # not to be picked up by Daemon.prepare_restarts as well
    try:
        started = await _start(daemon, new, files)
    except ManifestError as exc:
        raise _invalid(f"cannot build job {row.id}'s work dir again: {exc}") from None
    finally:
        daemon.supervisor.launched(new.id)
    await conn.send(JobReply(public(daemon, started)))


def rerun(daemon: Daemon, row: JobRow, reason: str, restarts_left: Optional[int] = None) -> JobRow:
    """The queued job that runs `row` again (its folder made, nothing in it yet); `row` records it as its
    restart. One transaction, or part of the one that makes `row` final (an automatic restart), so whoever
    waits for `row` learns of the new job at once, and a daemon killed at any point leaves both or neither.
    The snapshot manifest is written when the new job is built (start_rerun), which a new daemon redoes.
    """
    spec = dict(row.spec)
    spec["restart_of"] = row.id
    if restarts_left is not None:
        spec["max_restarts"] = restarts_left
    with daemon.store.transaction():
        new = daemon.store.create_job(
            row.name, spec, daemon.layout.jobs_dir, daemon.config.checkpoint_root, Path(row.checkpoint_dir)
        )
        settings = daemon.store.job_alerts(row.id)
        if settings is not None:
            daemon.store.set_job_alerts(new.id, *settings)
        daemon.store.update(row.id, restarted_as=new.id)
        daemon.store.add_event(row.id, "restarted", f"as job {new.id}: {reason}")
        daemon.store.add_event(new.id, "restart", f"of job {row.id}: {reason}")
    return new


async def start_rerun(daemon: Daemon, row: JobRow) -> None:
    """Build and start a job made by `rerun` from the snapshot of the job it runs again (for automatic
    restarts, and at daemon start for restarts a dead daemon did not finish, in the background)."""
    source = daemon.store.get(row.spec["restart_of"]) or row  # kept while this one is unfinished (housekeeping)
    try:
        await _start(daemon, row, _snapshot_files(source))
    except RequestError as exc:
        daemon.supervisor.mark_failed(row, f"could not start: {exc.message}")
    except ManifestError:
        pass  # recorded as the job's failure by _start
    finally:
        daemon.supervisor.launched(row.id)


async def _start(daemon: Daemon, row: JobRow, files: list[FileEntry]) -> JobRow:
    """Build the job's work dir from `files` (its snapshot) and keep the manifest; then the scheduler starts
    it, now or once its GPUs, its turn and the jobs it runs after allow."""
    job_dir = Path(row.job_dir)
    try:
        if not (job_dir / jobdir.FILES).exists():
            write_manifest(job_dir / jobdir.FILES, files)
        crash_point("prepare-manifest-written")
        if not (job_dir / jobdir.WORK).exists():  # else built by a daemon that died before recording it
            build = functools.partial(daemon.spares.build, files, job_dir / jobdir.WORK, row.spec.get("source"))
            await asyncio.get_running_loop().run_in_executor(None, build)
        Path(row.checkpoint_dir).mkdir(parents=True, exist_ok=True)
    except (ManifestError, OSError) as exc:
        if row.spec.get("restart_of") is not None:
            daemon.supervisor.mark_failed(row, f"could not build its work dir: {exc}")
        else:
            daemon.store.delete(row.id)  # nothing was started: leave no trace of a job that never was
            shutil.rmtree(job_dir, ignore_errors=True)
        raise ManifestError(str(exc)) from None
    daemon.store.update(row.id, prepared=1)
    crash_point("prepare-built")
    await daemon.scheduler.run_pass()
    return daemon.store.get(row.id) or row


def _snapshot_files(row: JobRow) -> list[FileEntry]:
    """The manifest a job's work dir was built from."""
    try:
        return read_manifest(Path(row.job_dir) / jobdir.FILES)
    except (OSError, ValueError, TypeError) as exc:
        raise _invalid(f"job {row.id} kept no readable snapshot manifest ({exc}); submit it again") from None


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
    """Send the log from `offset`; when following, until the job is final and all is sent."""
    row = _find(daemon, req.job)
    line_filter = LineFilter(tuple(req.patterns), req.invert, req.ignore_case, req.fixed)
    try:
        compiled, block_matcher = await _compile(line_filter)
    except PatternError as exc:
        raise _invalid(str(exc)) from None
    since = time.time() - req.since_ago if req.since_ago is not None else req.since
    path = Path(row.job_dir) / jobdir.OUTPUT
    index = LogIndex(Path(row.job_dir) / jobdir.INDEX) if since is not None or req.timestamps else None
    lines: Optional[_LineReader] = None
    if req.patterns or req.tail is not None or index is not None:
        stamper = Stamper(index, path) if req.timestamps and index is not None else None
        selector = Selector(compiled, req.invert, req.after, req.before)
        plain_selection = not req.invert and not req.after and not req.before and stamper is None
        blocks = block_matcher if plain_selection else None
        lines = _LineReader(conn, selector, req.offset, req.tail, index, since, stamper, blocks)
    with daemon.log_watch.follow(path) as grew, contextlib.ExitStack() as cleanup:
        offset = req.offset
        handle: Optional[Any] = None
        current, state_read = row, False
        while True:
            if handle is None and path.exists():
                handle = cleanup.enter_context(open(path, "rb"))
                if offset > os.fstat(handle.fileno()).st_size:
                    raise RequestError(ErrorCode.BAD_REQUEST, f"offset {offset} is past the end of the log")
                if since is not None and index is not None and lines is not None:
                    offset = lines.boundary = _line_start(handle, max(offset, index.offset_since(since)), offset)
            data = b""
            if handle is not None:
                handle.seek(offset)
                data = handle.read(LOG_CHUNK_BYTES)
            if data:
                if lines is None:
                    await conn.send(LogChunk(offset=offset, data=data))
                else:
                    await lines.feed(data, offset)
                offset += len(data)
                state_read = False
                continue
            if not state_read:
                # The file ends here for now. Read the job's state, then the file once more: a final job can
                # write no more, but it may have written between the read above and this state.
                current, state_read = daemon.store.get(row.id) or row, True
                continue
            ended = current.final or not req.follow
            if lines is not None:
                await lines.caught_up(final=current.final, end=offset)
            if ended:
                end = offset if lines is None else lines.resume_at
                await conn.send(LogEnd(end, current.state, current.exit_code, restarted_as=current.restarted_as))
                return
            await grew.wait(FOLLOW_POLL_S)
            state_read = False


async def _compile(line_filter: LineFilter) -> tuple[Optional[Any], BlockMatcher]:
    """The filter's patterns compiled, in a worker thread: a thousand of them cost RE2 tens of milliseconds,
    which must not be every other client's wait."""
    if not line_filter.patterns:
        return None, BlockMatcher(line_filter)

    def work() -> tuple[Optional[Any], BlockMatcher]:
        return line_filter.compile(), BlockMatcher(line_filter)

    return await asyncio.get_running_loop().run_in_executor(_FILTERS, work)


def _line_start(handle: BinaryIO, offset: int, floor: int) -> int:
    """The start of the line that holds byte `offset`: just after the last newline before it (or `floor`)."""
    pos = offset
    while pos > floor:
        step = min(LOG_CHUNK_BYTES, pos - floor)
        handle.seek(pos - step)
        found = handle.read(step).rfind(b"\n")
        if found >= 0:
            return pos - step + found + 1
        pos -= step
    return floor


class _LineReader:
    """The line-wise side of `read_log`: bytes in, passing terminal lines out, resumable at line ends."""

    def __init__(
        self,
        conn: Connection,
        selector: Selector,
        offset: int,
        tail: Optional[int],
        index: Optional[LogIndex] = None,
        since: Optional[float] = None,
        stamper: Optional[Stamper] = None,
        blocks: Optional[BlockMatcher] = None,
    ) -> None:
        self.conn = conn
        self.selector = selector
        self.terminal = TerminalLines()
        self.boundary = offset  # just after the last newline read
        self.resume_at = offset  # the boundary the client has been told about
        self.tail = Tail(tail) if tail is not None else None
        self.index = index
        self.since = since  # lines complete before this are skipped; None once a line was after it
        self.stamper = stamper
        self.blocks = blocks  # the fast path for whole blocks of plain lines, where the request allows it

    async def feed(self, data: bytes, offset: int) -> None:
        """Take the bytes at `offset` of the log. They are matched in a worker thread (RE2 lets go of the
        GIL): a thousand long patterns can cost a third of a second per chunk, time the other clients of
        the event loop must not wait through."""
        found = await asyncio.get_running_loop().run_in_executor(_FILTERS, self._match, data, offset)
        if found is not None:
            await self._deliver(*found)

    def _match(self, data: bytes, offset: int) -> Optional[tuple[list[bytes], int]]:
        """(the lines of `data` that pass, the boundary after them), or None while no line is finished."""
        if self.blocks is not None and self.since is None:
            head = self.terminal.unfinished_line_ends(data)  # the rest of a line begun in an earlier read
            cut = data.rfind(b"\n") + 1
            matched = self.blocks.lines(data[head:cut]) if cut > head else None
            if matched is not None:
                passing = self._select(self.terminal.feed(data[:head]), []) + matched
                self.terminal.feed(data[cut:])
                return passing, offset + cut
        finished = self.terminal.feed(data)
        if not finished:
            return None
        ends = [offset + end for end in _line_ends(data)] if self.stamper or self.since is not None else []
        return self._select(finished, ends), offset + data.rfind(b"\n") + 1

    async def _deliver(self, passing: list[bytes], boundary: int) -> None:
        self.boundary = boundary
        if self.tail is not None:
            self.tail.add(passing)
        else:
            await self._send(passing, boundary)

    async def caught_up(self, final: bool, end: int) -> None:
        """At the end of what the file holds: release --tail's lines, and a last line without newline."""
        if self.tail is not None:
            await self._send(list(self.tail.lines), self.boundary)
            self.tail = None
        if final:
            last = self.terminal.pending()
            if last is not None:
                await self._send(self._select([last], [end]), end)
            self.resume_at = end

    def _select(self, finished: list[bytes], ends: list[int]) -> list[bytes]:
        """The lines to send, as UTF-8, among terminal lines `finished` (ending at `ends`, when times count)."""
        if not finished:
            return []
        if self.since is not None and self.index is not None:
            skip = 0
            for end in ends:
                when = self.index.time_at(end)
                if when is not None and when < self.since:
                    skip += 1
                else:
                    self.since = None  # times only grow along the log: every later line is wanted
                    break
            finished, ends = finished[skip:], ends[skip:]
        stamps = [self.stamper.stamp(end) for end in ends] if self.stamper is not None else None
        texts = self.selector.select([display(line) for line in finished], stamps)
        return [text.encode("utf-8", "backslashreplace") for text in texts]

    async def _send(self, lines: list[bytes], next_offset: int) -> None:
        if lines:
            lines.append(b"")
            data = b"\n".join(lines)
            await self.conn.send(LogLines(offset=self.resume_at, next_offset=next_offset, data=data))
            self.resume_at = next_offset


def _line_ends(data: bytes) -> list[int]:
    """The offset just past each newline in `data`."""
    ends = []
    pos = data.find(b"\n")
    while pos >= 0:
        ends.append(pos + 1)
        pos = data.find(b"\n", pos + 1)
    return ends


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


def _job_path(row: JobRow, path: str) -> tuple[Path, PurePosixPath]:
    """(the file, its name as a pull writes it) for `path` in the job's namespace, confined to its folders.

    "checkpoints/..." is the job's checkpoint folder; anything else is under the job's own folder.
    """
    try:
        parts = check_relative(path.strip("/"))
    except ManifestError as exc:
        raise _invalid(str(exc)) from None
    if parts[0] == "checkpoints":
        root, inner = Path(row.checkpoint_dir), parts[1:]
    else:
        root, inner = Path(row.job_dir), parts
    target = root.joinpath(*inner)
    real_root = os.path.realpath(root)
    real = os.path.realpath(target)
    if real != real_root and not real.startswith(real_root + os.sep):
        raise _invalid(f"{path} leads out of job {row.id}'s folders")
    if not os.path.lexists(target):
        raise _invalid(f"job {row.id} has no {path}")
    return target, PurePosixPath(parts[-1])


async def list_files(daemon: Daemon, req: ListFiles, conn: Connection) -> None:
    """Every entry under the path, named from the path's last part down (as `tfrun pull` writes them)."""
    target, name = _job_path(_find(daemon, req.job), req.path)
    entries: list[FileEntry] = []

    def add(path: Path, label: PurePosixPath) -> None:
        st = path.lstat()
        if stat.S_ISLNK(st.st_mode):
            entries.append(FileEntry(str(label), "symlink", target=os.readlink(path)))
        elif stat.S_ISDIR(st.st_mode):
            entries.append(FileEntry(str(label), "dir", mode=stat.S_IMODE(st.st_mode), mtime=st.st_mtime))
            for child in sorted(path.iterdir()):
                add(child, label / child.name)
        elif stat.S_ISREG(st.st_mode):
            entries.append(
                FileEntry(str(label), "file", mode=stat.S_IMODE(st.st_mode), size=st.st_size, mtime=st.st_mtime)
            )

    add(target, name)
    await conn.send(FileList(entries))


async def read_file(daemon: Daemon, req: ReadFile, conn: Connection) -> None:
    target, _ = _job_path(_find(daemon, req.job), req.path)
    try:
        fd = os.open(target, os.O_RDONLY | os.O_NOFOLLOW)
    except OSError as exc:
        raise _invalid(f"cannot read {req.path}: {exc.strerror}") from None
    problem = _not_readable(os.fstat(fd), req)
    if problem is not None:
        os.close(fd)  # before os.fdopen, which raises IsADirectoryError on a folder and leaves the fd open
        raise _invalid(problem)
    with os.fdopen(fd, "rb") as f:
        f.seek(req.offset)
        offset = req.offset
        while True:
            data = f.read(FILE_CHUNK_BYTES)
            last = len(data) < FILE_CHUNK_BYTES
            await conn.send(FileChunk(offset=offset, last=last, data=data))
            offset += len(data)
            if last:
                return


def _not_readable(st: os.stat_result, req: ReadFile) -> Optional[str]:
    """Why the file opened for `req` cannot be sent from its offset, or None."""
    if not stat.S_ISREG(st.st_mode):
        return f"{req.path} is not a file"
    if req.offset > st.st_size:
        return f"offset {req.offset} is past the end of {req.path} ({st.st_size} bytes)"
    return None


# -- alerts and metrics -------------------------------------------------------------------------------------


async def list_alerts(daemon: Daemon, req: ListAlerts, conn: Connection) -> None:
    job_id = _find(daemon, req.job).id if req.job is not None else None
    await conn.send(AlertList(daemon.outbox.alerts(job_id, req.limit)))


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
    if not row.spec.get("tty"):
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
