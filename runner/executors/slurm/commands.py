"""Slurm's commands as tfrund runs them: each with a timeout (a slurmctld that hangs must not hang the
daemon), each answer parsed here, and a failure always an error, never an empty answer: an empty or
failed `squeue` is no proof that a job ended (SkyPilot learned it the hard way, skypilot#10457).

The version (`sbatch --version`) is read once; `Features` is the one place where what tfrun uses is
weighed against it.
"""

from __future__ import annotations

import os
import re
import subprocess
import time
from dataclasses import dataclass
from typing import Optional

from tfrun.numerals import is_digits
from tfrun.shorten import shorten

from ...home import inherited_env

COMMAND_TIMEOUT_S = 15.0
CHECK_TIMEOUT_S = 10.0  # `tfrun doctor`'s own questions (sinfo, sacct): a person waits for the answer
ACCOUNTING_RETRY_S = 300.0  # accounting found off: ask sacct again this much later
_VERSION = re.compile(r"(\d+)\.(\d+)(?:\.(\d+))?")


class SlurmError(Exception):
    """A Slurm command failed, timed out or is not installed; the message says which and why."""


@dataclass(frozen=True)
class Features:
    """What this Slurm does, by its version. Every flag tfrun passes (`sbatch --parsable --signal=B:...
    --gres`, `squeue --states=all`, `scancel --batch`, `sacct --parsable2`) exists since 17.11, the oldest
    supported; newer features are added here as fields, never assumed elsewhere."""

    version: tuple[int, int, int]
    text: str

    MINIMUM = (17, 11, 0)

    @classmethod
    def parse(cls, output: str) -> Features:
        found = _VERSION.search(output)
        if not found:
            raise SlurmError(f"sbatch --version said {shorten(output.strip(), 80)!r}: no version in it")
        version = (int(found[1]), int(found[2]), int(found[3] or 0))
        return cls(version, output.strip())

    @property
    def supported(self) -> bool:
        return self.version >= self.MINIMUM

    @property
    def gpus_flag(self) -> bool:
        """`--gpus`/`--gpus-per-node` (19.05+), for multi-node jobs (a later slice); one node uses --gres."""
        return self.version >= (19, 5, 0)


@dataclass(frozen=True)
class QueuedJob:
    """One line of squeue: the Slurm id, its state, its work dir (tfrun's job folder), Slurm's reason."""

    slurm_id: str
    state: str
    work_dir: str
    reason: str = ""


@dataclass(frozen=True)
class Partition:
    """A partition as sinfo shows it, for `tfrun doctor`: its state, its nodes, their GPUs."""

    name: str
    default: bool
    available: str  # up, down, drain, inact
    nodes: int
    gpus_per_node: tuple[int, ...]  # GPUs of a node, for each kind of node in it (sorted, distinct)


@dataclass(frozen=True)
class AccountedJob:
    """One line of sacct: the allocation's final (or current) state and its ExitCode "CODE:SIGNAL"."""

    slurm_id: str
    state: str
    exit_code: str


def gpu_count(gres: str) -> int:
    """The GPUs in sinfo's %G: "gpu:2", "gpu:a100:4(S:0-1)", "gpu:a100:4,gpu:v100:2" (6), "(null)" (0)."""
    total = 0
    for item in gres.split(","):
        fields = item.split("(")[0].split(":")
        if fields[0] == "gpu" and len(fields) > 1 and is_digits(fields[-1]):
            total += int(fields[-1])
    return total


def run(args: list[str], timeout: float = COMMAND_TIMEOUT_S) -> str:
    """A Slurm command's stdout; SlurmError with its stderr if it fails, times out or is missing."""
    try:
        done = subprocess.run(
            args, capture_output=True, text=True, timeout=timeout, stdin=subprocess.DEVNULL, env=inherited_env()
        )
    except FileNotFoundError:
        raise SlurmError(f"{args[0]} not found: is this a Slurm login node?") from None
    except subprocess.TimeoutExpired:
        raise SlurmError(f"{args[0]} did not answer in {timeout:.0f}s") from None
    except OSError as exc:
        raise SlurmError(f"{args[0]}: {exc.strerror or exc}") from None
    if done.returncode != 0:
        lines = (done.stderr or done.stdout).strip().splitlines()
        raise SlurmError(f"{args[0]} failed (exit code {done.returncode}): {lines[-1] if lines else 'no message'}")
    return done.stdout


class Slurm:
    """The commands, for one daemon. Blocking calls with timeouts: the executor always runs them off the event
    loop (worker threads; poll's squeue and sacct in runner/executors/slurm/watcher.py's thread)."""

    def __init__(self) -> None:
        self._features: Optional[Features] = None
        self._accounting_off_until = 0.0

    def features(self) -> Features:
        """The version's features, read once."""
        if self._features is None:
            features = Features.parse(run(["sbatch", "--version"]))
            if not features.supported:
                minimum = ".".join(map(str, Features.MINIMUM))
                raise SlurmError(f"{features.text} is older than Slurm {minimum}, the oldest tfrun supports")
            self._features = features
        return self._features

    def submit(self, args: list[str]) -> str:
        """sbatch --parsable ... : the new job's id ("123", or "123;cluster" read as "123")."""
        self.features()
        out = run(["sbatch", *args]).strip()
        slurm_id = out.splitlines()[-1].split(";")[0].strip() if out else ""
        if not is_digits(slurm_id):
            raise SlurmError(f"sbatch answered {shorten(out, 80)!r}, not a job id")
        return slurm_id

    def queue(self) -> dict[str, QueuedJob]:
        """Every job of this user that slurmctld still holds, final ones too (for MinJobAge), by Slurm id.
        One call for all of tfrund's jobs; the caller picks its own out (by id)."""
        # --array: a task of an array a line, ARRAYID_INDEX, pending ones too (else one line ARRAYID_[0-3])
        out = run(["squeue", "--noheader", "--array", "--states=all", f"--user={os.getuid()}", "--format=%i|%T|%Z|%r"])
        jobs = {}
        for line in out.splitlines():
            parts = line.strip().split("|", 2)
            if len(parts) == 3:
                work_dir, _, reason = parts[2].rpartition("|")
                jobs[parts[0]] = QueuedJob(parts[0], parts[1], work_dir, reason)
        return jobs

    def accounting(self, slurm_ids: list[str]) -> Optional[dict[str, AccountedJob]]:
        """What sacct knows of jobs squeue no longer lists; None where accounting is off (asked again later)."""
        if not slurm_ids or time.monotonic() < self._accounting_off_until:
            return None
        fields = "--format=JobID,State,ExitCode"  # JobID: a task of an array is ARRAYID_INDEX, as squeue names it
        try:
            out = run(["sacct", "--noheader", "--parsable2", "--allocations", fields, f"--jobs={','.join(slurm_ids)}"])
        except SlurmError:
            self._accounting_off_until = time.monotonic() + ACCOUNTING_RETRY_S
            return None
        jobs = {}
        for line in out.splitlines():
            parts = line.strip().split("|")
            if len(parts) == 3 and parts[0] in slurm_ids:
                jobs[parts[0]] = AccountedJob(*parts)
        return jobs

    def partitions(self) -> list[Partition]:
        """The cluster's partitions (sinfo), in its order; a partition's node kinds are merged into one."""
        out = run(["sinfo", "--noheader", "--format=%P|%a|%D|%G"], timeout=CHECK_TIMEOUT_S)
        found: dict[str, Partition] = {}
        for line in out.splitlines():
            parts = line.strip().split("|")
            if len(parts) != 4 or not is_digits(parts[2]):
                continue
            name = parts[0].rstrip("*")
            gpus = gpu_count(parts[3])
            before = found.get(name)
            nodes = int(parts[2]) + (before.nodes if before else 0)
            counts = tuple(sorted({gpus, *(before.gpus_per_node if before else ())}))
            found[name] = Partition(name, parts[0].endswith("*"), parts[1], nodes, counts)
        return list(found.values())

    def accounting_error(self) -> Optional[str]:
        """Why `sacct` does not answer (accounting is off, slurmdbd is down), or None where it does: without
        it, Slurm's end of a job that left squeue while no daemon watched is not known."""
        try:
            run(["sacct", "--noheader", "--parsable2", "--allocations", "--format=JobID", "--starttime=now"],
                timeout=CHECK_TIMEOUT_S)  # fmt: skip
        except SlurmError as exc:
            return str(exc)
        return None

    def signal_batch(self, slurm_id: str, signal_name: str) -> None:
        """`signal_name` to the batch script's process alone (tfrun's shim, which owns the grace)."""
        run(["scancel", "--batch", f"--signal={signal_name}", slurm_id])

    def cancel(self, slurm_id: str) -> None:
        """End the job now, pending or running: Slurm's own TERM, KillWait, KILL to all of it."""
        run(["scancel", slurm_id])
