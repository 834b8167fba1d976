#!/usr/bin/env python3
"""`tfrun logs` over SSH, side by side with ssh + tail/grep/cat, on a loopback sshd. Run by hand.

    .venv/bin/python -m bench.logs [--runs 7] [--lines 400] [--follow-only]

Measures, in one run on one machine (needs openssh-server, and root for the test sshd):
  - follow latency, from a line written by a job on the box to the line printed by the client, for
    `tfrun logs -f JOB --grep loss` against `ssh box "tail -n0 -F LOG | grep --line-buffered loss"`,
    both following the same job's log at the same time; p50 and p99 over --lines lines;
  - a filtered read of a 100 MB, 1,000,000-line log: `tfrun logs JOB --grep loss` against `ssh box grep
    loss LOG` (and against `ssh box 'grep loss LOG | cat'`: grep writing straight into sshd's socket is
    about twice as slow here as through a pipe), and the same with a regular expression (grep -E);
  - an unfiltered read of it: `tfrun logs JOB` against `ssh box cat LOG`.
Every command's output goes to a pipe that is read to the end, as a user's terminal or script would.
tfrun keeps its SSH connection between commands (its keeper, like ControlPersist); ssh opens a fresh
connection per command, as plain ssh does.
"""

from __future__ import annotations

import argparse
import os
import shlex
import statistics
import subprocess
import tempfile
import threading
import time
from pathlib import Path

from tests.harness import TFRUN, Sshd, Tfrun, remote_client, wait_for

WRITER = """
import os, sys, time
gate, count = sys.argv[1], int(sys.argv[2])
while not os.path.exists(gate):
    time.sleep(0.01)
for i in range(count):
    print(f"noise {i}", flush=True)
    print(f"step {i} loss={time.time():.6f}", flush=True)
    time.sleep(0.02)
"""

BIG = """
import sys
out = []
for n in range(1_000_000):
    line = f"step {n} loss={n % 97 / 10:.3f} lr=0.001" if n % 10 == 0 else f"noise {n} other output"
    out.append(line.ljust(99, ".") + "\\n")
    if len(out) == 10_000:
        sys.stdout.write("".join(out))
        out = []
"""


def latencies(command: list[str], env: dict[str, str], count: int, ready: threading.Event) -> list[float]:
    """Start `command`, and for each `step N loss=T` line it prints, how long after T it arrived."""
    found: list[float] = []
    proc = subprocess.Popen(command, env=env, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
    assert proc.stdout is not None
    ready.set()
    for raw in proc.stdout:
        now = time.time()
        if b"loss=" in raw:
            found.append(now - float(raw.split(b"loss=")[1]))
            if len(found) == count:
                break
    proc.kill()
    proc.wait()
    return found


def timed(command: list[str], env: dict[str, str]) -> tuple[float, int]:
    """Seconds until `command` has exited and all its output was read; and how many bytes it printed."""
    started = time.perf_counter()
    proc = subprocess.Popen(command, env=env, stdout=subprocess.PIPE)
    assert proc.stdout is not None
    size = 0
    while chunk := proc.stdout.read(1 << 20):
        size += len(chunk)
    proc.wait()
    return time.perf_counter() - started, size


def percentile(samples: list[float], p: float) -> float:
    ordered = sorted(samples)
    return ordered[min(len(ordered) - 1, int(p * len(ordered)))]


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--runs", type=int, default=7)
    parser.add_argument("--lines", type=int, default=400)
    parser.add_argument("--follow-only", action="store_true", help="measure the follow latency alone, no reads")
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="tfrun-bench-"))
    sshd = Sshd(work / "sshd")
    rows: list[tuple[str, str, str, float]] = []
    try:
        tf = remote_client(Tfrun(work / "home"), sshd)
        ssh = sshd.ssh_command(tf.client_home / ".ssh" / "known_hosts")
        project = work / "project"
        project.mkdir()
        (project / "writer.py").write_text(WRITER)
        (project / "big.py").write_text(BIG)
        gate = work / "gate"

        job = tf.submit(str(project / "writer.py"), str(gate), str(args.lines))
        log = tf.job_dir(job) / "output.log"
        wait_for(log.exists, what="the log")
        results: dict[str, list[float]] = {}
        started = [threading.Event(), threading.Event()]
        commands = {
            "tfrun": [*TFRUN, "logs", "-f", str(job), "--grep", "loss"],
            "ssh": [*ssh, f"tail -n0 -F {shlex.quote(str(log))} | grep --line-buffered loss"],
        }

        def follow(key: str, ready: threading.Event) -> None:
            results[key] = latencies(commands[key], tf.env, args.lines, ready)

        threads = [threading.Thread(target=follow, args=(key, event)) for key, event in zip(commands, started)]
        for thread in threads:
            thread.start()
        for event in started:
            event.wait()
        time.sleep(2)  # both followers connected and at the end of the (empty) log
        gate.touch()
        for thread in threads:
            thread.join()
        # The box's end of the ssh pipeline outlives its client (no tty: sshd hangs nothing up); the box is
        # this machine, so end it here, or it reads the log on through the runs that follow.
        subprocess.run(["pkill", "-f", f"tail -n0 -F {log}"], check=False)
        ours, theirs = (sorted(x * 1000 for x in results[k]) for k in ("tfrun", "ssh"))
        for p, name in ((0.5, "p50"), (0.99, "p99")):
            o, t = percentile(ours, p), percentile(theirs, p)
            what = f"follow latency, line written → printed, {name} (ms)"
            rows.append((what, f"{o:.1f}", f"tail -F \\| grep: {t:.1f}", o / t))

        size = 0
        big = None if args.follow_only else tf.submit(str(project / "big.py"))
        if big is not None:
            tf.ok("wait", str(big))
            big_log = tf.job_dir(big) / "output.log"
            size = big_log.stat().st_size
        reads = [] if big is None else [
            ("filtered read, --grep loss (s)", ["--grep", "loss"], f"grep loss {big_log}", "ssh grep"),
            ("the same, against grep piped through cat on the box (s)", ["--grep", "loss"],
             f"grep loss {big_log} | cat", "ssh 'grep \\| cat'"),
            ("filtered read, --grep 'loss=1\\.[0-9]+' (s)", ["--grep", r"loss=1\.[0-9]+"],
             f"grep -E 'loss=1\\.[0-9]+' {big_log}", "ssh grep -E"),
            ("unfiltered read (s)", [], f"cat {big_log}", "ssh cat"),
        ]  # fmt: skip
        for what, options, remote, name in reads:
            ours_s, theirs_s = [], []
            for _ in range(args.runs):
                o, o_size = timed([*TFRUN, "logs", str(big), *options], tf.env)
                t, t_size = timed([*ssh, remote], tf.env)
                assert o_size == t_size, f"{what}: tfrun printed {o_size} bytes, ssh {t_size}"
                ours_s.append(o)
                theirs_s.append(t)
            o50, t50 = statistics.median(ours_s), statistics.median(theirs_s)
            rows.append((what, f"{o50:.3f}", f"{name}: {t50:.3f}", o50 / t50))
        tf.cleanup()
    finally:
        sshd.stop()

    reads_text = "" if args.follow_only else f"; reads: {size / 1e6:.0f} MB, 1,000,000 lines, median of {args.runs}"
    print(f"\nloopback sshd, {os.cpu_count()} CPUs; follow: {args.lines} lines{reads_text}\n")
    print("| what | tfrun | baseline | ratio |")
    print("| --- | --- | --- | --- |")
    for what, ours_text, theirs_text, ratio in rows:
        print(f"| {what} | {ours_text} | {theirs_text} | {ratio:.2f}x |")


if __name__ == "__main__":
    main()
