#!/usr/bin/env python3
"""What supervision costs tfrund, per job, per printed line and per queued job, and what history costs the
CLI. Run by hand (a few minutes; --history 10000 adds about as many again).

    .venv/bin/python -m bench.scale [--jobs 100] [--queued 1000] [--history 10000] [--seconds 20]
                                    [--only idle,quiet,lines,keras,flood,queued,history]

Each row starts a real local tfrund in a home of its own, starts its jobs as arrays (`submit --array`),
waits until they run, and reads the daemon's CPU time (utime + stime of /proc/PID/stat, all its threads)
over --seconds; the jobs are then cancelled and the daemon stopped. Rows:
  - idle: no jobs;
  - quiet: --jobs jobs that sleep;
  - lines: --jobs jobs printing `step N loss=x` once a second each;
  - keras: 10 jobs redrawing a Keras 3 progress bar (the bytes Keras writes: backspaces, a carriage
    return, colours) 20 times a second each, its rate with verbose=1 (no TensorFlow is loaded);
  - flood: one job printing `step N loss=x` in a tight loop (faster than tfrund parses lines): tfrund's RSS, the
    lines it reads a second against those printed, and `tfrun ps` timed meanwhile against `ps` before;
  - queued: --queued jobs waiting (`--after`) for one running job;
  - history: `tfrun ps -a` and `ps -a --json` with no jobs and with --history ended ones, `tfrun submit`
    with no job and with --queued queued, and tfrund's RSS with --jobs and with --history ended jobs.
Side by side, in the same run, the floor a user has today: `python3 -c pass` for the CLI rows.
Prints a Markdown table: each figure, the issue's bound, and whether it holds.
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import shutil
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Optional

from bench.timing import stats, timed
from tests.harness import TFRUN, Tfrun, wait_for

# A submit of an array returns once a scheduler pass has launched the tasks it can start: 1,000 quick tasks
# took longer than the harness waits for a command (120 s) on a 2-CPU machine.
ARRAY_TASKS = 200
QUIET = "import time\ntime.sleep(3600)\n"
LINES = """
import random, time
step = 0
while True:
    step += 1
    print(f"step {step} loss={random.random():.4f}", flush=True)
    time.sleep(1.0)
"""
# A loop that prints a loss a step with nothing else to do: hundreds of thousands of lines a second, for a minute
# (the row reads it for less; a minute of it is hundreds of MB of log).
FLOOD = """
import random, sys, time
end = time.monotonic() + 60
step = 0
while time.monotonic() < end:
    step += 1
    sys.stdout.write(f"step {step} loss={random.random():.4f}\\n")
sys.stdout.flush()
time.sleep(3600)
"""
# A Keras 3 progress bar's redraw as it lands in a file (captured from keras.utils.Progbar, verbose=1):
# the previous bar erased with backspaces, a carriage return, the bar in colours, the running means.
KERAS = r"""
import random, sys, time
width = 0
step = 0
while True:
    step += 1
    done = step % 1000
    filled = done * 20 // 1000
    bar = "\x1b[32m" + "\u2501" * filled + "\x1b[0m\x1b[37m" + "\u2501" * (20 - filled) + "\x1b[0m"
    text = (f"\x1b[1m{done:4d}/1000\x1b[0m {bar} \x1b[1m5s\x1b[0m 50ms/step - accuracy: {random.random():.4f}"
            f" - loss: {random.random():.4f}")
    sys.stdout.write("\b" * width + "\r" + text)
    sys.stdout.flush()
    width = len(text)
    time.sleep(0.05)
"""


def cpu_seconds(pid: int) -> float:
    """User plus system CPU time of a process, all its threads."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise RuntimeError("no VmRSS")


def daemon_cpu_per_minute(tf: Tfrun, seconds: float) -> float:
    """tfrund's CPU seconds per minute of wall time, over `seconds`."""
    pid = tf.daemon_pid()
    time.sleep(2.0)  # let what the start of the row set off settle
    before, started = cpu_seconds(pid), time.monotonic()
    time.sleep(seconds)
    return (cpu_seconds(pid) - before) / (time.monotonic() - started) * 60


@contextmanager
def home(work: Path, name: str) -> Iterator[Tfrun]:
    """A fresh tfrun home with its daemon started; its jobs cancelled and its daemon stopped after."""
    tf = Tfrun(work / name / "home")
    tf.env.pop("PYTHONDONTWRITEBYTECODE", None)
    assert tf.daemon("start").returncode == 0
    try:
        yield tf
    finally:
        tf.run("cancel", "--all", "--grace", "1", timeout=600)
        tf.daemon("stop")


def submit_array(tf: Tfrun, project: Path, name: str, script: str, count: int, *extra: str) -> list[int]:
    """`count` jobs of `script` as arrays of at most ARRAY_TASKS tasks; their ids."""
    (project / name).write_text(script)
    ids: list[int] = []
    for first in range(0, count, ARRAY_TASKS):
        values = ",".join(str(i) for i in range(first, min(count, first + ARRAY_TASKS)))
        out = tf.ok("submit", "--array", f"i={values}", *extra, str(project / name))
        ids.extend(int(line) for line in out.split())
    return ids


def succeeded(tf: Tfrun, count: int) -> bool:
    """Whether `count` jobs of `tf` have succeeded."""
    return states(tf).get("succeeded", 0) >= count


def states(tf: Tfrun) -> dict[str, int]:
    counts: dict[str, int] = {}
    for job in tf.jobs():
        counts[job["state"]] = counts.get(job["state"], 0) + 1
    return counts


def wait_running(tf: Tfrun, count: int) -> None:
    wait_for(lambda: states(tf).get("running", 0) >= count, timeout=600, what=f"{count} jobs running")


def cpu_row(work: Path, name: str, script: Optional[str], count: int, seconds: float) -> float:
    project = work / name / "project"
    project.mkdir(parents=True)
    with home(work, name) as tf:
        if script is not None:
            submit_array(tf, project, "job.py", script, count)
            wait_running(tf, count)
        return daemon_cpu_per_minute(tf, seconds)


def flood_row(work: Path, seconds: float) -> tuple[float, float, float, float, float, float]:
    """While one job prints metric lines nonstop: tfrund's CPU per minute and RSS (MB), the lines the job
    printed and the watch read a second, and `ps`'s time then and before the job started (medians of 9)."""
    project = work / "flood" / "project"
    project.mkdir(parents=True)
    with home(work, "flood") as tf:
        before = [timed([*TFRUN, "ps"], tf.env) for _ in range(9)]
        (job,) = submit_array(tf, project, "flood.py", FLOOD, 1)
        wait_running(tf, 1)
        log, kept = tf.job_dir(job) / "output.log", tf.job_dir(job) / "logmetrics.jsonl"
        began, printed_at_start, read_at_start = time.monotonic(), lines_in(log), lines_in(kept)
        cpu = daemon_cpu_per_minute(tf, seconds)
        elapsed = time.monotonic() - began
        printed, read = (lines_in(log) - printed_at_start) / elapsed, (lines_in(kept) - read_at_start) / elapsed
        during = [timed([*TFRUN, "ps"], tf.env) for _ in range(9)]
        rss = rss_mb(tf.daemon_pid())
    shutil.rmtree(work / "flood", ignore_errors=True)  # its log: hundreds of MB, which no later row reads
    return cpu, rss, printed, read, stats(during)[0], stats(before)[0]


def lines_in(path: Path) -> int:
    """The lines a file holds so far (0 if there is none yet), counted in blocks: a flood's log is hundreds of MB."""
    count = 0
    try:
        with open(path, "rb") as f:
            while block := f.read(1 << 20):
                count += block.count(b"\n")
    except FileNotFoundError:
        pass
    return count


def queued_row(work: Path, queued: int, seconds: float) -> tuple[float, float, float]:
    """tfrund CPU with `queued` jobs waiting for one running job; submit's time with them there and with
    none (medians of 9, the floor's beside them in the same rounds)."""
    project = work / "queued" / "project"
    project.mkdir(parents=True)
    (project / "hi.py").write_text("pass\n")
    with home(work, "queued") as tf:
        empty = [timed([*TFRUN, "submit", str(project / "hi.py")], tf.env) for _ in range(9)]
        (blocker,) = submit_array(tf, project, "sleep.py", QUIET, 1)
        wait_running(tf, 1)
        submit_array(tf, project, "waits.py", QUIET, queued, "--after", str(blocker))
        cpu = daemon_cpu_per_minute(tf, seconds)
        full = [timed([*TFRUN, "submit", "--after", str(blocker), str(project / "hi.py")], tf.env) for _ in range(9)]
    return cpu, stats(empty)[0], stats(full)[0]


def history_rows(work: Path, jobs: int, history: int) -> dict[str, float]:
    """`ps -a` (table, JSON) with no jobs and with `history` ended; RSS at `jobs` and at `history` jobs."""
    project = work / "history" / "project"
    project.mkdir(parents=True)
    found: dict[str, float] = {}
    with home(work, "history") as tf:
        floor = [timed([sys.executable, "-c", "pass"], tf.env) for _ in range(9)]
        found["floor"] = stats(floor)[0]
        for flag, label in (([], "ps -a"), (["--json"], "ps -a --json")):
            found[f"{label}, none"] = stats([timed([*TFRUN, "ps", "-a", *flag], tf.env) for _ in range(9)])[0]
        done = 0
        started = time.monotonic()
        while done < history:
            count = min(ARRAY_TASKS, history - done, jobs if done == 0 else ARRAY_TASKS)
            submit_array(tf, project, "pass.py", "pass\n", count)
            done += count
            wait_for(functools.partial(succeeded, tf, done), timeout=3600, what=f"{done} jobs ended")
            if done == count:  # the first batch: --jobs jobs
                found["rss, jobs"] = rss_mb(tf.daemon_pid())
        found["history seconds"] = time.monotonic() - started
        found["rss, history"] = rss_mb(tf.daemon_pid())
        for flag, label in (([], "ps -a"), (["--json"], "ps -a --json")):
            found[f"{label}, history"] = stats([timed([*TFRUN, "ps", "-a", *flag], tf.env) for _ in range(9)])[0]
        found["idle cpu, history"] = daemon_cpu_per_minute(tf, 20)
    return found


def main() -> None:
    parser = argparse.ArgumentParser(description=" ".join(__doc__.split("\n\n")[0].split()))
    parser.add_argument("--jobs", type=int, default=100, help="running jobs of the quiet and lines rows (100)")
    parser.add_argument("--queued", type=int, default=1000, help="jobs waiting behind one running job (1000)")
    parser.add_argument("--history", type=int, default=10000, help="ended jobs of the history rows (10000)")
    parser.add_argument("--seconds", type=float, default=20.0, help="how long tfrund's CPU is read, a row (20)")
    parser.add_argument(
        "--only", default="idle,quiet,lines,keras,flood,queued,history", help="the rows to run, comma-separated (all)"
    )
    args = parser.parse_args()
    only = set(args.only.split(","))
    work = Path(tempfile.mkdtemp(prefix="tfrun-scale-"))
    rows: list[tuple[str, str, str, Optional[bool]]] = []
    per_min = "s/min"
    if "idle" in only:
        cpu = cpu_row(work, "idle", None, 0, args.seconds)
        rows.append(("tfrund CPU, no jobs", f"{cpu:.2f} {per_min}", "", None))
    quiet: Optional[float] = None
    if "quiet" in only:
        cpu = quiet = cpu_row(work, "quiet", QUIET, args.jobs, args.seconds)
        rows.append((f"tfrund CPU, {args.jobs} quiet running jobs", f"{cpu:.2f} {per_min}", "<= 0.5", cpu <= 0.5))
    if "lines" in only:
        cpu = cpu_row(work, "lines", LINES, args.jobs, args.seconds)
        per_line = cpu / 60 / args.jobs * 1000
        # what a line adds (issue 28's measure): above what the same jobs cost the daemon printing nothing
        above = "" if quiet is None else f"; {(cpu - quiet) / 60 / args.jobs * 1000:.3f} ms above the quiet row"
        rows.append(
            (
                f"tfrund CPU, {args.jobs} jobs printing a line a second",
                f"{cpu:.2f} {per_min} ({per_line:.2f} ms a line{above})",
                "<= 2",
                cpu <= 2,
            )
        )
    if "keras" in only:
        cpu = cpu_row(work, "keras", KERAS, 10, args.seconds)
        per_line = cpu / 60 / 200 * 1000
        rows.append(
            (
                "tfrund CPU, 10 Keras progress bars (20 redraws/s each)",
                f"{cpu:.2f} {per_min} ({per_line:.2f} ms a redraw)",
                "<= 2",
                cpu <= 2,
            )
        )
    if "flood" in only:
        cpu, rss, printed, read, during, before = flood_row(work, args.seconds)
        rows.append(("tfrund CPU and RSS, 1 job printing metric lines nonstop", f"{cpu:.1f} {per_min}, {rss:.0f} MB",
                     "", None))  # fmt: skip
        rows.append(("its lines read a second / printed", f"{read:,.0f} / {printed:,.0f}", "", None))
        rows.append(("`ps` meanwhile / before the job", f"{during * 1000:.0f} / {before * 1000:.0f} ms = "
                     f"{during / before:.2f}x", "", None))  # fmt: skip
    if "queued" in only:
        cpu, empty, full = queued_row(work, args.queued, args.seconds)
        rows.append((f"tfrund CPU, {args.queued} queued jobs", f"{cpu:.2f} {per_min}", "<= 0.5", cpu <= 0.5))
        rows.append(
            (
                f"submit with {args.queued} queued / with none",
                f"{full * 1000:.0f} / {empty * 1000:.0f} ms = {full / empty:.2f}x",
                "<= 1.1x",
                full / empty <= 1.1,
            )
        )
    if "history" in only:
        found = history_rows(work, args.jobs, args.history)
        for label in ("ps -a", "ps -a --json"):
            none, full = found[f"{label}, none"], found[f"{label}, history"]
            rows.append(
                (
                    f"`{label}`, {args.history} ended jobs / none",
                    f"{full * 1000:.0f} / {none * 1000:.0f} ms = {full / none:.2f}x",
                    "<= 2x",
                    full / none <= 2,
                )
            )
        grown = found["rss, history"] - found["rss, jobs"]
        rows.append(
            (
                f"tfrund RSS, {args.jobs} -> {args.history} jobs",
                f"{found['rss, jobs']:.0f} -> {found['rss, history']:.0f} MB (+{grown:.0f})",
                "<= +10 MB",
                grown <= 10,
            )
        )
        rows.append(
            (f"tfrund CPU, idle with {args.history} ended jobs", f"{found['idle cpu, history']:.2f} s/min", "", None)
        )
        rows.append(("`python3 -c pass` (the floor)", f"{found['floor'] * 1000:.0f} ms", "", None))
    print(f"\n{os.cpu_count()} CPUs, CPU over {args.seconds:.0f} s a row\n")
    print("| what | measured | bound | holds |")
    print("| --- | --- | --- | --- |")
    for what, measured, bound, holds in rows:
        print(f"| {what} | {measured} | {bound} | {'' if holds is None else ('yes' if holds else 'NO')} |")
    print(json.dumps({what: measured for what, measured, _, _ in rows}), file=sys.stderr)


if __name__ == "__main__":
    main()
