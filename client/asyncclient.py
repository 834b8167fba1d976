"""The async core of the client API: `AsyncClient`, one typed coroutine per request, and what a submit does.

The CLI's verbs and `tfrun top` use it, and so may async code (a Jupyter cell may `await` it). Each call
opens its own connection (the keeper holds an SSH link warm between calls), so a client object holds
nothing open. A "no job" refusal becomes `NoSuchJob`, its message naming the daemon. client/api.py is the
public entry point: it exports these names and holds `Client`, the same methods for plain scripts.
"""

from __future__ import annotations

import contextlib
import logging
import os
import uuid
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Callable, Optional, TypeVar, Union

from tfrun import restarts
from tfrun.client import config
from tfrun.client.connection import Target
from tfrun.client.errors import TfrunError
from tfrun.client.follow import LogCursor, LogQuery, follow_log, read_log, resilient
from tfrun.constants import EXIT_DAEMON, EXIT_NO_SUCH_JOB, MAX_CANCEL_JOBS
from tfrun.protocol.channel import Channel, RemoteError
from tfrun.protocol.fields import ErrorCode
from tfrun.protocol.jobs import Cancel, CancelResult, GetJob, Job, ListJobs, Restart, Wait
from tfrun.protocol.logs import Attach, LogEnd
from tfrun.protocol.submit import ArrayAxis, Submit, SubmitArray
from tfrun.protocol.watching import Alert, GetMetrics, Gpu, ListAlerts, ListGpus, MetricSample
from tfrun.protocol.wire import ProtocolError, Request

if TYPE_CHECKING:
    from tfrun.client.snapshot import Snapshot
    from tfrun.protocol.wire import Message

T = TypeVar("T")
M = TypeVar("M", bound="Message")
Ref = Union[int, str]  # a job: its id, or its name (the newest job of that name)


class NoSuchJob(RemoteError):
    """The daemon knows no job of that id or name; the message says which daemon: `no job 'x' on box`."""


@dataclass
class Submitted:
    """What a submit did: the job, and what its upload sent (contents the daemon held already are not sent)."""

    job: Job  # of an array, its first task
    files: int  # contents in the snapshot
    files_sent: int
    bytes_sent: int
    tasks: list[Job] = field(default_factory=list)  # of an array (submit --array), every task by index


class AsyncClient:
    """A daemon's jobs, as coroutines: the local daemon (started on demand, as the CLI does) or a box's."""

    def __init__(
        self,
        host: Union[str, Target, None] = None,
        *,
        accept_new_host_key: bool = False,
        say: Optional[Callable[[str], None]] = None,
    ) -> None:
        """`host`: a configured host (`tfrun hosts list`), user@host[:port], or None (or "local") for the
        daemon on this machine; or the CLI's `Target`, resolved from its --host already. `say` hears, a line
        each, that a wait or a follow lost its daemon and keeps trying, and that it is back (default: a
        warning on the `tfrun` logger; the CLI writes them on stderr)."""
        if isinstance(host, Target):
            self.target = host
        else:
            self.target = Target(config.resolve(host or config.LOCAL, config.load()), accept_new_host_key)
        self.say = say or logging.getLogger("tfrun").warning

    @property
    def place(self) -> str:
        """Where the jobs are, in words: `box`, or `this machine`."""
        return self.target.place()

    async def connect(self) -> Channel:
        """A channel of one's own (the caller closes it), for conversations this API does not have."""
        return await self.target.connect()

    def link_notice(self, down: bool, why: str) -> None:
        """Tell of an outage of the link to the daemon (client/follow.py's `Notice`), naming the daemon."""
        if down:
            why = f" ({why})" if why else ""
            self.say(f"lost the connection to {self.place}{why}; trying again until it is back (jobs run on)")
        else:
            self.say(f"connected to {self.place} again, after {why}")

    @contextlib.contextmanager
    def _where(self) -> Iterator[None]:
        """Name the daemon in a "no job" error: after `hosts add`, a bare `tfrun` quietly means the box."""
        try:
            yield
        except RemoteError as exc:
            if exc.code != ErrorCode.NO_SUCH_JOB or isinstance(exc, NoSuchJob):
                raise
            raise NoSuchJob(exc.code, f"{exc.message} on {self.place}") from None

    async def ask(self, request: Request[M]) -> M:
        """One request on a connection of its own, and its reply."""
        return await self.session(lambda channel: channel.ask(request))

    async def each(self, request: Request[M], take: Callable[[M], bool]) -> None:
        """A request answered in parts (`ListJobs` with `text`): `take` gets each reply as it comes and says
        whether more follow."""

        async def parts(channel: Channel) -> None:
            await channel.send(request)
            while take(await channel.reply_to(request)):
                pass

        await self.session(parts)

    async def session(self, action: Callable[[Channel], Awaitable[T]]) -> T:
        """Run `action` on a connection of its own, closed after."""
        with self._where():
            channel = await self.connect()
            try:
                return await action(channel)
            finally:
                channel.close()

    # -- jobs ----------------------------------------------------------------------------------------------

    async def jobs(self, all: bool = False, last: Optional[int] = None) -> list[Job]:
        """Jobs that have not ended; with `all`, every job (`tfrun ps -a`); with `last`, only the newest
        `last` of them (a tfrund that sends every one, an older one, is cut here)."""
        listed = (await self.ask(ListJobs(all=all, last=last))).jobs
        return listed if last is None else listed[max(0, len(listed) - last) :]

    async def status(self, job: Ref) -> Job:
        """One job's record, by id or name (a name means the newest job of that name)."""
        return (await self.ask(GetJob(job=str(job)))).job

    async def newest(self) -> Job:
        """The newest job (the last submitted): what `tfrun logs` and `status` mean without JOB."""
        jobs = await self.jobs(all=True, last=1)  # not the whole history
        if not jobs:
            raise TfrunError(f"no jobs on {self.place}", EXIT_NO_SUCH_JOB)
        return jobs[-1]

    async def wait(self, job: Ref) -> Job:
        """The job's final record, once it has ended: through a failure that was restarted (submit
        --max-restarts) to the last restart, and through daemon restarts and dropped links, for as long as
        a daemon comes back within the reconnect timeout."""

        async def waiting(channel: Channel) -> Job:
            record = (await channel.ask(Wait(job=str(job)))).job
            while record.restarted_as is not None:
                record = (await channel.ask(Wait(job=str(record.restarted_as)))).job
            return record

        with self._where():
            return await resilient(waiting, self.connect, notice=self.link_notice)

    async def cancel(self, jobs: Sequence[Ref], grace: Optional[float] = None) -> list[CancelResult]:
        """SIGTERM each job's processes, SIGKILL after `grace` seconds; returns once all have ended. A job
        that cannot be cancelled (unknown, ended already) is a result with `ok` False, not an exception."""
        wanted = [str(job) for job in jobs]
        results: list[CancelResult] = []
        for start in range(0, len(wanted), MAX_CANCEL_JOBS):
            results += (await self.ask(Cancel(jobs=wanted[start : start + MAX_CANCEL_JOBS], grace=grace))).results
        return results

    async def restart(self, job: Ref) -> Job:
        """Run an ended job again as a new job: its snapshot, command and checkpoint folder."""
        return (await self.ask(Restart(job=str(job)))).job

    async def attach_command(self, job: Ref) -> list[str]:
        """The command that opens a `--tty` job's tmux session, to run on the box."""
        return (await self.ask(Attach(job=str(job)))).command

    # -- output --------------------------------------------------------------------------------------------

    async def log_chunks(
        self,
        job: Ref,
        follow: bool = False,
        query: Optional[LogQuery] = None,
        cursor: Optional[LogCursor] = None,
        on_restart: Callable[[str, LogEnd], None] = lambda job, end: None,
    ) -> AsyncIterator[bytes]:
        """The job's output as the daemon sends it, bytes as the job wrote them (or the lines that pass
        `query`). With `follow`, until the job ends (see client/follow.py). `cursor.end`: the last LogEnd."""
        cursor = cursor or LogCursor()
        with self._where():
            if follow:
                async for data in follow_log(
                    self.connect, str(job), cursor, query or LogQuery(), on_restart, self.link_notice
                ):
                    yield data
                return
            channel = await self.connect()
            try:
                async for data in read_log(channel, str(job), cursor, False, query or LogQuery()):
                    yield data
            finally:
                channel.close()

    async def logs(self, job: Ref, follow: bool = False, query: Optional[LogQuery] = None) -> AsyncGenerator[str, None]:
        """The job's output as lines of text, without their line ends (bytes that are not UTF-8 replaced)."""
        rest = b""
        async for data in self.log_chunks(job, follow, query):
            *lines, rest = (rest + data).split(b"\n")
            for line in lines:
                yield line.decode(errors="replace")
        if rest:
            yield rest.decode(errors="replace")

    async def metrics(self, job: Ref, last: Optional[int] = None) -> list[MetricSample]:
        """The job's metrics by step, oldest first; the last `last` samples, or all."""
        return (await self.ask(GetMetrics(job=str(job), last=last))).samples

    async def alerts(self, job: Optional[Ref] = None, limit: int = 100) -> list[Alert]:
        """Alerts of one job, or of every job and the box, with how their delivery went; newest last."""
        return (await self.ask(ListAlerts(job=None if job is None else str(job), limit=limit))).alerts

    async def gpus(self) -> list[Gpu]:
        """The box's GPUs, their memory and load, and the job each is given to."""
        return (await self.ask(ListGpus())).gpus

    async def pull(self, job: Ref, paths: Sequence[str] = ("checkpoints",), dest: Path = Path(".")) -> tuple[int, int]:
        """Copy the job's checkpoints or files (see `tfrun pull`) into `dest`; return (files, bytes)."""
        from tfrun.client.transfer import pull

        Path(dest).mkdir(parents=True, exist_ok=True)
        return await self.session(lambda channel: pull(channel, str(job), list(paths), Path(dest)))

    # -- submit --------------------------------------------------------------------------------------------

    async def submit(
        self,
        script: str,
        args: Sequence[str] = (),
        *,
        workdir: Optional[Path] = None,
        name: Optional[str] = None,
        env: Optional[dict[str, str]] = None,
        python: Optional[str] = None,
        gpus: Optional[int] = None,
        priority: int = 0,
        after: Sequence[Ref] = (),
        max_restarts: int = 0,
        restart_on: Union[str, Sequence[str], None] = None,
        tty: bool = False,
        partition: Optional[str] = None,
        time: Optional[str] = None,
        nodes: Optional[int] = None,
        alerts: Sequence[str] = (),
        no_alerts: Sequence[str] = (),
        notify: Sequence[str] = (),
        metric_patterns: Sequence[str] = (),
        array: Sequence[tuple[str, Sequence[str]]] = (),
        on_snapshot: Callable[[Snapshot], None] = lambda snapshot: None,
        confirm: Optional[Callable[[int, int], None]] = None,
    ) -> Submitted:
        """Run `script` with `args` as a detached job, from a snapshot of its work dir (`workdir`, else the
        script's folder), as `tfrun submit` does; the options are submit's. `on_snapshot` sees the snapshot
        before it is hashed; `confirm(files, bytes)` hears what the upload will send and may stop it by
        raising. Runs its job once: a daemon that goes away before answering gets the same submit again.
        `array`: (key, values) pairs, as `--array KEY=V1,V2,...` gives them (tfrun/arrays.py): a job each
        combination of their values, all in `Submitted.tasks`. `restart_on`: the causes whose failures
        `max_restarts` restarts (`--restart-on`: "lost,oom" or ["lost", "oom"]; "all"; None: tfrun's
        default, lost, oom and signal); an unknown one raises ValueError before anything is sent."""
        causes = None if restart_on is None else list(restarts.parse(restart_on))
        snap, relative = _snapshot(script, workdir, self.target.local, on_snapshot)
        if python is None and self.target.host is not None:
            python = self.target.host.python
        elif python is not None and self.target.local and os.sep in python:
            python = str(Path(python).absolute())
        request = Submit(
            files=snap.entries,
            script=relative,
            args=list(args),
            name=name,
            env=dict(env or {}),
            python=python,
            source=str(snap.root),
            git_commit=snap.git_commit,
            git_dirty=snap.git_dirty,
            max_restarts=max_restarts,
            restart_on=causes,
            alerts=list(alerts),
            no_alerts=list(no_alerts),
            notify=list(notify),
            metric_patterns=list(metric_patterns),
            gpus=gpus,
            priority=priority,
            after=[str(job) for job in after],
            tty=tty,
            partition=partition,
            time=time,
            nodes=nodes,
            submission_id=uuid.uuid4().hex,  # the same in every retry: a daemon that took it once returns that job
        )
        axes = [ArrayAxis(key, list(values)) for key, values in array]
        with self._where():  # a job named by `after` that does not exist
            return await _send(self, snap, SubmitArray(request, axes) if axes else request, confirm)


def _snapshot(
    script: str, workdir: Optional[Path], local: bool, on_snapshot: Callable[[Snapshot], None]
) -> tuple[Snapshot, str]:
    """The work dir's snapshot, hashed, and the script's path in it."""
    from tfrun.client.snapshot import relative_script, scan, why_not_sent
    from tfrun.client.transfer import LazyProgress

    root, relative = relative_script(script, workdir)
    snap = scan(root, local=local)
    if snap.find(relative) is None:
        from tfrun.constants import EXIT_USAGE

        raise TfrunError(why_not_sent(root, relative), EXIT_USAGE)
    on_snapshot(snap)
    hashing = LazyProgress(snap.total_bytes, "hashing")
    try:
        snap.hash(hashing.advance)
    finally:
        hashing.close()
    return snap, relative


async def _send(
    client: AsyncClient,
    snap: Snapshot,
    request: Union[Submit, SubmitArray],
    confirm: Optional[Callable[[int, int], None]],
) -> Submitted:
    """Upload what the daemon lacks, then submit, again on a new connection if the daemon goes away."""
    from tfrun.client.transfer import upload

    asked = False  # whether the submit went out: from then on, a failure leaves its outcome unknown

    async def submitted(channel: Channel) -> Submitted:
        nonlocal asked
        sent, sent_bytes = await upload(channel, snap, confirm)
        asked = True
        if isinstance(request, SubmitArray):
            tasks = (await channel.ask(request)).jobs
            return Submitted(tasks[0], len(snap.sources), sent, sent_bytes, tasks)
        return Submitted((await channel.ask(request)).job, len(snap.sources), sent, sent_bytes)

    try:
        return await resilient(submitted, client.connect, hello_answers=False, notice=client.link_notice)
    except (TfrunError, ProtocolError, ConnectionError) as exc:  # not RemoteError: a refusal says why itself
        code = exc.exit_code if isinstance(exc, TfrunError) else EXIT_DAEMON
        raise TfrunError(_unsubmitted(exc, asked), code) from None
    except RemoteError as exc:
        if exc.code == ErrorCode.BAD_REQUEST and f"{SubmitArray.TYPE!r}" in exc.message:  # it knows no arrays
            host = client.target.host
            how = f"tfrun hosts install {host.label}" if host else "tfrund stop: the next verb starts this tfrun's"
            raise TfrunError(
                f"tfrund on {client.place} is older than this tfrun and has no --array: upgrade it ({how}); "
                "nothing was submitted",
                EXIT_DAEMON,
            ) from None
        raise


def _unsubmitted(exc: Exception, asked: bool) -> str:
    """Why a submit failed, and whether its job may exist after all: only if the daemon went away after the
    request reached it and none came back in time to say."""
    reason = exc.message if isinstance(exc, TfrunError) else str(exc)
    if not asked:
        return f"{reason}; nothing was submitted"
    return f"{reason}; the submit was sent but never answered, so the job may exist: see `tfrun ps -a`"
