"""The Compare page's data: the jobs it names (`box:1,box:2`, or an array's tasks), and their records and
metrics in one stream.

Each job is followed by its own `JobFeed` (client/ui/feeds.py), the one its job page reads: a job shown in a
tab and compared in another is asked for once. One stream carries them all, because a browser opens at most
six connections to a server (HTTP/1.1): a sweep of twenty, a stream each, would wait for each other. The
stream's event id is each feed's number, joined by dots: a page whose connection dropped sends it back and
gets from each feed what it missed.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Mapping, Sequence
from typing import Any, Optional

from tfrun.numerals import is_digits
from tfrun.protocol.channel import Channel

from ..calls import jobs as job_calls
from .boxes import Box
from .feeds import Event, Feed

MAX_COMPARED = 100  # jobs one Compare page follows (an array has up to 1000 tasks: its first 100 are shown)


class BadJobs(ValueError):
    """Jobs a Compare URL names that are not jobs this page can show: why, in words."""


def named(text: str, shown: Mapping[str, Box]) -> list[tuple[Box, int]]:
    """The jobs of `box:1,box:2`, in that order, each once; BadJobs for a box not shown or a word not BOX:ID."""
    found: list[tuple[Box, int]] = []
    for ref in filter(None, (part.strip() for part in text.split(","))):
        box, _, job = ref.rpartition(":")
        if box not in shown:
            raise BadJobs(f"no box {box!r} here (this page shows {', '.join(shown)})" if box else
                          f"{ref!r} is not BOX:ID (e.g. local:12)")  # fmt: skip
        if not is_digits(job):
            raise BadJobs(f"{ref!r} is not BOX:ID (e.g. local:12)")
        if (shown[box], int(job)) not in found:
            found.append((shown[box], int(job)))
    if not found:
        raise BadJobs("no jobs named: give them as ?jobs=BOX:ID,BOX:ID, or pick them on the jobs page")
    if len(found) > MAX_COMPARED:
        raise BadJobs(f"{len(found)} jobs named: a page compares at most {MAX_COMPARED}")
    return found


async def array_tasks(box: Box, array: int) -> list[int]:
    """The ids of the jobs of array `array` (its tasks and their restarts), by task index. The array's id is its
    first task's, so every one is among the jobs listed since it: only those are asked for."""

    async def asking(channel: Channel) -> list[int]:
        newest = (await job_calls.job_list(all=True, last=1).on(channel)).jobs
        if not newest or newest[-1].id < array:
            return []
        listed = (await job_calls.job_list(all=True, last=newest[-1].id - array + 1).on(channel)).jobs
        tasks = sorted((job for job in listed if job.array_id == array), key=lambda job: (job.array_index, job.id))
        return [job.id for job in tasks]

    return await box.ask(asking)


async def refused(why: str) -> AsyncIterator[tuple[str, str, Any]]:
    """The one event of a stream of jobs that cannot be compared: why, which the page shows."""
    yield "0", "refused", {"message": why}


def resumed_from(last_event_id: str, feeds: int) -> list[int]:
    """Each feed's last event number the page had, from the id it sends back (`3.17.0`); all 0 otherwise."""
    numbers = last_event_id.split(".")
    if len(numbers) != feeds or not all(is_digits(number) for number in numbers):
        return [0] * feeds
    return [int(number) for number in numbers]


async def merged(feeds: Sequence[Feed], after: Sequence[int]) -> AsyncIterator[tuple[str, str, Any]]:
    """The feeds' events as they come, each as (the id of the whole, its kind, {"job": the feed's index, "data"}).

    A feed that failed (a box down) is reported as a `trouble` of its job; once it has ended so, the stream ends
    for the browser to open it again, which runs that feed again and the others on from where they were. Once
    every feed ended well (every job final), an `ended` says there is no more."""
    queue: asyncio.Queue[tuple[int, Optional[Event]]] = asyncio.Queue()
    readers = [asyncio.get_running_loop().create_task(_read(feed, n, index, queue))
               for index, (feed, n) in enumerate(zip(feeds, after))]  # fmt: skip
    numbers = list(after)
    open_feeds, failed = len(feeds), set()
    try:
        while open_feeds:
            index, event = await queue.get()
            if event is None:
                open_feeds -= 1
                continue
            number, kind, data = event
            numbers[index] = number
            if kind == "ended":
                if index in failed:
                    return
                continue
            if kind == "failure":
                failed.add(index)
                kind = "trouble"
            yield ".".join(map(str, numbers)), kind, {"job": index, "data": data}
        yield ".".join(map(str, numbers)), "ended", None
    finally:
        for reader in readers:
            reader.cancel()
        for reader in readers:
            with contextlib.suppress(asyncio.CancelledError):
                await reader


async def _read(feed: Feed, after: int, index: int, queue: asyncio.Queue[tuple[int, Optional[Event]]]) -> None:
    events = feed.read(after)
    try:
        async for event in events:
            await queue.put((index, event))
    finally:
        await events.aclose()  # type: ignore[attr-defined]
        queue.put_nowait((index, None))
