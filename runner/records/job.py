"""A job as the daemon holds it: its spec (JobSpec), fixed when the job is made, and its row (JobRow), the
record the store keeps (runner/records/store.py) with what happened to it since.

"Spec" means this and only this: the submit options as the daemon keeps them, in the `spec` column of the
job's row (JSON). The file the shim starts from (spec.json) is the job's *launch record* (runner/shim/jobdir.py),
and an alert rule as written ("stall=10m") is the rule's *text* (runner/alerts/rules.py).

The stored JSON keeps the keys and order it always had, so a database written by an older tfrund reads
back (an absent key takes its default, an unknown one is ignored), and one written by this one reads back
in an older tfrund.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, fields, replace
from typing import Any, Optional

from tfrun import restarts
from tfrun.protocol.fields import CAUSES, Cause, JobState, State
from tfrun.protocol.jobs import Job

from ..shim import jobdir


@dataclass(frozen=True)
class JobSpec:
    """What a job runs and with what; a restart runs the same spec (`restart_of` says of which job)."""

    script: str  # as given: the path of the script in the snapshot
    args: tuple[str, ...]
    command: tuple[str, ...]  # what the shim runs: the job Python, the script, its arguments
    env: dict[str, str]  # the user's --env
    source: Optional[str] = None  # the work dir snapshotted, on the client's machine
    git_commit: Optional[str] = None
    git_dirty: Optional[bool] = None
    files: int = 0  # in the snapshot
    bytes: int = 0  # of the snapshot's files
    max_restarts: int = 0  # automatic restarts left
    gpus: int = 0  # asked for
    priority: int = 0  # among waiting jobs, higher starts first
    after: tuple[int, ...] = ()  # ids of the jobs that must succeed before it starts
    tty: bool = False  # runs in a tmux session (`tfrun attach`)
    restart_of: Optional[int] = None  # the job it runs again
    partition: Optional[str] = None  # Slurm: sbatch --partition (None: the [slurm] table's)
    time_limit: Optional[str] = None  # Slurm: sbatch --time, in Slurm's form (None: the [slurm] table's)
    nodes: Optional[int] = None  # Slurm: sbatch --nodes, one task a node (runner/shim/slurmtask.py)
    service: Optional[str] = None  # a service's kind (tensorboard, jupyter): runner/services/commands.py
    port: Optional[int] = None  # the box port a service listens on (127.0.0.1)
    restart_on: tuple[Cause, ...] = restarts.DEFAULT  # the failures `max_restarts` restarts (--restart-on)
    restarts: int = 0  # automatic restarts before this job in its chain (0: a submit's): "restart 2 of 3"
    # the job's stored folder in object storage (s3://bucket/prefix/NAME-TOKEN), shared by its restarts on any
    # box; None: its checkpoints stay on the box (runner/storage/)
    checkpoints_to: Optional[str] = None
    restore: bool = False  # a resume on another box: its newest stored checkpoint is fetched before it starts

    def to_json(self) -> str:
        """The spec as stored: the keys in the order tfrund always wrote them, `restart_of` and the Slurm
        options only where set, `restart_on` where it is not every cause (as a spec without it reads) and
        `restarts` where there were any."""
        data: dict[str, Any] = {
            "source": self.source,
            "script": self.script,
            "args": list(self.args),
            "command": list(self.command),
            "env": self.env,
            "git_commit": self.git_commit,
            "git_dirty": self.git_dirty,
            "files": self.files,
            "bytes": self.bytes,
            "max_restarts": self.max_restarts,
            "gpus": self.gpus,
            "priority": self.priority,
            "after": list(self.after),
            "tty": self.tty,
        }
        if self.restart_of is not None:
            data["restart_of"] = self.restart_of
        for key in ("partition", "time_limit", "nodes", "service", "port", "checkpoints_to"):  # only where set
            if getattr(self, key) is not None:
                data[key] = getattr(self, key)
        if self.restart_on != CAUSES:
            data["restart_on"] = list(self.restart_on)
        if self.restarts:
            data["restarts"] = self.restarts
        if self.restore:
            data["restore"] = True
        return json.dumps(data)

    def rerun(self, of: int, max_restarts: Optional[int] = None) -> JobSpec:
        """The spec of the job that runs job `of` (this spec's) again, with `max_restarts` left if given: an
        automatic restart, which counts in `restarts` (a `tfrun restart` does not)."""
        if max_restarts is None:
            return replace(self, restart_of=of)
        return replace(self, restart_of=of, max_restarts=max_restarts, restarts=self.restarts + 1)


_LISTS = ("args", "command", "after", "restart_on")  # JSON arrays, kept as tuples

# What every stored spec of a service matches as SQL LIKE (it holds the key "service"; a few others may, an env
# var of that name): a query that must tell services apart decodes only the specs that match.
SERVICE_LIKE = '%"service"%'
_SPEC_FIELDS = frozenset(f.name for f in fields(JobSpec))  # once: `ps -a` decodes a spec for every job


def from_json(text: str) -> JobSpec:
    """A spec as stored by any tfrund: an absent key takes its default (the field's), an unknown one is
    ignored; but an absent `restart_on` is every cause, as a tfrund from before --restart-on restarted after
    any failure, and that is what the job was submitted with."""
    data = json.loads(text)
    values = {key: value for key, value in data.items() if key in _SPEC_FIELDS}
    values.setdefault("restart_on", CAUSES)
    for name in _LISTS:
        if name in values:
            values[name] = tuple(values[name])
    return JobSpec(**values)


@dataclass
class JobRow:
    """A job as stored, with the supervision fields a client never sees."""

    id: int
    name: Optional[str]
    state: State
    spec: JobSpec
    job_dir: str
    checkpoint_dir: str
    created_at: float
    started_at: Optional[float] = None
    finished_at: Optional[float] = None
    exit_code: Optional[int] = None
    signal: Optional[int] = None
    pid: Optional[int] = None
    shim_pid: Optional[int] = None
    shim_start: Optional[int] = None
    boot_id: Optional[str] = None
    reason: Optional[str] = None
    restarted_as: Optional[int] = None
    prepared: int = 0
    gpus: Optional[list[str]] = None
    waiting: Optional[str] = None
    array_id: Optional[int] = None  # a task of an array: the array's id (its first task's job id)
    array_index: Optional[int] = None  # the task's index in its array
    cause: Optional[str] = None  # why it failed or was lost, in --restart-on's words (runner/records/lifecycle.py)

    @property
    def final(self) -> bool:
        return self.state in JobState.FINAL

    def public(self) -> Job:
        """The record as the protocol shows it to a client."""
        return Job(
            id=self.id,
            name=self.name,
            state=self.state,
            script=self.spec.script,
            args=list(self.spec.args),
            command=list(self.spec.command),
            workdir=os.path.join(self.job_dir, jobdir.WORK),  # not Path, which took half of public()'s time
            env=self.spec.env,
            job_dir=self.job_dir,
            log_path=os.path.join(self.job_dir, jobdir.OUTPUT),
            checkpoint_dir=self.checkpoint_dir,
            created_at=self.created_at,
            started_at=self.started_at,
            finished_at=self.finished_at,
            exit_code=self.exit_code,
            signal=self.signal,
            pid=self.pid,
            reason=self.reason,
            source=self.spec.source,
            git_commit=self.spec.git_commit,
            git_dirty=self.spec.git_dirty,
            files=self.spec.files,
            bytes=self.spec.bytes,
            restart_of=self.spec.restart_of,
            restarted_as=self.restarted_as,
            restarts_left=self.spec.max_restarts,
            restart_on=list(self.spec.restart_on),
            restarts=self.spec.restarts,
            cause=self.cause,
            gpus_requested=self.spec.gpus,
            gpus=self.gpus or [],
            priority=self.spec.priority,
            after=list(self.spec.after),
            waiting=self.waiting if self.state == JobState.QUEUED else None,
            tty=self.spec.tty,
            array_id=self.array_id,
            array_index=self.array_index,
            service=self.spec.service,
            port=self.spec.port,
            checkpoints_to=self.spec.checkpoints_to,
        )
