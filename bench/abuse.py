#!/usr/bin/env python3
"""How long `ps` waits while another client sends the most costly requests it can. Run by hand.

    .venv/bin/python -m bench.abuse [--seconds 20] [--abusers 1] [--big-only]

Boots a real local tfrund with one ended job, then runs --abusers threads, each on its own connection, that
send in a loop what once held the daemon's event loop for seconds: a `logs` filter of 100,000 patterns and
a `cancel` of 100,000 jobs (both refused now), and the most a request may still ask (a thousand long
patterns over the job's log; a cancel of a thousand jobs). Meanwhile another connection sends `ps`
(ListJobs) every 10 ms and times each answer. Prints p50, p99 and max of those, first with no abuser (the
baseline) and then with them.

Then big legal requests: --abusers threads each send, in a loop, a `have_blobs` of 100,000 digests (a
6.6 MB frame, as a submit of a 100,000-file work dir sends), beside `ps`; it prints the same figures and
the daemon's resident memory before, at its peak, and some seconds after the last one. The goal: p99
under 100 ms in both, and memory given back.
"""

from __future__ import annotations

import argparse
import hashlib
import tempfile
import threading
import time
from pathlib import Path
from typing import Callable

from tests.harness import Tfrun, write_script
from tests.harness.abuse import Raw, abusive_requests, describe, header_line, ps_latencies, socket_path

BIG_DIGESTS = 100_000


def abuse(tf: Tfrun, stop: threading.Event) -> None:
    """Send the abusive requests in a loop until `stop`."""
    raw = Raw(socket_path(tf))
    frames = [frame for frame, _ in abusive_requests()]
    while not stop.is_set():
        for frame in frames:
            raw.replies(frame)


def big_have_blobs() -> bytes:
    """A legal `have_blobs` of BIG_DIGESTS digests, none of them stored."""
    digests = [hashlib.sha256(str(i).encode()).hexdigest() for i in range(BIG_DIGESTS)]
    return header_line({"type": "have_blobs", "digests": digests})


def send_big(tf: Tfrun, stop: threading.Event, sent: list[int]) -> None:
    """Send the big `have_blobs` in a loop until `stop`, each answered in full before the next."""
    raw = Raw(socket_path(tf))
    frame = big_have_blobs()
    while not stop.is_set():
        replies = raw.replies(frame)
        assert [r["type"] for r in replies] == ["missing_blobs"], replies[:1]
        sent.append(1)


def rss_mb(pid: int) -> float:
    """The process's resident memory, in MB."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def with_abusers(tf: Tfrun, target: Callable[[threading.Event], None], abusers: int, seconds: float) -> str:
    """`ps` latencies while `abusers` threads run `target` until they are told to stop."""
    stop = threading.Event()
    threads = [threading.Thread(target=target, args=(stop,)) for _ in range(abusers)]
    for thread in threads:
        thread.start()
    try:
        return describe(ps_latencies(tf, seconds))
    finally:
        stop.set()
        for thread in threads:
            thread.join()


def big_requests(tf: Tfrun, abusers: int, seconds: float) -> None:
    """Others' latency beside big legal requests, and the daemon's memory before, during and after."""
    pid = tf.daemon_pid()
    before = rss_mb(pid)
    sent: list[int] = []
    peak = [before]

    def big(stop: threading.Event) -> None:
        watcher = threading.Thread(target=send_big, args=(tf, stop, sent))
        watcher.start()
        while watcher.is_alive():
            peak[0] = max(peak[0], rss_mb(pid))
            time.sleep(0.05)

    figures = with_abusers(tf, big, abusers, seconds)
    print(f"ps beside {abusers} client(s) sending have_blobs of {BIG_DIGESTS} digests ({len(sent)} sent): {figures}")
    time.sleep(5)
    print(f"daemon RSS: {before:.0f} MB before, {peak[0]:.0f} MB at most, {rss_mb(pid):.0f} MB 5 s after")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=20.0)
    parser.add_argument("--abusers", type=int, default=1)
    parser.add_argument("--big-only", action="store_true", help="Only the big legal requests.")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as folder:
        root = Path(folder)
        tf = Tfrun(root / "home")
        try:
            (root / "project").mkdir()
            script = "#!/bin/sh\nfor i in $(seq 300); do echo step $i loss=0.$i; done\n"
            write_script(root / "project", "run.sh", script, executable=True)
            tf.ok("wait", str(tf.submit(str(root / "project" / "run.sh"))))
            print(f"ps alone: {describe(ps_latencies(tf, args.seconds / 4))}")
            if not args.big_only:
                figures = with_abusers(tf, lambda stop: abuse(tf, stop), args.abusers, args.seconds)
                print(f"ps with {args.abusers} abusive client(s): {figures}")
            big_requests(tf, args.abusers, args.seconds)
        finally:
            tf.cleanup()


if __name__ == "__main__":
    main()
