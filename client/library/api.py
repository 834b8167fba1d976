"""The client API: one typed method per request. The CLI and `tfrun top` use it, and so may anyone (`tfrun.Client`).

`AsyncClient` is the core, for async code (a Jupyter cell may `await` it); `Client` runs the same methods
on an event loop of its own, for plain scripts:

    c = tfrun.Client("box")                  # a configured host, or user@host[:port]; None: this machine
    j = c.submit("train.py", ["--lr", "0.1"], tfrun.JobOptions(gpus=1, name="lr"))
    j.wait(); j.metrics(); list(j.logs())
    list(j.logs(query=tfrun.LogQuery(task=1)))   # task 1's output, of a job on several Slurm nodes (--nodes)
    tasks = c.submit_array("train.py", [("lr", ["0.1", "0.01"])])   # an array: a job a value
    c.call(admin.doctor())                   # any other request, typed: from tfrun.client.calls import admin

Each call opens its own connection (the keeper holds an SSH link warm between calls), so a client object
holds nothing open but its event loop. Failures are exceptions, one line each: `TfrunError` (with the exit
code the CLI uses), `RemoteError` from the daemon (`NoSuchJob` for a job it does not know, its message
saying where), `ProtocolError` for a peer that does not speak tfrun's protocol.

This module is the entry point (`from tfrun.client.library.api import Client`, or `tfrun.Client`): it holds the
synchronous facade, `Client` and its `JobHandle`s, and exports the async core from client/library/asyncclient.py.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator, Awaitable, Iterator, Sequence
from pathlib import Path
from typing import Callable, Optional, TypeVar, Union

from tfrun.protocol.jobs import CancelResult, Job
from tfrun.protocol.logs import LogQuery
from tfrun.protocol.submit import JobOptions
from tfrun.protocol.watching import Alert, Gpu, MetricSample
from tfrun.protocol.wire import Message

from ..calls import Call
from ..link.connection import Target
from .asyncclient import AsyncClient, NoSuchJob, Ref
from .submission import Submitted

__all__ = ["AsyncClient", "Call", "Client", "JobHandle", "JobOptions", "NoSuchJob", "Ref", "Submitted"]

T = TypeVar("T")
M = TypeVar("M", bound=Message)


class Client:
    """The same as `AsyncClient`, for code that is not async: each method runs to its end on an event loop
    of the client's own (so not inside a running loop, as a Jupyter cell's: `await` an AsyncClient there).
    Close it (or use `with`) to close that loop."""

    def __init__(self, host: Union[str, Target, None] = None, *, accept_new_host_key: bool = False) -> None:
        self.core = AsyncClient(host, accept_new_host_key=accept_new_host_key)
        self._loop = asyncio.new_event_loop()

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        """Close the client's event loop (`with` closes it at the end of its block)."""
        self._loop.close()

    def _run(self, coro: Awaitable[T]) -> T:
        return self._loop.run_until_complete(coro)

    def _iterate(self, items: AsyncGenerator[T, None]) -> Iterator[T]:
        """An async iterator's items, each awaited on the client's loop."""
        try:
            while True:
                try:
                    yield self._run(items.__anext__())
                except StopAsyncIteration:
                    return
        finally:
            self._run(items.aclose())

    def call(self, asked: Call[M, T]) -> T:
        """Any call of client/calls/ (`c.call(admin.doctor())`), and what of its reply it gives."""
        return self._run(self.core.call(asked))

    def submit(
        self,
        script: str,
        args: Sequence[str] = (),
        options: Optional[JobOptions] = None,
        *,
        workdir: Optional[Path] = None,
        confirm: Optional[Callable[[int, int], None]] = None,
    ) -> JobHandle:
        """Run `script` with `args` as a detached job, with `options` (`tfrun.JobOptions`: submit's options, as
        `AsyncClient.submit` takes them)."""
        return JobHandle(self, self._run(self.core.submit(script, args, options, workdir=workdir, confirm=confirm)).job)

    def submit_array(
        self,
        script: str,
        array: Sequence[tuple[str, Sequence[str]]],
        args: Sequence[str] = (),
        options: Optional[JobOptions] = None,
        *,
        workdir: Optional[Path] = None,
    ) -> list[JobHandle]:
        """Run `script` as an array, a job each combination of the values: `array=[("lr", ["0.1", "0.01"])]`
        is `tfrun submit --array lr=0.1,0.01`. A handle on each task, by index."""
        done = self._run(self.core.submit(script, args, options, workdir=workdir, array=array))
        return [JobHandle(self, job) for job in done.tasks]

    def job(self, job: Ref) -> JobHandle:
        """A handle on a job that exists (by id or name)."""
        return JobHandle(self, self.status(job))

    def jobs(self, all: bool = False, last: Optional[int] = None) -> list[Job]:
        return self._run(self.core.jobs(all, last))

    def status(self, job: Ref) -> Job:
        return self._run(self.core.status(job))

    def wait(self, job: Ref) -> Job:
        return self._run(self.core.wait(job))

    def cancel(self, jobs: Sequence[Ref], grace: Optional[float] = None) -> list[CancelResult]:
        return self._run(self.core.cancel(jobs, grace))

    def restart(self, job: Ref) -> JobHandle:
        return JobHandle(self, self._run(self.core.restart(job)))

    def logs(self, job: Ref, follow: bool = False, query: Optional[LogQuery] = None) -> Iterator[str]:
        return self._iterate(self.core.logs(job, follow, query))

    def metrics(self, job: Ref, last: Optional[int] = None) -> list[MetricSample]:
        return self._run(self.core.metrics(job, last))

    def alerts(self, job: Optional[Ref] = None, limit: int = 100) -> list[Alert]:
        return self._run(self.core.alerts(job, limit))

    def gpus(self) -> list[Gpu]:
        return self._run(self.core.gpus())

    def pull(self, job: Ref, paths: Sequence[str] = ("checkpoints",), dest: Path = Path(".")) -> tuple[int, int]:
        return self._run(self.core.pull(job, paths, dest))


class JobHandle:
    """One job of a `Client`: `record` is its record as last seen, refreshed by `status` and `wait`."""

    def __init__(self, client: Client, record: Job) -> None:
        self.client = client
        self.record = record

    def __repr__(self) -> str:
        return f"<job {self.id} {self.record.state}>"

    @property
    def id(self) -> int:
        """The job's id."""
        return self.record.id

    def status(self) -> Job:
        """Its record as it is now, kept in `record`."""
        self.record = self.client.status(self.id)
        return self.record

    def wait(self) -> Job:
        """Its final record (a restarted job's: the last restart's)."""
        self.record = self.client.wait(self.id)
        return self.record

    def logs(self, follow: bool = False, query: Optional[LogQuery] = None) -> Iterator[str]:
        """Its output as lines (`Client.logs`); with `follow`, until it ends."""
        return self.client.logs(self.id, follow, query)

    def metrics(self, last: Optional[int] = None) -> list[MetricSample]:
        """Its metrics by step, oldest first (`Client.metrics`)."""
        return self.client.metrics(self.id, last)

    def cancel(self, grace: Optional[float] = None) -> CancelResult:
        """Stop it: SIGTERM, SIGKILL after `grace` seconds (`Client.cancel`); what was done."""
        (result,) = self.client.cancel([self.id], grace)
        return result

    def restart(self) -> JobHandle:
        """Run it again, once it has ended, as a new job (`Client.restart`): a handle on that one."""
        return self.client.restart(self.id)
