"""A page of the jobs table: every box's jobs, newest first, narrowed by box, state and text, PAGE at a time.

Each box narrows its own list (ListJobs' `before`, `states`, `match`: the daemon's query), so that a page
asks each box for at most PAGE jobs however long its history, and "failed" means the newest failed jobs, not
the failed ones among the newest. The next page starts, on each box, below the oldest of its jobs this page
shows (a cursor a box: ids are a box's own); a box none of whose jobs made it onto the page starts where it
did. A page's URL holds its cursors, so a page can be bookmarked, and going back is the browser's.
"""

from __future__ import annotations

import asyncio
import typing
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Optional

from tfrun.constants import MAX_INT64, MAX_NAME
from tfrun.numerals import is_digits
from tfrun.protocol.channel import Channel, RemoteError
from tfrun.protocol.fields import JobState, State

from ..calls import jobs as job_calls
from ..calls import watching as watch_calls
from .boxes import LOSSES, PAGE, Box, Unreachable, row


class BadView(Exception):
    """A page's URL that names no page: a box not shown here, a state that is none, a text too long."""


@dataclass(frozen=True)
class JobsView:
    """A page as its URL asks for it: the box it is narrowed to ("": every box), the state and the text
    (an id, or part of a name), and each box's cursor (the page holds that box's jobs below this id)."""

    box: str = ""
    state: Optional[State] = None
    text: str = ""
    before: tuple[tuple[str, int], ...] = ()


def view_of(query: Mapping[str, str], befores: Sequence[str], boxes: Sequence[str]) -> JobsView:
    """The view a page's URL asks for (`box`, `state`, `q`, and `before` as BOX:ID, one a box), or BadView
    in words: a URL is the user's to edit, and the boxes' to be asked only what they can answer."""
    box, state, text = query.get("box", ""), query.get("state", ""), query.get("q", "").strip()
    if box and box not in boxes:
        raise BadView(f"no box {box!r} here (this page shows {', '.join(boxes)})")
    if state and state not in JobState.ALL:
        raise BadView(f"a state is one of {', '.join(JobState.ALL)}, not {state!r}")
    if len(text) > MAX_NAME:
        raise BadView(f"the text to look for is at most {MAX_NAME} characters")
    cursors: dict[str, int] = {}
    for given in befores:
        name, _, number = given.rpartition(":")
        if name not in boxes or not is_digits(number) or not 0 < int(number) <= MAX_INT64:
            raise BadView(f"before is BOX:ID, a box shown here and a job id, not {given!r}")
        cursors[name] = int(number)
    return JobsView(box, typing.cast(State, state) if state else None, text, tuple(sorted(cursors.items())))


async def every_page(shown: Sequence[Box], view: JobsView) -> dict[str, Any]:
    """The page `view` asks for, newest first (by when each job was made: boxes' ids are their own), each
    box's state (`up`, or why it is down), whether older jobs follow, and the cursors of the next page."""
    asked = [box for box in shown if not view.box or box.name == view.box]
    cursors = dict(view.before)
    answers = await asyncio.gather(*(_answer(box, cursors.get(box.name), view) for box in asked))
    rows: list[dict[str, Any]] = []
    states = {}
    older = 0
    for box, (found, count, down) in zip(asked, answers):
        rows += found
        older += count
        states[box.name] = {"up": down is None, "why": down}
    rows.sort(key=lambda shown: (shown["created_at"], shown["id"]), reverse=True)
    page = rows[:PAGE]
    after = dict(cursors)
    for shown_row in page:  # a box's oldest job on the page is where its next page starts
        after[shown_row["box"]] = min(shown_row["id"], after.get(shown_row["box"], shown_row["id"]))
    more = len(rows) > PAGE or older > 0
    return {"rows": page, "boxes": states, "more": more, "next": after}


async def _answer(box: Box, before: Optional[int], view: JobsView) -> tuple[list[dict[str, Any]], int, Optional[str]]:
    try:
        rows, older = await page_of(box, before, view)
        return rows, older, None
    except Unreachable as exc:
        return [], 0, str(exc)
    except RemoteError as exc:
        return [], 0, exc.message


async def page_of(box: Box, before: Optional[int], view: JobsView) -> tuple[list[dict[str, Any]], int]:
    """The box's newest PAGE jobs below `before` that pass the view's state and text, as rows with their
    last losses, and how many more of them are older: two round trips, the page and its losses (`GetLosses`:
    the running jobs', and the ended ones' not asked before, which never change once the daemon has read their
    log to its end, and are kept)."""

    async def asking(channel: Channel) -> tuple[list[dict[str, Any]], int]:
        states = [view.state] if view.state else []
        asked = job_calls.job_list(all=True, last=PAGE, before=before, states=states, match=view.text)
        listed = await asked.on(channel)
        wanted = [str(job.id) for job in listed.jobs if job.finished_at is None or job.id not in box.ended_losses]
        found = await watch_calls.losses(wanted, LOSSES).on(channel) if wanted else None
        rows = []
        for job in listed.jobs:
            losses = box.ended_losses.get(job.id) if job.finished_at is not None else None
            if losses is None:
                losses = list(found.losses.get(str(job.id), ())) if found else []
                if job.finished_at is not None and found and job.id not in found.reading:
                    box.ended_losses[job.id] = losses
            rows.append(row(box.name, job, losses))
        return rows, listed.older

    return await box.ask(asking)
