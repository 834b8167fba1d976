"""`tfrun ui`'s chart of a long job (issue 46: "a chart of 100,000 points loads in under a second and stays
interactive"): its first draw is thinned by the daemon to what the chart's pixels show (GetMetrics.buckets),
exact at its ends, and a zoom asks for the real samples of the steps it shows. A real daemon, a real `tfrun ui`,
headless Chromium.
"""

from __future__ import annotations

import math
import time
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import pytest
from harness import Tfrun, wait_for, write_script
from harness.browser import chromium, start_ui

from tfrun.protocol.watching import MetricSample
from tfrun.runner.metrics.jobmetrics import thinned

if TYPE_CHECKING:
    from selenium.webdriver import Chrome as WebDriver

STEPS = 100_000
# 100,000 steps at once; step 50,000's loss is not a number (a gap in the chart), the last one's a value of its own
_POINTS = f"""
import sys
loss = lambda i: "nan" if i == 50000 else "0.123456" if i == {STEPS - 1} else f"{{1 / (i + 1):.6f}}"
sys.stdout.write("".join(f"step {{i}} loss={{loss(i)}}\\n" for i in range({STEPS})))
"""
_CHART = "charts.get('loss').plot.data"


def test_thinning_keeps_each_ranges_ends_extremes_and_gaps() -> None:
    """Of each bucket: its first and last sample, each metric's lowest and highest, its first non-finite."""
    values = [5.0, 1.0, 9.0, 3.0, float("nan"), 4.0, 2.0, 8.0] * 10
    samples = [MetricSample(step, {"loss": value}) for step, value in enumerate(values)]
    kept = thinned(samples, 2)  # two buckets: steps 0-39 and 40-79
    assert [sample.step for sample in kept] == [0, 1, 2, 4, 39, 40, 41, 42, 44, 79]
    assert math.isnan(kept[3].values["loss"])
    assert all(sample is samples[sample.step] for sample in kept), "real samples only"


@pytest.fixture(scope="module")
def long_job(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Tfrun, int, Path]]:
    """A job of STEPS steps, ended (and a short one after it, job + 1, to compare it with)."""
    folder = tmp_path_factory.mktemp("ui-chart")
    tf = Tfrun(folder / "home")
    try:
        write_script(folder, "points.py", _POINTS)
        write_script(folder, "short.py", "for i in range(10):\n    print(f'step {i} loss={2 - i / 10}')\n")
        job = tf.submit(str(folder / "points.py"))
        tf.ok("wait", str(tf.submit(str(folder / "short.py"))))
        tf.ok("wait", str(job))
        yield tf, job, folder
    finally:
        tf.cleanup()


@pytest.mark.browser
@pytest.mark.slow
def test_a_chart_of_100000_steps_draws_its_end_and_zooms_to_real_points(long_job: tuple[Tfrun, int, Path]) -> None:
    tf, job, folder = long_job
    ui = start_ui(tf.env, folder, "--host", "local")
    try:
        with chromium() as browser:
            browser.get(ui.url)
            started = time.monotonic()
            browser.get(f"{ui.base}/job/local/{job}")
            last = wait_for(lambda: _last(browser), timeout=30, what="the chart's last step")
            print(f"a chart of {STEPS:,} steps drawn {time.monotonic() - started:.2f} s after its URL")
            assert last == [STEPS - 1, 0.123456]
            steps, losses = browser.execute_script(f"return {_CHART}")
            assert len(steps) < STEPS / 10, "the first draw is thinned"
            assert None in losses, "step 50,000's NaN is a gap (null), not left out"
            browser.execute_script("charts.get('loss').plot.setScale('x', {min: 49990, max: 50100})")
            wait_for(lambda: len(_shown(browser, 49990, 50100)) == 111, timeout=20, what="the zoom's every step")
            for step, loss in _shown(browser, 49990, 50100):
                assert loss is None if step == 50000 else loss == float(f"{1 / (step + 1):.6f}"), (step, loss)
            assert _last(browser) == [STEPS - 1, 0.123456], "the zoom kept the chart's end"
    finally:
        ui.stop()


@pytest.mark.browser
@pytest.mark.slow
def test_compare_zooms_each_thinned_job_to_its_real_points(long_job: tuple[Tfrun, int, Path]) -> None:
    """The Compare page's first draw of a long job is thinned as its own page's is; a zoom asks for the real
    samples of the steps shown, and keeps its zoom as the others' points come."""
    tf, job, folder = long_job
    ui = start_ui(tf.env, folder, "--host", "local")
    try:
        with chromium() as browser:
            browser.get(ui.url)
            browser.get(f"{ui.base}/compare?jobs=local:{job},local:{job + 1}")
            ready = f"return typeof chart !== 'undefined' && chart && chart.data[0].at(-1) === {STEPS - 1}"
            wait_for(lambda: browser.execute_script(ready), timeout=30, what="both jobs in the chart")
            steps, _, short = browser.execute_script("return chart.data")
            assert len(steps) < STEPS / 10, "the first draw is thinned"
            assert [loss for loss in short if loss is not None] == [2 - i / 10 for i in range(10)]
            browser.execute_script("chart.setScale('x', {min: 49990, max: 50100})")
            pairs = "return chart.data[0].map((step, i) => [step, chart.data[1][i]])"
            wait_for(lambda: len(_between(browser.execute_script(pairs), 49990, 50100)) == 111, timeout=20,
                     what="the zoom's every step")  # fmt: skip
            for step, loss in _between(browser.execute_script(pairs), 49990, 50100):
                assert loss is None if step == 50000 else loss == float(f"{1 / (step + 1):.6f}"), (step, loss)
            assert browser.execute_script("return [chart.scales.x.min, chart.scales.x.max]") == [49990, 50100]
    finally:
        ui.stop()


def _last(browser: WebDriver) -> object:
    """The chart's last step and its loss, once the chart is drawn."""
    return browser.execute_script(
        f"if (typeof charts === 'undefined' || !charts.get('loss')) return null;"
        f" const d = {_CHART}; return [d[0].at(-1), d[1].at(-1)]"
    )


def _shown(browser: WebDriver, low: int, high: int) -> list[tuple[int, object]]:
    """The chart's (step, loss) from `low` to `high` steps."""
    steps, losses = browser.execute_script(f"return {_CHART}")
    return _between(list(zip(steps, losses)), low, high)


def _between(points: list[tuple[int, object]], low: int, high: int) -> list[tuple[int, object]]:
    return [(step, value) for step, value in points if low <= step <= high]
