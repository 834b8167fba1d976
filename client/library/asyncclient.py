"""The async core of the client API: `AsyncClient`, one typed coroutine per request, and what a submit does.

The CLI's verbs and `tfrun top` use it, and so may async code (a Jupyter cell may `await` it). Each call
opens its own connection (the keeper holds an SSH link warm between calls), so a client object holds
nothing open. A "no job" refusal becomes `NoSuchJob`, its message naming the daemon. client/library/api.py is the
public entry point: it exports these names and holds `Client`, the same methods for plain scripts.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Callable, Optional, TypeVar, Union

from tfrun.constants import EXIT_NO_SUCH_JOB, MAX_CANCEL_JOBS
from tfrun.protocol.channel import Channel, RemoteError
from tfrun.protocol.fields import ErrorCode
from tfrun.protocol.jobs import CancelResult, Job
from tfrun.protocol.logs import LogEnd, LogQuery
from tfrun.protocol.submit import JobOptions
from tfrun.protocol.watching import Alert, Gpu, MetricSample
from tfrun.protocol.wire import Request

from ..calls import Call
from ..calls import jobs as job_calls
from ..calls import logs as log_calls
from ..calls import watching as watch_calls
from ..config import settings as config
from ..errors import TfrunError
from ..link.connection import Target
from ..link.follow import LogCursor, follow_log, read_log, resilient
from . import submission
from .submission import Submission, Submitted

if TYPE_CHECKING:
    from tfrun.protocol.wire import Message

    from ..files.snapshot import Snapshot

T = TypeVar("T")
M = TypeVar("M", bound="Message")
Ref = Union[int, str]  # a job: its id, or its name (the newest job of that name)


class NoSuchJob(RemoteError):
    """The daemon knows no job of that id or name; the message says which daemon: `no job 'x' on box`."""


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
        """Tell of an outage of the link to the daemon (client/link/follow.py's `Notice`), naming the daemon."""
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

    async def call(self, asked: Call[M, T]) -> T:
        """One call (client/calls/: every request that gets one reply, typed) on a connection of its own, and
        what of the reply it gives: `await client.call(calls.admin.doctor())`."""
        return asked.result(await self.ask(asked.request))

    async def ask(self, request: Request[M]) -> M:
        """One request on a connection of its own, and its reply: for a request client/calls/ has no call for."""
        return await self.session(lambda channel: channel.ask(request))

    async def each(self, asked: Call[M, T], take: Callable[[T], bool]) -> None:
        """A call answered in parts (`calls.jobs.job_list` with `text`): `take` gets each part as it comes and
        says whether more follow."""

        async def parts(channel: Channel) -> None:
            await channel.send(asked.request)
            while take(asked.result(await channel.reply_to(asked.request))):
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
        listed = (await self.call(job_calls.job_list(all=all, last=last))).jobs
        return listed if last is None else listed[max(0, len(listed) - last) :]

    async def status(self, job: Ref) -> Job:
        """One job's record, by id or name (a name means the newest job of that name)."""
        return await self.call(job_calls.job(str(job)))

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
            record = await job_calls.wait(str(job)).on(channel)
            while record.restarted_as is not None:
                record = await job_calls.wait(str(record.restarted_as)).on(channel)
            return record

        with self._where():
            return await resilient(waiting, self.connect, notice=self.link_notice)

    async def cancel(self, jobs: Sequence[Ref], grace: Optional[float] = None) -> list[CancelResult]:
        """SIGTERM each job's processes, SIGKILL after `grace` seconds; returns once all have ended. A job
        that cannot be cancelled (unknown, ended already) is a result with `ok` False, not an exception."""
        wanted = [str(job) for job in jobs]
        results: list[CancelResult] = []
        for start in range(0, len(wanted), MAX_CANCEL_JOBS):
            done = await self.call(job_calls.cancel(wanted[start : start + MAX_CANCEL_JOBS], grace))
            results += done
        return results

    async def restart(self, job: Ref) -> Job:
        """Run an ended job again as a new job: its snapshot, command and checkpoint folder."""
        return await self.call(job_calls.restart(str(job)))

    async def attach_command(self, job: Ref) -> list[str]:
        """The command that opens a `--tty` job's tmux session, to run on the box."""
        return await self.call(log_calls.attach_command(str(job)))

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
        `query`). With `follow`, until the job ends (see client/link/follow.py). `cursor.end`: the last LogEnd."""
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
        return (await self.call(watch_calls.metrics(str(job), last))).samples

    async def alerts(self, job: Optional[Ref] = None, limit: int = 100) -> list[Alert]:
        """Alerts of one job, or of every job and the box, with how their delivery went; newest last."""
        return await self.call(watch_calls.alerts(None if job is None else str(job), limit))

    async def gpus(self) -> list[Gpu]:
        """The box's GPUs, their memory and load, and the job each is given to."""
        return await self.call(watch_calls.gpus())

    async def pull(self, job: Ref, paths: Sequence[str] = ("checkpoints",), dest: Path = Path(".")) -> tuple[int, int]:
        """Copy the job's checkpoints or files (see `tfrun pull`) into `dest`; return (files, bytes)."""
        from ..files.transfer import pull

        Path(dest).mkdir(parents=True, exist_ok=True)
        return await self.session(lambda channel: pull(channel, str(job), list(paths), Path(dest)))

    # -- submit --------------------------------------------------------------------------------------------

    async def submit(
        self,
        script: str,
        args: Sequence[str] = (),
        options: Optional[JobOptions] = None,
        *,
        workdir: Optional[Path] = None,
        array: Sequence[tuple[str, Sequence[str]]] = (),
        on_snapshot: Callable[[Snapshot], None] = lambda snapshot: None,
        confirm: Optional[Callable[[int, int], None]] = None,
    ) -> Submitted:
        """Run `script` with `args` as a detached job, from a snapshot of its work dir (`workdir`, else the
        script's folder), as `tfrun submit` does; `options` are submit's (`JobOptions(gpus=1, name="lr")`). An
        unknown cause in `options.restart_on` raises ValueError before anything is read or sent. `array`:
        (key, values) pairs, as `--array KEY=V1,V2,...` gives them (tfrun/arrays.py): a job each combination of
        their values, all in `Submitted.tasks`. `on_snapshot` sees the snapshot before it is hashed;
        `confirm(files, bytes)` hears what the upload will send and may stop it by raising. Runs its job once:
        a daemon that goes away before answering gets the same submit again."""
        ready = submission.prepare(self.target, script, args, options or JobOptions(), workdir, array, on_snapshot)
        return await self.send(ready, confirm)

    async def send(self, ready: Submission, confirm: Optional[Callable[[int, int], None]] = None) -> Submitted:
        """A submit made ready by `submission.prepare`, sent as `submit` sends it: `tfrun submit`'s way where
        its plain socket would not do (client/library/submission.py's `send_here`)."""
        with self._where():  # a job named by `after` that does not exist
            return await submission.send(self.target, self.connect, self.link_notice, ready, confirm)
