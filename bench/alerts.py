#!/usr/bin/env python3
"""From an OOM line written by a job to the alert mail received. Run by hand.

    .venv/bin/python -m bench.alerts [--runs 30]

Each run submits a job to a real local tfrund whose config sends alerts to a real SMTP server (aiosmtpd)
on 127.0.0.1; the job writes a PyTorch OOM line carrying the time it wrote it, and the SMTP server notes
when the mail's data arrived. Side by side, on the same job's log, the alert a user scripts today:
`tail -n0 -F output.log | grep --line-buffered 'out of memory'` piped into a loop that mails each match
(Python's smtplib, to the same server). Prints p50 and p99 of both and their ratio.
"""

from __future__ import annotations

import argparse
import functools
import shlex
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from tests.harness import Mailbox, Tfrun, wait_for

JOB = """
import os, sys, time
gate = sys.argv[1]
print("step 1 loss=0.9", flush=True)
while not os.path.exists(gate):
    time.sleep(0.01)
print(f"torch.OutOfMemoryError: CUDA out of memory. written={time.time():.6f}", flush=True)
time.sleep(3)
"""

MAILER = """
import smtplib, sys
from email.message import EmailMessage
for line in sys.stdin:
    msg = EmailMessage()
    msg["Subject"], msg["From"], msg["To"] = "OOM on box (tail|grep)", "box@example.com", "me@example.com"
    msg.set_content(line)
    with smtplib.SMTP("127.0.0.1", int(sys.argv[1])) as smtp:
        smtp.send_message(msg)
"""


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--runs", type=int, default=30)
    runs = parser.parse_args().runs
    mailbox = Mailbox()
    mailbox.start()
    with tempfile.TemporaryDirectory() as tmp:
        tf = Tfrun(Path(tmp) / "home")
        tf.home.mkdir(mode=0o700, parents=True)
        (tf.home / "config.toml").write_text(f'notify = ["{mailbox.url}"]\n[alerts]\nrules = ["oom"]\n')
        project = Path(tmp) / "project"
        project.mkdir()
        (project / "job.py").write_text(JOB)
        (project / "mailer.py").write_text(MAILER)
        tfrun_ms: list[float] = []
        grep_ms: list[float] = []
        try:
            for run in range(runs):
                gate = Path(tmp) / f"gate{run}"
                job = tf.submit("--python", sys.executable, str(project / "job.py"), str(gate))
                log = tf.job_dir(job) / "output.log"
                wait_for(functools.partial(_printed_loss, log), what="job start")
                pipeline = (
                    f"tail -n0 -F {shlex.quote(str(log))} | grep --line-buffered 'out of memory' | "
                    f"{shlex.quote(sys.executable)} {shlex.quote(str(project / 'mailer.py'))} {mailbox.port}"
                )
                watcher = subprocess.Popen(["sh", "-c", pipeline], start_new_session=True)
                time.sleep(0.5)  # tail is following
                gate.touch()
                line = wait_for(functools.partial(_oom_line, log), what="the OOM line")
                written = line.split("written=")[1].split()[0]
                arrivals = wait_for(functools.partial(_arrivals, mailbox, written), timeout=30, what="both mails")
                tfrun_ms.append((arrivals["tfrun"] - float(written)) * 1000)
                grep_ms.append((arrivals["grep"] - float(written)) * 1000)
                subprocess.run(["pkill", "-g", str(watcher.pid)], check=False)
                watcher.wait()
                tf.run("wait", str(job))
        finally:
            tf.cleanup()
            mailbox.stop()
    print(f"OOM line written -> alert mail received, {runs} runs, local tfrund, aiosmtpd on 127.0.0.1")
    print(f"{'':28} {'p50 ms':>8} {'p99 ms':>8}")
    print(f"{'tfrun (outbox, apprise)':28} {statistics.median(tfrun_ms):8.0f} {percentile(tfrun_ms, 0.99):8.0f}")
    print(f"{'tail -F | grep | smtplib':28} {statistics.median(grep_ms):8.0f} {percentile(grep_ms, 0.99):8.0f}")
    print(f"ratio p50 {statistics.median(tfrun_ms) / statistics.median(grep_ms):.2f}x")


def _arrivals(mailbox: Mailbox, written: str) -> dict[str, float]:
    """When tfrun's mail and the pipeline's mail about the line written at `written` arrived, once both did."""
    found = {}
    for (subject, body), at in zip(mailbox.texts(), mailbox.arrived):
        if f"written={written}" in body:
            found["grep" if "tail|grep" in subject else "tfrun"] = at
    return found if len(found) == 2 else {}


def _printed_loss(log: Path) -> bool:
    """Whether the job has started: its log holds its first loss line."""
    return log.exists() and b"loss" in log.read_bytes()


def _oom_line(log: Path) -> str:
    return next((line for line in log.read_text().splitlines() if "written=" in line), "")


if __name__ == "__main__":
    main()
