"""`tfrun ui`'s jobs table over a long history, in a real browser: a state or a text narrows the list on the box
(the newest 50 failed jobs of hundreds, not the failed ones among the newest 50), and "older" goes on below
the page's oldest job, each box's cursor in the URL.

A local daemon whose history is two jobs that ran copied 400 times over in its store (tests/harness/history.py);
one `tfrun ui` and one headless Chromium (tests/harness/browser.py)."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING

import pytest
from harness import Tfrun, wait_for, write_script
from harness.browser import UiServer, by_css, chromium, click, start_ui
from harness.history import copy_ended_jobs

if TYPE_CHECKING:
    from selenium.webdriver import Chrome as WebDriver

pytestmark = [pytest.mark.browser, pytest.mark.slow]


@dataclass
class Shown:
    tf: Tfrun
    ui: UiServer
    browser: WebDriver
    failed: list[int]  # newest first


@pytest.fixture(scope="module")
def shown(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Shown]:
    folder = tmp_path_factory.mktemp("paging")
    tf = Tfrun(folder / "home")
    try:
        write_script(folder, "ok.py", "print('step 1 loss=0.5')\n")
        write_script(folder, "bad.py", "print('step 1 loss=2.5')\nraise SystemExit(3)\n")
        good, bad = tf.submit(str(folder / "ok.py")), tf.submit(str(folder / "bad.py"))
        wait_for(lambda: {tf.job(good)["state"], tf.job(bad)["state"]} == {"succeeded", "failed"}, what="ended")
        copy_ended_jobs(tf, [good, bad], 400)
        failed = [job["id"] for job in tf.jobs() if job["state"] == "failed"][::-1]
        ui = start_ui(tf.env, folder, "--host", "local")
        try:
            with chromium() as browser:
                browser.get(ui.url)
                yield Shown(tf, ui, browser, failed)
        finally:
            ui.stop()
    finally:
        tf.cleanup()


def _ids(browser: WebDriver) -> list[int]:
    found = browser.execute_script(
        "return [...document.querySelectorAll('#jobs tbody tr[data-id]')].map((tr) => tr.dataset.id)"
    )
    return [int(x) for x in found]


def test_a_state_narrows_the_list_on_the_box_and_older_goes_on_below(shown: Shown) -> None:
    browser = shown.browser
    browser.get(shown.ui.base + "/?state=failed")
    wait_for(lambda: _ids(browser) == shown.failed[:50], timeout=30, what="the 50 newest failed jobs")
    click(browser, "#older", "the older button")
    wait_for(lambda: _ids(browser) == shown.failed[50:100], timeout=30, what="the next 50 failed jobs")
    url = browser.current_url
    assert "state=failed" in url and f"before=local%3A{shown.failed[49]}" in url and "page=2" in url, url
    browser.get(shown.ui.base + "/?q=old-39")
    names = [f"old-39{tail}" for tail in ("9", "8", "7", "6", "5", "4", "3", "2", "1", "0", "")]
    expected = [job["id"] for name in names for job in shown.tf.jobs() if job["name"] == name]
    wait_for(lambda: _ids(browser) == expected, timeout=30, what="the jobs named old-39*")
    assert not by_css(browser, "#older")[0].is_displayed()


# Asks the daemon of TFRUN_HOME for the losses of the jobs named on its command line, prints the reply as JSON.
_ASK_LOSSES = """
import asyncio, json, sys
from tfrun.client.library.asyncclient import AsyncClient
from tfrun.client.calls import watching
reply = asyncio.run(AsyncClient().call(watching.losses(sys.argv[1:], 30)))
print(json.dumps([reply.losses, reply.reading]))
"""


def test_a_page_s_losses_come_in_one_request_each_row_its_own(shown: Shown) -> None:
    """GetLosses: 50 jobs' trend lines in one round trip (the page asked one request a job), a job removed
    since skipped; the page's rows show them."""
    newest = shown.failed[:3]
    asked = [*map(str, newest), "999999", str(newest[0])]
    ran = subprocess.run([sys.executable, "-c", _ASK_LOSSES, *asked], env=shown.tf.env, capture_output=True,
                         text=True, timeout=60, check=True)  # fmt: skip
    losses, reading = json.loads(ran.stdout)
    assert losses == {str(job): [2.5] for job in newest} and reading == []
    browser = shown.browser
    browser.get(shown.ui.base + "/?state=failed")
    wait_for(lambda: _ids(browser) == shown.failed[:50], timeout=30, what="the 50 newest failed jobs")
    cells = browser.execute_script("return [...document.querySelectorAll('#jobs td.loss')].map((td) => td.textContent)")
    assert cells == ["2.5"] * 50
