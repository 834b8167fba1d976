"""A page of a long history as `tfrun ui` asks for one (ListJobs' `before`, `states` and `match`): read by the
box's query, newest first, so that the 50 newest failed jobs of 3,000 are those, not the failed ones among the
newest 50, and the page after a page starts where it ended.

One real daemon, whose history is two jobs that ran (one succeeded, one failed) copied 3,000 times over in its
store (tests/harness/history.py), and one job running."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from typing import Any

import pytest
from harness import Tfrun, wait_for, write_script
from harness.history import copy_ended_jobs

from tfrun.client.calls import jobs as job_calls
from tfrun.client.library.asyncclient import AsyncClient
from tfrun.client.link.connection import Target
from tfrun.protocol.jobs import Job, JobList

pytestmark = [pytest.mark.slow]

COPIES = 3000
PAGE = 50


class History:
    """The daemon, its jobs newest first (as one listing of every job gives them), and the running one's id."""

    def __init__(self, tf: Tfrun, jobs: list[Job], running: int) -> None:
        self.tf = tf
        self.jobs = jobs
        self.running = running

    def ask(self, **narrowed: Any) -> JobList:
        """A page (`last` PAGE unless given) of every job, narrowed as `narrowed` says, from this daemon."""
        asked = job_calls.job_list(all=True, **{"last": PAGE, **narrowed})
        return asyncio.run(AsyncClient(Target(None)).call(asked))


@pytest.fixture(scope="module")
def history(tmp_path_factory: pytest.TempPathFactory) -> Iterator[History]:
    folder = tmp_path_factory.mktemp("pages")
    tf = Tfrun(folder / "home")
    with pytest.MonkeyPatch.context() as env:
        env.setenv("TFRUN_HOME", tf.env["TFRUN_HOME"])
        env.setenv("HOME", tf.env["HOME"])
        try:
            write_script(folder, "ok.py", "print('step 1 loss=0.5')\n")
            write_script(folder, "bad.py", "raise SystemExit(3)\n")
            write_script(folder, "sleeps.py", "import time\ntime.sleep(600)\n")
            good, bad = tf.submit("--name", "good", str(folder / "ok.py")), tf.submit(str(folder / "bad.py"))
            wait_for(lambda: {tf.job(good)["state"], tf.job(bad)["state"]} == {"succeeded", "failed"}, what="ended")
            copy_ended_jobs(tf, [good, bad], COPIES)
            running = tf.submit("--name", "live", str(folder / "sleeps.py"))
            wait_for(lambda: tf.job(running)["state"] == "running", what="the live job running")
            every = asyncio.run(AsyncClient(Target(None)).call(job_calls.job_list(all=True))).jobs
            yield History(tf, every[::-1], running)
        finally:
            tf.cleanup()


def _ids(reply: JobList) -> list[int]:
    return [job.id for job in reversed(reply.jobs)]  # newest first, as the page shows them


def test_pages_by_cursor_walk_the_whole_history_newest_first_once(history: History) -> None:
    seen: list[int] = []
    before = None
    started = time.monotonic()
    for _ in range(len(history.jobs) // PAGE + 2):  # the old daemon, which ignored `before`, never got to the end
        page = history.ask(before=before)
        seen += _ids(page)
        assert page.older == len(history.jobs) - len(seen), (len(seen), page.older)
        if not page.older:
            break
        before = seen[-1]
    each = (time.monotonic() - started) / (len(seen) // PAGE + 1)
    print(f"{len(seen) // PAGE + 1} pages of {len(history.jobs)} jobs by cursor: {each * 1000:.1f} ms a page")
    assert seen == [job.id for job in history.jobs]
    assert seen[0] == history.running
    assert history.ask(before=1).jobs == [] and history.ask(before=1).older == 0


def test_a_state_or_a_name_narrows_the_page_on_the_box(history: History) -> None:
    failed = [job.id for job in history.jobs if job.state == "failed"]
    assert len(failed) > 2 * PAGE
    first = history.ask(states=["failed"])
    assert _ids(first) == failed[:PAGE] and first.older == len(failed) - PAGE
    second = history.ask(states=["failed"], before=failed[PAGE - 1])
    assert _ids(second) == failed[PAGE : 2 * PAGE] and second.older == len(failed) - 2 * PAGE
    assert _ids(history.ask(states=["running", "queued"])) == [history.running]
    both = history.ask(states=["failed", "succeeded"], last=None)
    assert _ids(both) == [job.id for job in history.jobs if job.id != history.running]

    def named(text: str) -> list[int]:
        return [job.id for job in history.jobs if str(job.id) == text or text.lower() in (job.name or "").lower()]

    for text in ("old-12", "OLD-29", "live", str(history.running), "2999", "12"):
        expected = named(text)
        assert expected, text
        reply = history.ask(match=text, last=10)
        assert _ids(reply) == expected[:10] and reply.older == len(expected[10:]), text
    for text in ("%", "_", "old-%", "9" * 30, "nobody"):  # the text is itself, not a pattern (nor an id past int64)
        assert history.ask(match=text).jobs == [], text


def test_ps_is_what_it_was_over_a_long_history(history: History) -> None:
    """`ps -n` (ListJobs.last, none of the new fields) still lists the newest and counts all the rest."""
    shown = history.tf.run("ps", "-a", "-n", "3")
    rows = shown.stdout.splitlines()[2:]  # under "jobs on this machine" and the table's header
    assert [row.split()[0] for row in rows] == [str(job.id) for job in history.jobs[:3]][::-1], shown.stdout
    assert shown.stderr == f"tfrun: {len(history.jobs) - 3} older jobs not shown (-n 0 shows every job)\n"
    assert history.tf.ok("ps", "-q").split() == [str(history.running)]
