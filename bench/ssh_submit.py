#!/usr/bin/env python3
"""Submit and upload over SSH, side by side with what users do today, on a loopback sshd. Run by hand.

    .venv/bin/python -m bench.ssh_submit [--runs 15]

Measures, in one run on one machine (needs openssh-server, rsync, and root for the test sshd):
  - `tfrun submit job.py` until the job runs, against `ssh box 'nohup python3 job.py > log 2>&1 &'`;
  - the upload of a 1,000-file work dir, first and after one changed file, against `rsync -a` over the
    same sshd (tfrun's figure is the whole submit: scan, hash, upload, start the job); and the re-submit
    against `rsync -a` followed by `ssh box 'nohup python3 train.py &'`, which is what it replaces.
Prints a Markdown table of medians (p50) and p90, and tfrun's time as a ratio of the baseline's. tfrun
keeps its SSH connection between commands (its connection keeper, like OpenSSH's ControlPersist); the
baselines open a fresh connection each time, as plain ssh and rsync do; one row shows tfrun without
the keeper too.
"""

from __future__ import annotations

import argparse
import os
import random
import shlex
import subprocess
import tempfile
import time
from pathlib import Path

from bench.timing import stats, timed
from tests.harness import TFRUN, Sshd, Tfrun, remote_client


def make_work_dir(root: Path, files: int) -> None:
    rng = random.Random(0)
    for i in range(files):
        folder = root / f"pkg{i % 20}"
        folder.mkdir(parents=True, exist_ok=True)
        (folder / f"f{i}.py").write_bytes(rng.randbytes(rng.randint(200, 8000)))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=15)
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="tfrun-bench-"))
    sshd = Sshd(work / "sshd")
    rows: list[tuple[str, list[float], list[float]]] = []
    try:
        tf = remote_client(Tfrun(work / "home"), sshd)
        ssh = sshd.ssh_command(tf.client_home / ".ssh" / "known_hosts")
        job_dir = work / "job"
        job_dir.mkdir()
        (job_dir / "job.py").write_text("import time\ntime.sleep(60)\n")
        tf.ok("ps")  # start the daemon and learn its socket once, as any first use does

        tfrun_submit, ssh_nohup, direct = [], [], []
        no_keeper = {**tf.env, "TFRUN_SSH_PERSIST": "0"}
        for i in range(args.runs):
            tfrun_submit.append(timed([*TFRUN, "submit", str(job_dir / "job.py")], tf.env))
            direct.append(timed([*TFRUN, "submit", str(job_dir / "job.py")], no_keeper))
            remote = f"cd {shlex.quote(str(job_dir))}; nohup python3 job.py > {work}/nohup-{i}.log 2>&1 &"
            ssh_nohup.append(timed([*ssh, remote], tf.env))
        rows.append(("submit until the job runs", tfrun_submit, ssh_nohup))
        rows.append(("submit, TFRUN_SSH_PERSIST=0 (a fresh SSH connection)", direct, ssh_nohup))
        tf.run("cancel", "--grace", "0", *[str(n) for n in range(1, 2 * args.runs + 1)])
        subprocess.run(["pkill", "-f", "time.sleep(60)"], check=False)

        tree = work / "tree"
        make_work_dir(tree, 1000)
        (tree / "train.py").write_text("pass\n")
        rsync = ["rsync", "-a", "-e", shlex.join(ssh[:-1])]
        first_tfrun, first_rsync, again_tfrun, again_rsync, again_rsync_nohup = [], [], [], [], []
        for i in range(args.runs):
            fresh = remote_client(Tfrun(work / f"home-{i}"), sshd)  # a daemon that holds none of the files
            fresh.ok("ps")
            first_tfrun.append(timed([*TFRUN, "submit", str(tree / "train.py")], fresh.env))
            first_rsync.append(timed([*rsync, f"{tree}/", f"root@127.0.0.1:{work}/rsync-{i}/"], tf.env))
            (tree / "pkg3" / "f3.py").write_bytes(os.urandom(4000))
            again_tfrun.append(timed([*TFRUN, "submit", str(tree / "train.py")], fresh.env))
            again_rsync.append(timed([*rsync, f"{tree}/", f"root@127.0.0.1:{work}/rsync-{i}/"], tf.env))
            (tree / "pkg3" / "f3.py").write_bytes(os.urandom(4000))
            started = time.perf_counter()
            timed([*rsync, f"{tree}/", f"root@127.0.0.1:{work}/rsync-{i}/"], tf.env)
            timed([*ssh, f"cd {work}/rsync-{i}; nohup python3 train.py > log 2>&1 &"], tf.env)
            again_rsync_nohup.append(time.perf_counter() - started)
            (tree / "pkg3" / "f3.py").write_bytes(os.urandom(4000))
            again_tfrun.append(timed([*TFRUN, "submit", str(tree / "train.py")], fresh.env))
            fresh.cleanup()
        rows.append(("upload 1,000 files, first time", first_tfrun, first_rsync))
        rows.append(("upload again after 1 changed file", again_tfrun, again_rsync))
        rows.append(
            ("the same, against rsync -a then ssh + nohup (what runs it today)", again_tfrun, again_rsync_nohup)
        )
        tf.cleanup()
    finally:
        sshd.stop()

    print(f"\n{args.runs} runs each, loopback sshd, {os.cpu_count()} CPUs; seconds, p50 (p90)\n")
    print("| what | tfrun | baseline | ratio (p50) |")
    print("| --- | --- | --- | --- |")
    names = {0: "ssh + nohup", 1: "ssh + nohup", 2: "rsync -a", 3: "rsync -a", 4: "rsync + nohup"}
    for n, (what, ours, theirs) in enumerate(rows):
        (o50, o90), (t50, t90) = stats(ours), stats(theirs)
        print(f"| {what} | {o50:.3f} ({o90:.3f}) | {names[n]}: {t50:.3f} ({t90:.3f}) | {o50 / t50:.2f}x |")


if __name__ == "__main__":
    main()
