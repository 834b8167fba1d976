#!/usr/bin/env python3
"""How long `ps` waits while another client sends the most costly requests it can. Run by hand.

    .venv/bin/python bench/abuse.py [--seconds 20] [--abusers 1]

Boots a real local tfrund with one ended job, then runs --abusers threads, each on its own connection, that
send in a loop what once held the daemon's event loop for seconds: a `logs` filter of 100,000 patterns and
a `cancel` of 100,000 jobs (both refused now), and the most a request may still ask (a thousand long
patterns over the job's log; a cancel of a thousand jobs). Meanwhile another connection sends `ps`
(ListJobs) every 10 ms and times each answer. Prints p50, p99 and max of those, first with no abuser (the
baseline) and then with them. The goal: p99 under 100 ms.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import threading
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
from conftest import Tfrun, write_script
from test_fuzz import Raw, abusive_requests, describe, ps_latencies, socket_path


def abuse(tf: Tfrun, stop: threading.Event) -> None:
    """Send the abusive requests in a loop until `stop`."""
    raw = Raw(socket_path(tf))
    frames = [frame for frame, _ in abusive_requests()]
    while not stop.is_set():
        for frame in frames:
            raw.replies(frame)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=20.0)
    parser.add_argument("--abusers", type=int, default=1)
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
            stop = threading.Event()
            threads = [threading.Thread(target=abuse, args=(tf, stop)) for _ in range(args.abusers)]
            for thread in threads:
                thread.start()
            try:
                print(f"ps with {args.abusers} abusive client(s): {describe(ps_latencies(tf, args.seconds))}")
            finally:
                stop.set()
                for thread in threads:
                    thread.join()
        finally:
            tf.cleanup()


if __name__ == "__main__":
    main()
