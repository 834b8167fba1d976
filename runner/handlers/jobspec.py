"""A submit request made into the job's spec (runner/records/job.py's JobSpec), every part checked before anything is
made: the script among the files sent, the command that runs it (the job interpreter), its GPUs and the jobs it
runs after, Slurm's options where the executor takes them, its alert rules and notify URLs, an array task's
values. Each failure is a one-line refusal (RequestError) in the user's words."""

from __future__ import annotations

import os
import re
import secrets
import shutil
from dataclasses import replace
from pathlib import PurePosixPath
from typing import TYPE_CHECKING, Optional, Protocol

from tfrun import arrays, restarts
from tfrun.content import ManifestError, check_manifest
from tfrun.protocol.fields import Cause, ErrorCode, is_job_id, validate_name
from tfrun.protocol.submit import Submit
from tfrun.storage import place

from ..alerts import rules
from ..alerts.outbox import diagnose, usable
from ..doctor import job_python
from ..executors.slurm import settings as slurm_settings
from ..metrics import LogMetrics
from ..metrics import PatternError as MetricPatternError
from ..records.job import JobSpec
from .base import RequestError, Shown, invalid

if TYPE_CHECKING:
    from ..executors.executor import Executor
    from ..queue.scheduler import Scheduler
    from ..workdir.blobs import BlobStore


class Context(Shown, Protocol):
    """What checking a submit needs of the daemon: uploaded contents, the GPUs and the executor (runner/daemon.py's
    Daemon is one)."""

    blobs: BlobStore
    executor: Executor
    scheduler: Scheduler


def job_spec(daemon: Context, req: Submit) -> JobSpec:
    """The job's spec from its request, every part checked: its script in the snapshot, the command that runs
    it, its GPUs and the jobs it runs after, its Slurm options; a request that fails any is refused in one
    line (RequestError), before anything is made."""
    script = _check_submit(daemon, req)
    command = _command(daemon, req, script)
    gpus, after = _resources(daemon, req)  # checked after the command, as they always were
    partition, time_limit = _slurm_options(daemon, req)
    return JobSpec(
        source=req.source,
        script=str(script),
        args=tuple(req.args),
        command=tuple(command),
        env=req.env,
        git_commit=req.git_commit,
        git_dirty=req.git_dirty,
        files=len(req.files),
        bytes=sum(e.size for e in req.files if e.kind == "file"),
        max_restarts=req.max_restarts,
        restart_on=_restart_on(req),
        gpus=gpus,
        priority=req.priority,
        after=after,
        tty=req.tty,
        partition=partition,
        time_limit=time_limit,
        nodes=req.nodes,
        checkpoints_to=_stored_folder(daemon, req, script),
    )


def _stored_folder(daemon: Context, req: Submit, script: PurePosixPath) -> Optional[str]:
    """The job's own folder in object storage: under the submit's destination (--checkpoints-to), else the
    daemon's ([storage] checkpoints_to), a folder named by the job's name (else its script's) and a random
    token, so that no two jobs of any box share one; None where neither names a destination (or the submit
    asks for none, with "")."""
    destination = daemon.config.checkpoints_to if req.checkpoints_to is None else req.checkpoints_to
    if not destination:
        return None
    try:
        where = place.parse(destination)
    except place.PlaceError as exc:
        raise invalid(f"--checkpoints-to: {exc}") from None
    stem = re.sub(r"[^A-Za-z0-9_.-]+", "-", req.name or script.stem).strip("-.") or "job"
    return where.child(f"{stem[:60]}-{secrets.token_hex(4)}").url


def _restart_on(req: Submit) -> tuple[Cause, ...]:
    """The causes whose failures restart the job: the request's, each once (the protocol checked each; an
    empty list is refused, as the option refuses it), else tfrun's default."""
    if req.restart_on is None:
        return restarts.DEFAULT
    try:
        return restarts.parse(req.restart_on)
    except ValueError as exc:
        raise invalid(f"--restart-on: {exc}") from None


def task_spec(req: Submit, spec: JobSpec, index: int, values: dict[str, str]) -> tuple[Optional[str], JobSpec]:
    """An array task's name and spec: its values as variables and as arguments after the script's own."""
    name = arrays.task_name(req.name, index)
    if name is not None and validate_name(name):
        raise invalid(f"--name {req.name!r} with the task index: {validate_name(name)}")
    extra = arrays.task_args(values)
    stored = f"{spec.checkpoints_to}-{index}" if spec.checkpoints_to else None  # each task its own stored folder
    return name, replace(
        spec, args=(*spec.args, *extra), command=(*spec.command, *extra), env={**spec.env, **arrays.task_env(values)},
        checkpoints_to=stored,
    )  # fmt: skip


def _resources(daemon: Context, req: Submit) -> tuple[int, tuple[int, ...]]:
    """What the job waits for besides its turn: its GPUs, the jobs it runs after (by id); checked."""
    devices = daemon.scheduler.devices
    gpus = daemon.scheduler.default_gpus() if req.gpus is None else req.gpus
    if gpus > len(devices) and not daemon.executor.places_jobs():  # Slurm checks its own GPUs
        has = f"has {len(devices)} ({', '.join(devices)})" if devices else "has none"
        raise invalid(f"the job asks for {gpus} GPU(s) and this box {has}")
    after: list[int] = []
    for ref in req.after:
        after += [job_id for job_id in _after_ids(daemon, ref) if job_id not in after]
    no_tty = daemon.executor.capabilities.no_tty
    if req.tty and no_tty:
        raise invalid(f"--tty: {no_tty}")
    if req.tty and shutil.which("tmux") is None:
        raise invalid("--tty needs tmux on the box (apt-get install tmux)")
    return gpus, tuple(after)


def _after_ids(daemon: Context, ref: str) -> list[int]:
    """The jobs `--after REF` waits for: the job of that id or name, else every task of the newest array
    submitted with --name REF (its tasks are named REF-0, REF-1, ...: a sweep, then the job that compares)."""
    dep = daemon.store.find(ref)
    if dep is not None:
        return [dep.id]
    if is_job_id(ref):
        raise RequestError(ErrorCode.NO_SUCH_JOB, f"--after: no job {ref!r}")
    first = daemon.store.find(arrays.task_name(ref, 0) or "")
    if first is None or first.array_id is None or first.array_index != 0:
        raise RequestError(ErrorCode.NO_SUCH_JOB, f"--after: no job or array {ref!r}")
    return [task.id for task in daemon.store.array_tasks(first.array_id)]


def _slurm_options(daemon: Context, req: Submit) -> tuple[Optional[str], Optional[str]]:
    """The job's --partition and --time (as sbatch takes it), checked; refused on a box that is no Slurm host."""
    given = [flag for flag, value in (("--partition", req.partition), ("--time", req.time), ("--nodes", req.nodes))
             if value is not None]  # fmt: skip
    refused = daemon.executor.capabilities.no_batch_options
    if given and refused:
        raise invalid(f"{', '.join(given)}: {refused}")
    try:
        return slurm_settings.job_options(req.partition, req.time, req.nodes)
    except slurm_settings.SettingsError as exc:
        raise invalid(str(exc)) from None


def alert_rules(daemon: Context, req: Submit) -> dict[str, Optional[float]]:
    """The job's alert rules from the daemon's and the request's; its URLs and metric patterns checked."""
    try:
        chosen = rules.combine(daemon.config.rules, req.alerts, req.no_alerts)
    except rules.RuleError as exc:
        raise invalid(str(exc)) from None
    for option, texts in (("--alert", req.alerts), ("--no-alert", req.no_alerts)):
        boxed = next((text for text in texts if text.partition("=")[0].strip() in rules.BOX_RULES), None)
        if boxed is not None:  # taken, then dropped without a word: the box's rules are not a job's to set
            name = boxed.partition("=")[0].strip()
            raise invalid(f"{option} {boxed}: {name} is the box's rule, not a job's: set it in the box's config "
                          "(tfrun config set alerts.rules ...)")  # fmt: skip
    try:
        LogMetrics(req.metric_patterns)
    except MetricPatternError as exc:
        raise invalid(f"--metric: {exc}") from None
    for url in req.notify:
        if not usable(url):
            raise invalid(f"--notify: {diagnose(url)}")
    return {name: value for name, value in chosen.items() if name in rules.JOB_RULES}


def _check_submit(daemon: Context, req: Submit) -> PurePosixPath:
    """The script's path in the snapshot, once everything about the request is known to be sound."""
    if req.name is not None:
        problem = validate_name(req.name)
        if problem:
            raise invalid(problem)
    for key, value in req.env.items():
        if not key or "=" in key or "\0" in key or "\0" in value:
            raise invalid(f"bad environment variable {key!r}: use NAME=VALUE")
    try:
        check_manifest(req.files)
        lacking = daemon.blobs.missing([e.digest for e in req.files if e.kind == "file" and e.digest])
    except ManifestError as exc:
        raise invalid(f"bad file list: {exc}") from None
    if lacking:
        raise invalid(f"{len(lacking)} file content(s) were never uploaded (e.g. {lacking[0][:12]})")
    entry = next((e for e in req.files if e.path == req.script), None)
    if entry is None or entry.kind == "dir":
        raise invalid(f"script {req.script!r} is not among the files sent (ignored by .gitignore or .tfrunignore?)")
    script = PurePosixPath(req.script)
    if script.suffix != ".py" and entry.kind == "file" and not entry.mode & 0o111:
        raise invalid(f"script {req.script} is not executable: chmod +x it, or name its interpreter")
    return script


def _command(daemon: Context, req: Submit, script: PurePosixPath) -> list[str]:
    """The argv the shim runs: `.py` through the job interpreter, anything else directly."""
    if script.suffix != ".py":
        return [f"./{script}", *req.args]
    python = req.python or job_python(daemon.config.job_python)
    if os.sep in python:
        if not os.access(python, os.X_OK):
            raise invalid(f"job interpreter {python} does not exist or is not executable")
    else:
        found = shutil.which(python)
        if found is None:
            raise invalid(f"job interpreter {python!r} is not on the daemon's PATH")
        python = found
    return [python, _as_argument(script), *req.args]


def _as_argument(script: PurePosixPath) -> str:
    """The script's path as no interpreter can read it as an option: `python3 -dash.py` is "Unknown option"."""
    return f"./{script}" if str(script).startswith("-") else str(script)
