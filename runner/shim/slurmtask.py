"""A job on several Slurm nodes (`submit --nodes N`): one task a node, each with a TF_CONFIG that names them all,
so that MultiWorkerMirroredStrategy trains across the nodes without the user's code knowing about Slurm.

Two roles, both run by this file's path with the daemon's Python and `-S`, never `-m`: the job's environment
(its PYTHONPATH, which holds only `tfrun.jobs`) then reaches the job untouched, and nothing here imports tfrun.

- `slurmtask.py launch N -- COMMAND...` is the launch record's command (runner/executors/slurm/executor.py), run by the
  shim in the batch script. It runs `srun` for N tasks, one a node, with one port reserved for each task
  (`--resv-ports=N`) and the step killed when one task fails (`--kill-on-bad-exit`), and exits with the
  code of the task that failed first: srun's own is the highest of all, which is the SIGTERM of a task it
  killed (143), not the failure that made it kill them.
- `slurmtask.py rank -- COMMAND...` runs in each task. It builds TF_CONFIG from the step's SLURM_* variables,
  sets TFRUN_TASK_INDEX and TFRUN_NUM_TASKS, sends the output of every task but the first to `task-I.log`
  in the job's folder (so the job's log, and the metrics read from it, are the chief's alone), runs COMMAND
  and records how it ended in `task-I.json` for the launcher.

SlurmClusterResolver is not used: it runs nvidia-smi (and fails where there is none and no GPU was asked for),
miscounts with --gpus-per-task=1, overwrites the CUDA_VISIBLE_DEVICES Slurm set, and numbers ports from a
fixed base, so two jobs on one node take the same ports. Here the ports are Slurm's reservation, the task of
index I takes the I-th (Slurm reserves the same ports on every node of a step, so tasks that share a host, as
on a test cluster, still differ), and CUDA_VISIBLE_DEVICES stays as Slurm set it.

Addresses are the nodes' NodeAddr from `scontrol show node` (node names need not resolve), else their names.

Standard library only: it runs by path, beside the user's job.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import subprocess
import sys
import time
from typing import TYPE_CHECKING, Optional

if TYPE_CHECKING:
    from tfrun.runner.shim.jobdir import LaunchRecord

TASK_INDEX_ENV = "TFRUN_TASK_INDEX"
NUM_TASKS_ENV = "TFRUN_NUM_TASKS"
TASK_LOG = "task-{}.log"  # in the job's folder: the output of task I > 0
TASK_RECORD = "task-{}.json"  # in the job's folder: how task I's command ended, for the launcher
SRUN_OPTIONS = ("--ntasks-per-node=1", "--kill-on-bad-exit=1", "--unbuffered")
_STOPS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)  # a stop: each process here outlives it to report
_BRACKETS = re.compile(r"^(.*?)\[([^\]]*)\](.*)$")
_COUNT = re.compile(r"^(\d+)(?:\(x(\d+)\))?$")


class TaskError(Exception):
    """The step's variables do not describe a cluster this task can be part of; the message says how."""


# -- Slurm's notations ---------------------------------------------------------------------------------------------


def expand_hostlist(text: str) -> list[str]:
    """Slurm's host list as names, in order: "node[1-3,7],gpu[01-02]" is node1 node2 node3 node7 gpu01 gpu02
    (zero padding kept; several bracket groups in one name multiply)."""
    names: list[str] = []
    depth, start = 0, 0
    for at, char in enumerate(text + ","):
        if char == "[":
            depth += 1
        elif char == "]":
            depth -= 1
        elif char == "," and depth == 0:
            if at > start:
                names.extend(_expand_one(text[start:at]))
            start = at + 1
    return names


def _expand_one(name: str) -> list[str]:
    match = _BRACKETS.match(name)
    if match is None:
        return [name]
    prefix, ranges, rest = match.groups()
    expanded: list[str] = []
    for part in ranges.split(","):
        first, dash, last = part.partition("-")
        if not _is_digits(first) or (dash and not _is_digits(last)):
            raise TaskError(f"host list {name!r}: {part!r} is not a number or a range")
        width = len(first)
        for number in range(int(first), int(last if dash else first) + 1):
            expanded.extend(f"{prefix}{number:0{width}d}{tail}" for tail in _expand_one(rest))
    return expanded


def expand_counts(text: str) -> list[int]:
    """Slurm's tasks per node, one count a node: "2(x3),1" is [2, 2, 2, 1]."""
    counts = []
    for part in text.split(","):
        match = _COUNT.match(part.strip())
        if match is None:
            raise TaskError(f"tasks per node {text!r}: {part!r} is not N or N(xM)")
        counts.extend([int(match.group(1))] * int(match.group(2) or 1))
    return counts


def expand_ports(text: str) -> list[int]:
    """Slurm's reserved ports: "12000-12002,12010" is [12000, 12001, 12002, 12010]."""
    ports: list[int] = []
    for part in text.split(","):
        first, dash, last = part.strip().partition("-")
        if not _is_digits(first) or (dash and not _is_digits(last)):
            raise TaskError(f"reserved ports {text!r}: {part!r} is not a port or a range")
        ports.extend(range(int(first), int(last if dash else first) + 1))
    return ports


# -- TF_CONFIG ---------------------------------------------------------------------------------------------------


def task_nodes(nodes: list[str], counts: list[int]) -> list[str]:
    """The node of each task, by index: Slurm's block distribution (the first node's tasks first)."""
    if len(counts) != len(nodes):
        raise TaskError(f"{len(nodes)} nodes but tasks per node for {len(counts)}")
    return [node for node, count in zip(nodes, counts) for _ in range(count)]


def tf_config(addresses: list[str], ports: list[int], index: int) -> dict[str, object]:
    """TF_CONFIG for the task `index` of a cluster of workers, the task I at addresses[I]:ports[I]; the first
    worker is the chief (TensorFlow's rule when the cluster names no "chief")."""
    if len(ports) < len(addresses):
        raise TaskError(f"{len(ports)} reserved port(s) for {len(addresses)} tasks (srun --resv-ports)")
    workers = [f"[{a}]:{p}" if ":" in a else f"{a}:{p}" for a, p in zip(addresses, ports)]
    return {"cluster": {"worker": workers}, "task": {"type": "worker", "index": index}}


def node_addresses(nodes: list[str], env: dict[str, str]) -> dict[str, str]:
    """Each node's NodeAddr, as slurmctld knows it: node names need not be host names. A node scontrol does
    not answer for keeps its name."""
    try:
        shown = subprocess.run(
            ["scontrol", "show", "node", "-o", ",".join(nodes)],
            env=env, capture_output=True, text=True, timeout=60, check=False,
        )  # fmt: skip
    except (OSError, subprocess.TimeoutExpired):
        return {node: node for node in nodes}
    found = {}
    for line in shown.stdout.splitlines():
        fields = dict(word.split("=", 1) for word in line.split() if "=" in word)
        if fields.get("NodeName") and fields.get("NodeAddr"):
            found[fields["NodeName"]] = fields["NodeAddr"]
    return {node: found.get(node, node) for node in nodes}


def task_env(env: dict[str, str]) -> dict[str, str]:
    """The environment of this task's command: `env` with TF_CONFIG, TFRUN_TASK_INDEX and TFRUN_NUM_TASKS,
    built from the step's SLURM_STEP_NODELIST, SLURM_STEP_TASKS_PER_NODE, SLURM_STEP_RESV_PORTS and
    SLURM_PROCID."""
    try:
        nodes = expand_hostlist(env["SLURM_STEP_NODELIST"])
        counts = expand_counts(env["SLURM_STEP_TASKS_PER_NODE"])
        ports = expand_ports(env["SLURM_STEP_RESV_PORTS"])
        index = int(env["SLURM_PROCID"])
    except KeyError as missing:
        raise TaskError(f"{missing.args[0]} is not set: not a task of `srun --resv-ports`") from None
    except ValueError:
        raise TaskError(f"SLURM_PROCID {env['SLURM_PROCID']!r} is not a number") from None
    hosts = task_nodes(nodes, counts)
    if not 0 <= index < len(hosts):
        raise TaskError(f"task {index} of a step of {len(hosts)} tasks")
    addresses = node_addresses(nodes, env)
    config = tf_config([addresses[node] for node in hosts], ports, index)
    return {**env, "TF_CONFIG": json.dumps(config), TASK_INDEX_ENV: str(index), NUM_TASKS_ENV: str(len(hosts))}


# -- the two roles ---------------------------------------------------------------------------------------------


def across_nodes(launch: LaunchRecord, python: str, tasks: int, launcher: str) -> None:
    """Make a launch record's command run as `tasks` tasks, one a node: this file's launcher around it (at
    `launcher`: the daemon's copy of the shim, whose path outlives an upgrade), run by `python`, and a stop's
    SIGTERM for the launcher alone (`term_leader_only`: srun would SIGKILL the tasks)."""
    launch["command"] = [python, "-S", launcher, "launch", str(tasks), "--", *launch["command"]]
    launch["term_leader_only"] = True


def srun_command(python: str, tasks: int, command: list[str]) -> list[str]:
    """srun for `tasks` tasks, one a node, each running this file's `rank` role around `command`."""
    return [
        "srun", f"--nodes={tasks}", f"--ntasks={tasks}", f"--resv-ports={tasks}", *SRUN_OPTIONS,
        python, "-S", os.path.abspath(__file__), "rank", "--", *command,
    ]  # fmt: skip


def first_failure(job_dir: str, tasks: int) -> Optional[int]:
    """The exit code (128+N for signal N) of the task whose command failed first, by the tasks' records."""
    failed = _failures(job_dir, tasks)
    return min(failed)[2] if failed else None


def first_failed_task(job_dir: str, tasks: int) -> Optional[int]:
    """The index of the task whose command failed first, by the tasks' records: the one whose output says why
    the job failed (the others were stopped because it did), which the failed alert quotes."""
    failed = _failures(job_dir, tasks)
    return min(failed)[1] if failed else None


def _failures(job_dir: str, tasks: int) -> list[tuple[float, int, int]]:
    """(when it ended, its index, its exit code) of each task whose command failed, from its task-I.json."""
    failed = []
    for index in range(tasks):
        try:
            with open(os.path.join(job_dir, TASK_RECORD.format(index))) as f:
                record = json.load(f)
            code, ended_at = int(record["exit_code"]), float(record["ended_at"])
        except (OSError, ValueError, KeyError, TypeError):
            continue  # never started, or killed before it could say
        if code != 0:
            failed.append((ended_at, index, code))
    return failed


def launch(tasks: int, command: list[str]) -> int:
    """Run the step and say how it ended: 0, else the code of the task that failed first, else srun's.

    A stop (tfrun's cancel, Slurm's SIGTERM before the time limit) is the shim's SIGTERM to this process alone
    (the launch record's `term_leader_only`): srun itself must not get it, since srun answers a SIGTERM with a
    SIGKILL to every task. It becomes `scancel --signal=TERM` of the job's steps, which slurmstepd delivers to
    every process of every task, so each gets the cancel's grace (the shim's SIGKILL after it reaches srun)."""
    job_dir = os.environ.get("TFRUN_JOB_DIR", ".")
    for index in range(tasks):  # an earlier run's records (a requeued job runs again in the same folder)
        with contextlib.suppress(FileNotFoundError):
            os.unlink(os.path.join(job_dir, TASK_RECORD.format(index)))
    signal.pthread_sigmask(signal.SIG_BLOCK, (*_STOPS, signal.SIGCHLD))
    try:
        pid = os.posix_spawnp("srun", srun_command(sys.executable, tasks, command), os.environ, setsigmask=())
    except OSError as exc:
        print(f"tfrun: cannot start srun: {exc.strerror}", file=sys.stderr, flush=True)
        return 127
    stopping = False
    while True:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            break
        received = signal.sigtimedwait((*_STOPS, signal.SIGCHLD), 1.0)
        if received is not None and received.si_signo != signal.SIGCHLD and not stopping:
            stopping = True
            _stop_tasks(pid)
    code = _exit_code(status)
    if code == 0:
        return 0
    failure = first_failure(job_dir, tasks)
    return code if failure is None else failure


def _stop_tasks(srun: int) -> None:
    """SIGTERM to every task, through slurmctld; if that fails, to srun (which then SIGKILLs them)."""
    job_id = os.environ.get("SLURM_JOB_ID", "")
    try:
        asked = subprocess.run(
            ["scancel", "--signal=TERM", "--quiet", job_id], stdin=subprocess.DEVNULL, timeout=30, check=False
        ).returncode == 0  # fmt: skip
    except (OSError, subprocess.TimeoutExpired):
        asked = False
    if not (job_id and asked):
        print("tfrun: scancel --signal=TERM failed: stopping srun", file=sys.stderr, flush=True)
        os.kill(srun, signal.SIGTERM)


def rank(command: list[str]) -> int:
    """Run `command` as this task: TF_CONFIG set, output on task-I.log for I > 0, its end recorded in
    task-I.json. Slurm signals every process of a task itself (its proctrack plugin tracks them), so this
    process passes nothing on: it outlives the command's SIGTERM to record it."""
    try:
        env = task_env(dict(os.environ))
    except TaskError as exc:
        print(f"tfrun: {exc}", file=sys.stderr, flush=True)
        return 2
    index = int(env[TASK_INDEX_ENV])
    job_dir = env.get("TFRUN_JOB_DIR")
    if index > 0 and job_dir:
        log = os.open(os.path.join(job_dir, TASK_LOG.format(index)), os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        os.dup2(log, 1)
        os.dup2(log, 2)
        os.close(log)
    signal.pthread_sigmask(signal.SIG_BLOCK, _STOPS)
    try:
        pid = os.posix_spawnp(command[0], command, env, setsigmask=())
    except OSError as exc:
        print(f"tfrun: cannot start {command[0]}: {exc.strerror}", file=sys.stderr, flush=True)
        return 127
    status = os.waitpid(pid, 0)[1]
    code = _exit_code(status)
    if job_dir:
        _record(job_dir, index, code)
    if os.WIFSIGNALED(status):  # end as the command did, so that srun reports the signal, not a code
        signal.signal(os.WTERMSIG(status), signal.SIG_DFL)
        signal.pthread_sigmask(signal.SIG_UNBLOCK, (os.WTERMSIG(status),))
        os.kill(os.getpid(), os.WTERMSIG(status))
    return code


def _record(job_dir: str, index: int, code: int) -> None:
    """task-I.json, written whole (a temporary file renamed over): the launcher reads it on another node."""
    path = os.path.join(job_dir, TASK_RECORD.format(index))
    tmp = f"{path}.{os.getpid()}.tmp"
    try:
        with open(tmp, "w") as f:
            json.dump({"exit_code": code, "ended_at": time.time()}, f)
        os.replace(tmp, path)
    except OSError as exc:  # the job's end matters more than the record: the launcher falls back to srun's code
        print(f"tfrun: cannot record task {index}'s end: {exc.strerror}", file=sys.stderr, flush=True)


def _exit_code(status: int) -> int:
    """The exit code as a shell reports it (128+N for signal N) from a wait status."""
    return 128 + os.WTERMSIG(status) if os.WIFSIGNALED(status) else os.WEXITSTATUS(status)


def _is_digits(text: str) -> bool:
    """tfrun/numerals.py's `is_digits`, here because nothing in this file imports tfrun (see the docstring above)."""
    return text.isascii() and text.isdigit()


def main(argv: list[str]) -> int:
    """`slurmtask.py launch N -- COMMAND...` or `slurmtask.py rank -- COMMAND...` (see the module's docstring)."""
    if len(argv) >= 5 and argv[1] == "launch" and _is_digits(argv[2]) and argv[3] == "--":
        return launch(int(argv[2]), argv[4:])
    if len(argv) >= 4 and argv[1] == "rank" and argv[2] == "--":
        return rank(argv[3:])
    print("usage: slurmtask.py launch N -- COMMAND... | slurmtask.py rank -- COMMAND...", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv))
