#!/usr/bin/env python3
"""What `tfrun ui` costs and how fast its pages are, side by side with what a user runs today. Run by hand
(a few minutes; needs openssh-server, root for the test sshd, and Debian's chromium and chromium-driver).

    .venv/bin/python -m bench.ui [--runs 5] [--history 10000] [--lines 200] [--points 100000] [--seconds 20]
        [--cpu-runs 3]

Each page is read by the tests' headless Chromium (tests/harness/browser.py), served by a real `tfrun ui`.
Rows:
  - first load of the jobs page, from the URL given to the browser to its rows drawn, of a box over the
    loopback sshd with --history ended jobs against the same box with none (a fresh `tfrun ui` each run, so
    no feed is warm; the history is two jobs that ran copied in the store: tests/harness/history.py);
  - a line a job prints, from its print to the job page showing it, against `tfrun logs -f` over the same
    link following it at the same time; p50 and p99 over --lines lines;
  - a chart of --points steps (a job that printed them, ended, and whose log tfrund's metrics watch has read
    through: `tfrun metrics` waits for that): from the URL to its last step drawn (the first draw is thinned to
    the chart's pixels: the points drawn say how many), and the longest task the page's main thread ran
    meanwhile and in the 5 s after (how long a click may wait);
  - 20 jobs printing 10 lines a second each on a local tfrund, one job page open: the UI server's CPU, and
    tfrund's above what it spends with no one watching, against one `tfrun logs -f` of the same job
    (CPU from /proc, over --seconds; --cpu-runs rounds of the three, medians).
Prints a Markdown table: each figure, its baseline, and the ratio or the issue's bound.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from bench.logs import WRITER, latencies, percentile
from bench.scale import cpu_seconds
from tests.harness import TFRUN, Sshd, Tfrun, remote_client, wait_for, write_script
from tests.harness.browser import chromium, start_ui
from tests.harness.history import copy_ended_jobs

PRINTS = """
import random, time
step = 0
while True:
    step += 1
    print(f"step {step} loss={random.random():.4f}", flush=True)
    time.sleep(0.1)
"""
POINTS = """
import sys
sys.stdout.write("".join(f"step {i} loss={1 / (i + 1):.6f}\\n" for i in range(int(sys.argv[1]))))
"""
# Installed in every page before its own scripts: the longest task of its main thread, and when each log line
# that holds "loss=" was added to the page (the browser's clock is this machine's).
WATCH = """
window.longest = 0; window.seen = [];
new PerformanceObserver((list) => { for (const e of list.getEntries()) longest = Math.max(longest, e.duration); })
  .observe({ type: "longtask", buffered: true });
document.addEventListener("DOMContentLoaded", () => {
  const log = document.getElementById("log");
  if (log) new MutationObserver((changes) => { const now = Date.now() / 1000;
    for (const change of changes) for (const node of change.addedNodes)
      for (const line of (node.textContent || "").split("\\n")) if (line.includes("loss=")) seen.push([now, line]);
  }).observe(log, { childList: true });
});
"""


def poll(check: Callable[[], Any], timeout: float = 120.0) -> float:
    """Seconds until `check()` is true, looked at every 5 ms."""
    started = time.perf_counter()
    while not check():
        if time.perf_counter() - started > timeout:
            raise TimeoutError("the page did not show it in time")
        time.sleep(0.005)
    return time.perf_counter() - started


def first_loads(browser: Any, tf: Tfrun, work: Path, rows: int, runs: int) -> list[float]:
    """Seconds from the URL to the jobs page's first `rows` rows drawn (0: its boxes' state drawn), each run
    with a `tfrun ui` of its own."""
    found = []
    for _ in range(runs):
        ui = start_ui(tf.env, work, "--host", "box")
        try:
            browser.get("about:blank")

            def drawn() -> bool:
                shown = browser.execute_script(
                    "return [document.querySelectorAll('#jobs tbody tr[data-id]').length,"
                    " (document.getElementById('boxes') || {}).textContent || '']"
                )
                return bool(shown[0] == rows and "box: up" in shown[1])

            started = time.perf_counter()
            browser.get(ui.url)
            found.append(time.perf_counter() - started + poll(drawn))
        finally:
            ui.stop()
    return found


def line_latencies(browser: Any, tf: Tfrun, work: Path, lines: int) -> tuple[list[float], list[float]]:
    """For each of `lines` lines a job on the box prints (its time in it), how long until the job page showed
    it, and until `tfrun logs -f` printed it, both following at once."""
    gate = work / "gate"
    write_script(work, "writer.py", WRITER)
    job = tf.submit(str(work / "writer.py"), str(gate), str(lines))
    ui = start_ui(tf.env, work, "--host", "box")
    results: dict[str, list[float]] = {}
    ready = threading.Event()
    command = [*TFRUN, "logs", "-f", str(job), "--grep", "loss"]
    follower = threading.Thread(target=lambda: results.update(cli=latencies(command, tf.env, lines, ready)))
    try:
        browser.get(f"{ui.url.split('?')[0]}job/box/{job}?key={ui.key}")
        poll(lambda: browser.execute_script("return document.getElementById('log') !== null"))
        follower.start()
        ready.wait()
        time.sleep(2)  # both at the end of the (empty) log
        gate.touch()
        follower.join()
        wait_for(lambda: len(browser.execute_script("return seen")) >= lines, timeout=60, what="the page's lines")
        seen = browser.execute_script("return seen")
        results["page"] = [at - float(line.split("loss=")[1]) for at, line in seen[:lines]]
    finally:
        ui.stop()
    return results["page"], results["cli"]


def chart_load(browser: Any, tf: Tfrun, work: Path, points: int) -> tuple[float, int, float, float]:
    """A job that printed `points` steps: seconds from its page's URL to its chart drawn to its last step, the
    points drawn (thinned), the longest main-thread task until then, and in the 5 s after."""
    write_script(work, "points.py", POINTS)
    job = tf.submit(str(work / "points.py"), str(points))
    tf.ok("wait", str(job))
    tf.ok("metrics", str(job), "--last", "1")  # once the watch read the log: a job printing 100,000 steps at once
    ui = start_ui(tf.env, work, "--host", "box")
    try:
        browser.get("about:blank")
        started = time.perf_counter()
        browser.get(f"{ui.url.split('?')[0]}job/box/{job}?key={ui.key}")
        last = "return Number((document.getElementById('chart') || {dataset: {}}).dataset.last ?? -1)"
        count = "return Number((document.getElementById('chart') || {dataset: {}}).dataset.points || 0)"
        took = time.perf_counter() - started + poll(lambda: browser.execute_script(last) == points - 1)
        loading = float(browser.execute_script("const l = longest; longest = 0; return l"))
        time.sleep(5)
        return took, int(browser.execute_script(count)), loading, float(browser.execute_script("return longest"))
    finally:
        ui.stop()


def cpu_over(pids: list[int], seconds: float) -> list[float]:
    """Each process's CPU seconds a minute over `seconds`."""
    before, started = [cpu_seconds(pid) for pid in pids], time.monotonic()
    time.sleep(seconds)
    took = time.monotonic() - started
    return [(cpu_seconds(pid) - b) / took * 60 for pid, b in zip(pids, before)]


def watching_cpu(browser: Any, work: Path, seconds: float, runs: int) -> dict[str, float]:
    """20 jobs printing 10 lines a second on a local tfrund: its CPU a minute with no one watching, with one
    `tfrun logs -f` of a job, and with that job's page open (and the UI server's then): `runs` rounds of the
    three in turn, each figure the median of its rounds (one round's figures move by a fifth on this machine)."""
    tf = Tfrun(work / "cpu" / "home")
    (work / "cpu" / "project").mkdir(parents=True)
    write_script(work / "cpu" / "project", "prints.py", PRINTS)
    found: dict[str, list[float]] = {"alone": [], "logs -f": [], "page": [], "ui server": []}
    try:
        jobs = [tf.submit(str(work / "cpu" / "project" / "prints.py")) for _ in range(20)]
        wait_for(lambda: all(job["state"] == "running" for job in tf.jobs()), timeout=120, what="20 jobs running")
        daemon = tf.daemon_pid()
        for _ in range(runs):
            time.sleep(3)
            found["alone"] += cpu_over([daemon], seconds)
            follower = subprocess.Popen([*TFRUN, "logs", "-f", str(jobs[0])], env=tf.env, stdout=subprocess.DEVNULL)
            time.sleep(3)
            found["logs -f"] += cpu_over([daemon], seconds)
            follower.kill()
            follower.wait()
            ui = start_ui(tf.env, work / "cpu", "--host", "local")  # a fresh one: a feed lingers 30 s after its page
            try:
                browser.get(f"{ui.url.split('?')[0]}job/local/{jobs[0]}?key={ui.key}")
                poll(lambda: "loss=" in browser.execute_script("return document.getElementById('log').textContent"))
                time.sleep(3)
                page, server = cpu_over([daemon, ui.proc.pid], seconds)
                found["page"].append(page)
                found["ui server"].append(server)
                browser.get("about:blank")
            finally:
                ui.stop()
    finally:
        tf.run("cancel", "--all", "--grace", "1", timeout=120)
        tf.cleanup()
    alone = found["alone"]
    extras = {
        "logs -f": [cli - base for cli, base in zip(found["logs -f"], alone)],
        "page": [page - base for page, base in zip(found["page"], alone)],
    }
    return {
        "alone": statistics.median(alone),
        "ui server": statistics.median(found["ui server"]),
        **{what: statistics.median(values) for what, values in extras.items()},
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=" ".join((__doc__ or "").split("\n\n")[0].split()))
    parser.add_argument("--runs", type=int, default=5, help="first loads measured each way (5)")
    parser.add_argument("--history", type=int, default=10000, help="ended jobs on the box of the history row (10000)")
    parser.add_argument("--lines", type=int, default=200, help="printed lines timed to the page and to logs -f (200)")
    parser.add_argument("--points", type=int, default=100000, help="steps of the chart row (100000)")
    parser.add_argument("--seconds", type=float, default=20.0, help="how long CPU is read, a row (20)")
    parser.add_argument("--cpu-runs", type=int, default=3, help="rounds of the CPU rows, medians taken (3)")
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="tfrun-bench-ui-"))
    sshd = Sshd(work / "sshd")
    rows: list[tuple[str, str, str, str]] = []
    try:
        tf = remote_client(Tfrun(work / "home"), sshd)
        with chromium() as browser:
            browser.execute_cdp_cmd("Page.addScriptToEvaluateOnNewDocument", {"source": WATCH})
            first_loads(browser, tf, work, 0, 1)  # the browser's own first start, and the box's link, not counted
            none = statistics.median(first_loads(browser, tf, work, 0, args.runs))
            write_script(work, "ok.py", "print('step 1 loss=0.5')\n")
            write_script(work, "bad.py", "print('step 1 loss=2.5')\nraise SystemExit(3)\n")
            models = [tf.submit(str(work / "ok.py")), tf.submit(str(work / "bad.py"))]
            for job in models:
                tf.run("wait", str(job))
            copy_ended_jobs(tf, models, args.history)
            full = statistics.median(first_loads(browser, tf, work, 50, args.runs))
            rows.append(
                (
                    f"jobs page, first load to its rows, {args.history:,} ended jobs on the box / none",
                    f"{full * 1000:.0f} ms",
                    f"{none * 1000:.0f} ms",
                    f"{full / none:.2f}x (<= 2x)",
                )
            )
            page, cli = (sorted(x * 1000 for x in found) for found in line_latencies(browser, tf, work, args.lines))
            for p, name in ((0.5, "p50"), (0.99, "p99")):
                ours, theirs = percentile(page, p), percentile(cli, p)
                rows.append(
                    (
                        f"a printed line in the job page, {name}, against `tfrun logs -f`",
                        f"{ours:.0f} ms",
                        f"{theirs:.0f} ms",
                        f"{ours / theirs:.2f}x" + (" (<= 2x)" if p == 0.5 else ""),
                    )
                )
            took, drawn, loading, after = chart_load(browser, tf, work, args.points)
            rows.append(
                (
                    f"a chart of {args.points:,} steps, URL to drawn ({drawn:,} points)",
                    f"{took * 1000:.0f} ms",
                    "",
                    "< 1 s" + (" holds" if took < 1 else " NOT held"),
                )
            )
            rows.append(
                (
                    "its page's longest main-thread task, loading / the 5 s after",
                    f"{loading:.0f} / {after:.0f} ms",
                    "",
                    "",
                )
            )
            cpu = watching_cpu(browser, work, args.seconds, args.cpu_runs)
        tf.cleanup()
    finally:
        sshd.stop()
    rows.append(
        ("UI server's CPU, 20 jobs printing 10 lines/s, one job page open", f"{cpu['ui server']:.2f} s/min", "", "")
    )
    page_extra, cli_extra = cpu["page"], cpu["logs -f"]
    rows.append(
        (
            f"tfrund's extra CPU for that page / for one `tfrun logs -f` of the job (medians of {args.cpu_runs})",
            f"{page_extra:.2f} s/min",
            f"{cli_extra:.2f} s/min",
            f"{page_extra / cli_extra:.2f}x (<= 1x; tfrund alone: {cpu['alone']:.2f} s/min)",
        )
    )
    print(f"\nloopback sshd, {os.cpu_count()} CPUs, headless Chromium; medians of {args.runs} first loads\n")
    print("| what | tfrun ui | baseline | ratio or bound |")
    print("| --- | --- | --- | --- |")
    for row in rows:
        print("| " + " | ".join(row) + " |")


if __name__ == "__main__":
    main()
