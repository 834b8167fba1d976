"""What the UI server follows on the boxes, once however many tabs show it: a page of jobs, a job's record and
metrics, a job's log (with its filters). Each is a `Feed`: one task that asks the box and publishes events
(numbered), and any number of readers (the pages' server-sent event streams) that wait for the next one.

A feed runs while someone reads it and LINGER_S more (a page reloaded finds it warm), then stops. One that
ended on an error (a box down past the reconnect timeout) runs again for the next reader: the page, whose
stream the browser opens again by itself, resumes once the link is back. A log feed keeps its cursor across
such restarts, so it carries on at the byte it had reached, as `logs -f` does through a reconnect.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import re
import time
from collections import deque
from collections.abc import AsyncIterator, Sequence
from typing import Any, Optional

from tfrun.protocol.channel import Channel, RemoteError
from tfrun.protocol.fields import JobState
from tfrun.protocol.jobs import Job
from tfrun.protocol.logs import LogQuery
from tfrun.protocol.watching import MetricSample, MetricsReply

from ..calls import jobs as job_calls
from ..calls import watching as watch_calls
from ..errors import TfrunError
from ..library.asyncclient import AsyncClient
from ..link.follow import LogCursor
from . import boxes, extras, jobpages
from .boxes import Box, Unreachable
from .jobpages import JobsView

LINGER_S = 30.0  # how long a feed nobody reads runs on
JOBS_EVERY_S = 2.0  # a page of jobs asked again (as `tfrun top` asks each frame)
JOB_EVERY_S = 1.0  # a running job's new metrics asked again
TAIL_LINES = 1000  # the log lines a page starts with; the rest follow as they come
KEPT_EVENTS = 2000  # log batches kept for a reader that joins or comes back
CHART_BUCKETS = 1000  # a chart's first draw, and each zoom's: about its width in pixels (GetMetrics.buckets)
EXTRAS_EVERY_S = 5.0  # a running job's record, alerts, checkpoints and GPUs asked again
_ESCAPES = re.compile(r"\x1b\[[0-9;?]*[ -/]*[@-~]")  # a terminal's colours and cursor moves

Event = tuple[int, str, Any]  # (number, kind, data as JSON)


class Feed:
    """One thing followed on a box, its events numbered from 1, for every reader at once."""

    def __init__(self, kept: Optional[int]) -> None:
        self.events: deque[Event] = deque(maxlen=kept)
        self.number = 0
        self.readers = 0
        self.task: Optional[asyncio.Task[None]] = None
        self.changed = asyncio.Event()
        self.idle_since = time.monotonic()

    async def run(self) -> None:
        """Ask the box and `publish` until done (a feed of a job that ended) or cancelled."""
        raise NotImplementedError

    def publish(self, kind: str, data: Any) -> None:
        self.number += 1
        self.events.append((self.number, kind, data))
        self.changed.set()
        self.changed = asyncio.Event()

    def _start(self) -> None:
        """Run the task, or run it again once it ended: its last error and end are then no longer news."""
        if self.task is None or self.task.done():
            kept = [event for event in self.events if event[1] not in ("failure", "ended")]
            self.events = deque(kept, maxlen=self.events.maxlen)
            self.task = asyncio.get_running_loop().create_task(self._guarded())

    async def _guarded(self) -> None:
        """`run`, with any failure published as an `error` event in words, never lost in a task."""
        try:
            await self.run()
        except Unreachable as exc:
            self.publish("failure", {"message": str(exc)})
        except (RemoteError, TfrunError) as exc:  # a job removed meanwhile; a follow that gave up
            self.publish("failure", {"message": exc.message})
        self.publish("ended", None)

    async def read(self, after: int) -> AsyncIterator[Event]:
        """The events numbered after `after` (those still kept), then each new one, until the feed ends."""
        self.readers += 1
        self._start()
        try:
            while True:
                changed = self.changed
                for event in [event for event in self.events if event[0] > after]:
                    after = event[0]
                    yield event
                    if event[1] == "ended":
                        return
                await changed.wait()
        finally:
            self.readers -= 1
            self.idle_since = time.monotonic()

    def stop_if_idle(self, now: float) -> bool:
        """Stop the task once no one has read for LINGER_S; whether the feed is stopped (and may be forgotten)."""
        if self.readers or now - self.idle_since < LINGER_S:
            return False
        if self.task is not None:
            self.task.cancel()
        return True


class JobsFeed(Feed):
    """One page of every box's jobs (client/ui/jobpages.py), asked every JOBS_EVERY_S; an event when it
    changed. Only the latest is kept: a reader wants the table as it is, not its history."""

    def __init__(self, shown: Sequence[Box], view: JobsView) -> None:
        super().__init__(kept=1)
        self.shown = shown
        self.view = view

    async def run(self) -> None:
        last = None
        while True:
            table = await jobpages.every_page(self.shown, self.view)
            if table != last:
                self.publish("jobs", {**table, "now": time.time()})
                last = table
            await asyncio.sleep(JOBS_EVERY_S)


class JobFeed(Feed):
    """A job's record and its metrics by step, on one connection kept while the feed runs: each second while it
    runs, the samples past the last step seen (`points` events: a page's chart grows by them); every
    EXTRAS_EVERY_S its record (`job`: its state is also in its log's `end`, at once), alerts and checkpoints
    (`extras`), and the samples of its GPUs' memory and load (`gpus`). The first look asks for the samples
    thinned to a chart's CHART_BUCKETS (100,000 steps would be 7 MB through the box's link and a second of
    tfrund's): the page asks a zoom's own (`zoomed`). The whole history is kept for a reader that joins."""

    def __init__(self, box: Box, job: int) -> None:
        super().__init__(kept=None)
        self.box = box
        self.job = job
        self.newest: Optional[int] = None  # the last step seen
        self.cursor: Optional[str] = None  # where the daemon's last read of the metrics ended (GetMetrics.cursor)
        self.extras: Optional[dict[str, Any]] = None
        self.extras_at = -EXTRAS_EVERY_S
        self.gpu_since: Optional[int] = None  # where the next read of the GPUs' samples starts (GetGpuUse.since)

    async def run(self) -> None:
        """On one connection for as long as the feed runs: the samples each JOB_EVERY_S, the record (and the
        alerts, checkpoints and GPUs) each EXTRAS_EVERY_S, and once more when the job has ended."""
        channel = await self.box.opened()
        try:
            last: Optional[Job] = None
            while True:
                self._points(await self.box.ask_on(channel, self._metrics))
                if last is None or time.monotonic() - self.extras_at >= EXTRAS_EVERY_S:
                    job = await self.box.ask_on(channel, job_calls.job(str(self.job)).on)
                    if job != last:  # kept whole for a reader that joins: a record only when it changed
                        self.publish("job", boxes.record(self.box.name, job))
                        last = job
                    final = job.state in JobState.FINAL
                    if final:  # its last samples, read once its log is (GetMetrics waits for that)
                        self._points(await self.box.ask_on(channel, self._metrics))
                    await self._extras(channel)
                    if job.gpus:
                        await self._gpu_use(channel)
                    if final:
                        return
                await asyncio.sleep(JOB_EVERY_S)
        finally:
            channel.close()

    async def _metrics(self, channel: Channel) -> MetricsReply:
        """The samples past the last step seen (thinned, the first time), read by the daemon from where its last
        read ended, and those it has read and not kept yet: a look costs a running job's new lines."""
        first = self.newest is None
        buckets = CHART_BUCKETS if first else None
        asked = watch_calls.metrics(str(self.job), after=self.newest, buckets=buckets, cursor=self.cursor)
        reply = await asked.on(channel)
        self.cursor = reply.cursor
        return reply

    def _points(self, reply: MetricsReply) -> None:
        """A `points` event of the samples new here (a daemon before GetMetrics.after sends all of them)."""
        newest = self.newest
        fresh = [sample for sample in reply.samples if newest is None or sample.step > newest]
        if fresh:
            self.newest = max(sample.step for sample in fresh)
            self.publish("points", columns(fresh, reply.thinned))

    async def _extras(self, channel: Channel) -> None:
        """The job's alerts and checkpoints (client/ui/extras.py), an `extras` event when they changed."""
        self.extras_at = time.monotonic()
        found = await extras.job_extras(self.box, self.job, channel)
        if found != self.extras:  # only the latest kept: a job's checkpoints listed again at each save add up
            self.events = deque((event for event in self.events if event[1] != "extras"), maxlen=self.events.maxlen)
            self.publish("extras", found)
            self.extras = found

    async def _gpu_use(self, channel: Channel) -> None:
        """A `gpus` event of the job's GPU samples new since the last (thinned to a chart the first time)."""
        first = self.gpu_since is None
        asked = watch_calls.gpu_use(str(self.job), self.gpu_since or 0, buckets=CHART_BUCKETS if first else None)
        reply = await self.box.ask_on(channel, asked.on)
        self.gpu_since = reply.next
        if reply.samples:
            shown = [{"time": s.time, "device": s.device, "used": s.used, "total": s.total, "load": s.load}
                     for s in reply.samples]  # fmt: skip
            self.publish("gpus", {"samples": shown, "thinned": reply.thinned})


def columns(samples: Sequence[MetricSample], thinned: bool) -> dict[str, Any]:
    """Samples as a chart takes them, a column a metric (no object a sample: 100,000 of those are 5 MB and a
    second of the page's parsing): `steps`, and each metric's value at each step, null where the sample has
    none and its name where it is not a number ("nan", "inf": JSON has none; the chart draws a gap there);
    `thinned` when steps between these were left out (the page asks for them when it zooms in)."""
    found: dict[str, list[Any]] = {}
    for index, sample in enumerate(samples):
        for name, value in sample.values.items():
            column = found.get(name)
            if column is None:
                column = found[name] = [None] * len(samples)
            column[index] = value if math.isfinite(value) else str(value)
    return {"steps": [sample.step for sample in samples], "columns": found, "thinned": thinned}


class LogFeed(Feed):
    """A job's log, the last TAIL_LINES lines (of those that pass the filters) and then each as it comes, in
    batches of lines; filters run on the box, as `tfrun logs` does them."""

    def __init__(self, box: Box, job: int, query: LogQuery) -> None:
        super().__init__(kept=KEPT_EVENTS)
        self.box = box
        self.job = job
        query.tail = TAIL_LINES
        self.query = query
        self.cursor = LogCursor()
        self.rest = b""
        # its own client of the box, whose word that the link is down (and back) is the page's to show
        self.client = AsyncClient(box.client.target, say=lambda line: self.publish("notice", {"message": line}))

    async def run(self) -> None:
        async for data in self.client.log_chunks(self.job, follow=True, query=self.query, cursor=self.cursor):
            *lines, self.rest = (self.rest + data).split(b"\n")
            if lines:
                self.publish("lines", [_shown(line) for line in lines])
        if self.rest:
            self.publish("lines", [_shown(self.rest)])
            self.rest = b""
        end = self.cursor.end
        self.publish("end", None if end is None else {"state": end.state, "exit_code": end.exit_code})


def _shown(line: bytes) -> str:
    """A line as a terminal would leave it: what follows its last carriage return, colours taken out."""
    text = line.decode(errors="replace").rstrip("\r")
    return _ESCAPES.sub("", text.rsplit("\r", 1)[-1])


class Feeds:
    """Every feed by what it follows: one per page of jobs, per job, per job and log filter."""

    def __init__(self, shown: Sequence[Box]) -> None:
        self.boxes = {box.name: box for box in shown}
        self.feeds: dict[tuple[Any, ...], Feed] = {}

    def jobs(self, view: JobsView) -> Feed:
        return self.get(("jobs", view), lambda: JobsFeed(list(self.boxes.values()), view))

    def job(self, box: Box, job: int) -> Feed:
        return self.get(("job", box.name, job), lambda: JobFeed(box, job))

    def log(self, box: Box, job: int, query: LogQuery) -> Feed:
        key = ("log", box.name, job, tuple(query.patterns), query.invert, query.ignore_case, query.fixed,
               query.before, query.after)  # fmt: skip
        return self.get(key, lambda: LogFeed(box, job, query))

    def get(self, key: tuple[Any, ...], make: Any) -> Feed:
        """The feed of `key`, made by `make` if there is none: the pages' own too (client/ui/boxfeeds.py's)."""
        self._forget_idle()
        feed = self.feeds.get(key)
        if feed is None:
            feed = self.feeds[key] = make()
        return feed

    async def sweep(self) -> None:
        """Stop the feeds nobody reads, every LINGER_S, for as long as the server runs."""
        while True:
            await asyncio.sleep(LINGER_S)
            self._forget_idle()

    def _forget_idle(self) -> None:
        now = time.monotonic()
        for key in [key for key, feed in self.feeds.items() if feed.stop_if_idle(now)]:
            del self.feeds[key]

    async def close(self) -> None:
        for feed in self.feeds.values():
            if feed.task is not None:
                feed.task.cancel()
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await feed.task
