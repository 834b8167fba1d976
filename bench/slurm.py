#!/usr/bin/env python3
"""Jobs on Slurm through tfrun, side by side with plain sbatch on the same real cluster. Run by hand.

    .venv/bin/python -m bench.slurm [--runs 10] [--jobs 100] [--window 60] [--no-ssh]

Needs Slurm with accounting (Debian's 22.05, as .ci/run installs it) and, for the SSH rows, openssh-server and
root (the test sshd). It starts one single-node cluster with 2 fake GPUs in a temp folder
(tests/harness/slurmcluster.py), tfrund daemons with `executor = "slurm"` and a loopback sshd, and ends every one of
them at its end, on an error or Ctrl-C too.

Why these two figures: on a cluster, a user's alternative to tfrun is sbatch (locally on the login node, or
`ssh login sbatch` from a laptop), so (a) says what tfrun adds to the wait for a job; and a tool that watches
jobs for you must not become the user a Slurm admin bans for hammering slurmctld, so (b) counts what tfrund
asks of Slurm while jobs wait.

(a) Submit until the job runs. "Runs" means one thing for both: the job's first line of output is in its
output file (tfrun: the job's output.log; sbatch: its --output file), seen by polling the file every 5 ms from
the command's start. That is what a user waits for, and it is later than Slurm's RUNNING (the batch script
and the job's Python must start first). The job is the same `print(..., flush=True)` script, asking for 1 GPU
and the same partition and time limit: `tfrun submit --gpus 1 --time 10 job.py` (a tfrund on this "login
node", started once before, as any first use does) against `sbatch --gres=gpu:1 ... job.sh` whose batch
script execs `python3 job.py`; over SSH, `tfrun submit` with host `login` (its connection keeper warm)
against `ssh login sbatch ...` on a fresh connection each time, as plain ssh does. The variants alternate
which goes first, and each run starts 2.5 s (GAP_S: why, there) after the node is idle (no job in squeue but
finished ones, the previous tfrun job ended in tfrun too).

(b) The load of state polling, with `--jobs` tfrun jobs held in Slurm's queue (sbatch_options = ["--hold"]:
PENDING, reason JobHeldUser, for as long as the bench runs). Wrapper scripts first on the daemon's PATH log
every squeue, sacct, sbatch, scancel, scontrol, sinfo and srun it runs and exec the real one. For each
`--window` seconds: the commands run per minute, slurmctld's RPCs per minute and the time it spent serving
them (sdiag's per-message-type statistics, before and after), slurmctld's CPU time, and the asker's own CPU
time (tfrund's, with the squeues it waited for; the loop's bash and squeues). Side by side in the
same run, with the same held jobs: tfrund; a naive loop a user would write (one `squeue -j ID` per job, then
`sleep 1`, tfrund's own interval), with tfrund stopped; and nobody asking (half the window), the floor of
slurmctld's own work.

The machine is small and shared (2 CPUs, other work running): the header prints the load average before and
after; the figures to trust are the ratios of the rows measured side by side.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Callable, Optional

from bench.timing import stats
from tests.harness import TFRUN, Sshd, Tfrun, remote_client
from tests.harness.slurmcluster import SlurmCluster

COMMANDS = ("squeue", "sacct", "sbatch", "scancel", "scontrol", "sinfo", "srun")
JOB = "print('started', flush=True)\n"
# Slurm starts a job at once, or only at a later scheduling pass (0.4 to 0.8 s later here), by how long ago
# the node's last job ended (measured: plain sbatch runs, with tfrun's options or without, took 0.15, 0.6 or
# 0.9 s by their place in a round of three, whatever their options). A pause longer than the cluster's
# sched_interval (2 s, tests/harness/slurmcluster.py) after the node is idle puts every run at the same point: 0.37 to
# 0.40 s each, for all three.
GAP_S = 2.5
_RPC = re.compile(r"^\s+(\S+)\s+\(\s*\d+\)\s+count:(\d+)\s+ave_time:\d+\s+total_time:(\d+)", re.M)


def wrappers(folder: Path, log: Path, cluster: SlurmCluster) -> Path:
    """A folder of scripts named as Slurm's commands, each logging its name to `log` and exec'ing the real
    one; put first on a PATH, it counts what a process runs without changing what it gets."""
    folder.mkdir(parents=True)
    for name in COMMANDS:
        real = shutil.which(name, path=cluster.env["PATH"])
        if real is None:
            continue
        script = folder / name
        script.write_text(f'#!/bin/sh\necho {name} >> {shlex.quote(str(log))}\nexec {shlex.quote(real)} "$@"\n')
        script.chmod(0o755)
    return folder


def counted(log: Path) -> Counter[str]:
    """The commands logged so far, by name."""
    try:
        return Counter(log.read_text().split())
    except FileNotFoundError:
        return Counter()


def rpcs(cluster: SlurmCluster) -> tuple[int, int]:
    """slurmctld's RPCs served since it started, and the microseconds it spent on them (sdiag)."""
    out = cluster.ok(["sdiag"])
    by_type = out.split("by message type", 1)[1].split("Remote Procedure Call statistics by user", 1)[0]
    found = _RPC.findall(by_type)
    return sum(int(count) for _, count, _ in found), sum(int(total) for _, _, total in found)


def cpu_seconds(pid: int, children: bool = False) -> float:
    """User plus system CPU time of a process so far; `children`: with that of the children it has waited for
    (tfrund's squeue and sacct)."""
    stat = Path(f"/proc/{pid}/stat").read_text()
    fields = stat[stat.rfind(")") + 2 :].split()
    return sum(int(f) for f in fields[11 : 15 if children else 13]) / os.sysconf("SC_CLK_TCK")


def children_cpu() -> float:
    """CPU time of this process's children it has waited for (with theirs): the naive loop's, once it ended."""
    times = os.times()
    return times.children_user + times.children_system


def wait_until(predicate: Callable[[], object], timeout: float, what: str, every: float = 0.05) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise RuntimeError(f"timed out after {timeout:.0f}s waiting for {what}")
        time.sleep(every)


def first_line(path: Path, started: float, timeout: float = 120) -> float:
    """Seconds from `started` until `path` holds output, polled every 5 ms."""
    deadline = time.monotonic() + timeout
    while True:
        with contextlib.suppress(FileNotFoundError):
            if path.stat().st_size > 0:
                return time.perf_counter() - started
        if time.monotonic() > deadline:
            raise RuntimeError(f"no output in {path} after {timeout:.0f}s")
        time.sleep(0.005)


def node_idle(cluster: SlurmCluster) -> bool:
    """Nothing in squeue but finished jobs."""
    return not cluster.ok(["squeue", "-h", "-t", "PD,CF,R,CG,S,ST,SI,RQ,RH"]).strip()


class Submits:
    """The four ways to submit of (a), each timed until the job's first line of output."""

    def __init__(self, work: Path, cluster: SlurmCluster, local: Tfrun, remote: Optional[Tfrun], ssh: list[str]):
        self.work, self.cluster, self.local, self.remote, self.ssh = work, cluster, local, remote, ssh
        self.project = work / "project"
        self.project.mkdir()
        (self.project / "job.py").write_text(JOB)
        (self.project / "job.sh").write_text(f"#!/bin/sh\nexec python3 {self.project / 'job.py'}\n")
        self.count = 0

    def sbatch_args(self) -> list[str]:
        self.count += 1
        output = self.work / "sbatch-out" / f"{self.count}.out"
        output.parent.mkdir(exist_ok=True)
        return ["sbatch", "--parsable", "--gres=gpu:1", f"--partition={self.cluster.partition}", "--time=10",
                f"--output={output}", f"--chdir={self.project}", str(self.project / "job.sh")]  # fmt: skip

    def sbatch(self) -> float:
        args = self.sbatch_args()
        started = time.perf_counter()
        subprocess.run(args, env=self.cluster.env, check=True, stdout=subprocess.DEVNULL)
        return first_line(Path(args[5].split("=", 1)[1]), started)

    def ssh_sbatch(self) -> float:
        args = self.sbatch_args()
        remote = f"SLURM_CONF={shlex.quote(self.cluster.env['SLURM_CONF'])} {shlex.join(args)}"
        started = time.perf_counter()
        subprocess.run([*self.ssh, remote], env=self.local.env, check=True, stdout=subprocess.DEVNULL)
        return first_line(Path(args[5].split("=", 1)[1]), started)

    def tfrun(self, tf: Tfrun) -> float:
        started = time.perf_counter()
        done = subprocess.run([*TFRUN, "submit", "--gpus", "1", "--time", "10", str(self.project / "job.py")],
                              env=tf.env, check=True, capture_output=True, text=True)  # fmt: skip
        job = int(done.stdout.strip())
        took = first_line(self.local.job_dir(job) / "output.log", started)
        self.local.ok("wait", str(job))  # ended in tfrun too: its last polls are not the next run's load
        return took

    def settle(self) -> None:
        """An idle node, then GAP_S more: every run starts at the same point of Slurm's cycle."""
        wait_until(lambda: node_idle(self.cluster), 60, "an idle node", every=0.1)
        time.sleep(GAP_S)


def measure_submits(submits: Submits, runs: int) -> dict[str, list[float]]:
    ways: dict[str, Callable[[], float]] = {
        "sbatch": submits.sbatch,
        "tfrun submit": lambda: submits.tfrun(submits.local),
    }
    if submits.remote is not None:
        remote = submits.remote
        ways["ssh login sbatch"] = submits.ssh_sbatch
        ways["tfrun submit --host login"] = lambda: submits.tfrun(remote)
    samples: dict[str, list[float]] = {name: [] for name in ways}
    order = list(ways)
    for run in range(runs):
        for name in order if run % 2 == 0 else order[::-1]:  # which goes first alternates
            submits.settle()
            samples[name].append(ways[name]())
    return samples


class Window:
    """What Slurm was asked during a window of time: commands by name (from the wrappers' log), slurmctld's
    RPCs and their time, and its CPU time, all per minute."""

    def __init__(self, cluster: SlurmCluster, log: Path) -> None:
        self.cluster, self.log = cluster, log
        self.ctld = cluster._procs["slurmctld"].pid

    def measure(self, seconds: float, poller: Optional[Callable[[], float]] = None) -> dict[str, float]:
        """The window's figures; `poller`: the CPU seconds of who asks, so far (read at both ends)."""
        before, (rpc0, us0), cpu0 = counted(self.log), rpcs(self.cluster), cpu_seconds(self.ctld)
        poller0, began = poller() if poller else 0.0, time.monotonic()
        time.sleep(seconds)
        after, (rpc1, us1), cpu1 = counted(self.log), rpcs(self.cluster), cpu_seconds(self.ctld)
        poller1, elapsed = poller() if poller else 0.0, time.monotonic() - began
        per_minute = 60 / elapsed
        figures = {name: (after[name] - before[name]) * per_minute for name in COMMANDS}
        figures["commands"] = sum(figures[name] for name in COMMANDS)
        figures["rpcs"] = (rpc1 - rpc0 - 1) * per_minute  # less the sdiag that asked
        figures["rpc_ms"] = (us1 - us0) / 1000 * per_minute
        figures["ctld_cpu_s"] = (cpu1 - cpu0) * per_minute
        figures["poller_cpu_s"] = (poller1 - poller0) * per_minute
        figures["seconds"] = elapsed
        return figures


def measure_polling(
    work: Path, cluster: SlurmCluster, tf: Tfrun, jobs: int, window: float
) -> list[tuple[str, dict[str, float]]]:
    """(b): tfrund, the naive loop and nobody, each for `window` seconds (nobody: half), with `jobs` held."""
    log = work / "calls.log"
    tf.home.mkdir(parents=True)
    (tf.home / "config.toml").write_text(
        f'executor = "slurm"\n[slurm]\npartition = "{cluster.partition}"\ntime = "10"\nsbatch_options = ["--hold"]\n'
    )
    tf.env["SLURM_CONF"] = cluster.env["SLURM_CONF"]
    tf.env["PATH"] = f"{wrappers(work / 'wrap', log, cluster)}:{cluster.env['PATH']}"
    project = work / "held"
    project.mkdir()
    (project / "job.py").write_text(JOB)
    try:
        tf.ok("ps")
        with ThreadPoolExecutor(4) as pool:
            ids = list(pool.map(lambda _: tf.submit("--gpus", "1", str(project / "job.py")), range(jobs)))

        def slurm_id(job: int) -> Optional[str]:
            with contextlib.suppress(OSError, ValueError):
                return json.loads((tf.job_dir(job) / "slurm.json").read_text()).get("slurm_id")  # type: ignore[no-any-return]
            return None

        wait_until(lambda: all(slurm_id(job) for job in ids), 120, f"{jobs} jobs to reach Slurm")
        slurm_ids = [str(slurm_id(job)) for job in ids]
        held = cluster.ok(["squeue", "-h", "-t", "PD", "-o", "%r"]).split()
        assert len(held) == jobs and set(held) == {"JobHeldUser"}, Counter(held)
        time.sleep(3)  # past the submits' own calls
        meter = Window(cluster, log)
        daemon = tf.daemon_pid()
        rows = [(f"tfrund, {jobs} jobs queued", meter.measure(window, lambda: cpu_seconds(daemon, children=True)))]
    finally:
        tf.daemon("stop", timeout=30)
    naive = work / "naive.sh"
    naive.write_text(
        f"while true; do\n  for id in {' '.join(slurm_ids)}; do squeue -h -j $id -o %T; done\n  sleep 1\ndone\n"
    )
    env = {**cluster.env, "PATH": tf.env["PATH"]}
    cpu0 = children_cpu()
    loop = subprocess.Popen(["bash", str(naive)], env=env, stdout=subprocess.DEVNULL, start_new_session=True)
    try:
        figures = meter.measure(window)
    finally:
        os.killpg(loop.pid, signal.SIGKILL)
        loop.wait()
    figures["poller_cpu_s"] = (children_cpu() - cpu0) * 60 / figures["seconds"]  # bash's and its squeues'
    rows.append(("naive loop: squeue -j ID per job, sleep 1", figures))
    rows.append(("nobody asking (slurmctld's floor)", meter.measure(window / 2)))
    return rows


def say_log(tf: Tfrun, lines: int = 40) -> None:
    """The end of a home's tfrund.log on stderr: the temp folder, and the log with it, goes when the bench
    ends, and a daemon that stopped or died is told only there."""
    log = tf.home / "tfrund.log"
    try:
        tail = log.read_text(errors="replace").splitlines()[-lines:]
    except OSError as exc:
        print(f"{log}: {exc.strerror or exc}", file=sys.stderr)
        return
    print(f"--- {log}, last {len(tail)} lines ---", *tail, sep="\n", file=sys.stderr)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=10)
    parser.add_argument("--jobs", type=int, default=100, help="jobs held in Slurm's queue for the polling rows")
    parser.add_argument("--window", type=float, default=60, help="seconds each polling row is measured")
    parser.add_argument("--no-ssh", action="store_true", help="Skip the rows over SSH (no sshd needed).")
    args = parser.parse_args()
    signal.signal(signal.SIGTERM, signal.default_int_handler)  # `kill PID` cleans up as Ctrl-C does
    load_before = os.getloadavg()
    work = Path(tempfile.mkdtemp(prefix="tfrun-bench-slurm-"))
    cluster: Optional[SlurmCluster] = None
    sshd: Optional[Sshd] = None
    homes: list[Tfrun] = []
    try:
        cluster = SlurmCluster(work / "slurm")
        major, minor, *patch = cluster.versions()["sbatch"]
        version = ".".join([str(major), f"{minor:02d}", *map(str, patch)])  # as Slurm writes it: 22.05.8
        local = Tfrun(work / "home", client_home=work / "client")
        homes.append(local)
        local.home.mkdir(parents=True)
        (local.home / "config.toml").write_text(
            f'executor = "slurm"\n[slurm]\npartition = "{cluster.partition}"\ntime = "10"\n'
        )
        local.env["SLURM_CONF"] = cluster.env["SLURM_CONF"]
        local.env["PATH"] = f"{local.env.get('PATH', '')}:{cluster.env['PATH']}"
        local.ok("ps")  # the daemon starts, with the cluster's SLURM_CONF and PATH
        remote, ssh = None, []
        if not args.no_ssh:
            sshd = Sshd(work / "sshd")
            remote = remote_client(Tfrun(local.home, client_home=work / "client-ssh"), sshd)
            remote.env["SLURM_CONF"] = cluster.env["SLURM_CONF"]
            config = remote.client_home / ".config" / "tfrun" / "config.toml"
            config.write_text(config.read_text().replace("[hosts.box]", "[hosts.login]"))
            remote.env["TFRUN_HOST"] = "login"
            remote.ok("ps")  # the keeper connects; the daemon is the one above
            ssh = sshd.ssh_command(remote.client_home / ".ssh" / "known_hosts")
        submits = Submits(work, cluster, local, remote, ssh)
        samples = measure_submits(submits, args.runs)
        homes.append(Tfrun(work / "home-poll", client_home=work / "client-poll"))
        polling = measure_polling(work, cluster, homes[-1], args.jobs, args.window)
    except Exception:  # not Ctrl-C: that stop is the user's own
        for tf in homes:
            say_log(tf)
        raise
    finally:
        for tf in homes:
            tf.cleanup()
        if sshd is not None:
            sshd.stop()
        if cluster is not None:
            cluster.stop()
        shutil.rmtree(work, ignore_errors=True)

    load = ", ".join(f"{a:.2f} → {b:.2f}" for a, b in zip(load_before, os.getloadavg()))
    print(f"\nSlurm {version}, one node (2 fake GPUs), {os.cpu_count()} CPUs, load average (1, 5, 15 min) {load}\n")
    print(f"Submit until the job's first line of output: {args.runs} runs each, interleaved; seconds, p50 (p90)\n")
    print("| what | tfrun | baseline | ratio (p50) |")
    print("| --- | --- | --- | --- |")
    pairs = [("tfrun submit", "sbatch", "on the login node")]
    if not args.no_ssh:
        pairs.append(("tfrun submit --host login", "ssh login sbatch", "over SSH (tfrun's keeper warm)"))
    for ours, theirs, where in pairs:
        (o50, o90), (t50, t90) = stats(samples[ours]), stats(samples[theirs])
        print(f"| submit until the job runs, {where} | {o50:.3f} ({o90:.3f}) | {theirs}: {t50:.3f} ({t90:.3f}) "
              f"| {o50 / t50:.2f}x |")  # fmt: skip
    print(f"\nAsking Slurm about {args.jobs} held jobs: per minute, over {args.window:.0f} s each\n")
    print("| who asks | commands | squeue | sacct | other | slurmctld RPCs | RPC time (ms) | slurmctld CPU (s) "
          "| asker's CPU (s) |")  # fmt: skip
    print("| --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    for who, f in polling:
        other = f["commands"] - f["squeue"] - f["sacct"]
        print(f"| {who} | {f['commands']:.0f} | {f['squeue']:.0f} | {f['sacct']:.0f} | {other:.0f} | {f['rpcs']:.0f} "
              f"| {f['rpc_ms']:.0f} | {f['ctld_cpu_s']:.2f} | {f['poller_cpu_s']:.2f} |")  # fmt: skip


if __name__ == "__main__":
    main()
