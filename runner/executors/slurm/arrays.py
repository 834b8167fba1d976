"""Job arrays on Slurm: the tasks of one `tfrun submit --array` that the scheduler hands over together become
ONE `sbatch --array=I,J,...`, and each task is still a whole tfrun job with its own folder, log and state.

Slurm gives every task of an array the same batch script, work dir and output pattern, told apart only by
SLURM_ARRAY_TASK_ID. So a submission has a folder of its own, the *array folder* (TFRUN_HOME/slurm-arrays/ID,
ID the job id of its first task), holding:

- `array.json` (ArrayRecord): the tasks it submits (index -> job folder), written before sbatch, then Slurm's
  array id: what a new daemon needs to find the submission (squeue by this folder, the array's work dir)
  rather than submit it twice;
- `slurm.sh`: picks the task's job folder by SLURM_ARRAY_TASK_ID and runs tfrun's shim there, as a plain
  job's batch script does (runner/executors/slurm/batch.py);
- `output-INDEX`: a symlink to the task's `slurm-JOBID.out` in its own folder, for `--output=.../output-%a`:
  the batch output stays under each task's folder, named by tfrun's id, as for a plain job.

Each task's folder gets its launch record (spec.json), `slurm-array.json` (which array folder it was
submitted from) and, once sbatch answered, its slurm.json with the task's own Slurm id, ARRAYID_INDEX, which
squeue (with --array) and sacct list task by task: from then on a task is polled, cancelled and ended as
any job. `tfrun rm` and `prune` delete the array folder with the last of its tasks (`remove_unused`).
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import shlex
import shutil
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Optional, Protocol, TypedDict

from tfrun.constants import DEFAULT_GRACE_S, SAFE_PATH

from ...faults import crash_point
from ...records.job import JobRow
from ...shim import jobdir
from .batch import SCRIPT, launch_record, sbatch_args
from .commands import Slurm, SlurmError
from .record import Records
from .settings import SlurmSettings

if TYPE_CHECKING:
    pass

log = logging.getLogger("tfrund")

ARRAYS = "slurm-arrays"  # in TFRUN_HOME: a folder per job array on Slurm, named by its first task's id (see above)
ARRAY_RECORD = "array.json"
ARRAY_LINK = "slurm-array.json"  # in a task's folder: its array folder
_OWN = ("--job-name=", "--output=", "--chdir=")  # sbatch_args' per-job options, set here per array


class ArrayRecord(TypedDict, total=False):
    """array.json: the tasks submitted together (index -> job folder), then the array's Slurm id."""

    tasks: dict[str, str]
    slurm_id: str


class Submitter(Protocol):
    """What an array's submission needs of the executor (SlurmExecutor): its records, its Slurm and its settings;
    named here so that this module does not import the executor that imports it."""

    records: Records
    slurm: Slurm
    settings: Callable[[], SlurmSettings]
    shim_path: Path  # the shim's own import path (runner/home.py install_shim_pythonpath)


def array_folder(row: JobRow) -> Path:
    """Where the submission that starts with task `row` keeps its files: TFRUN_HOME/slurm-arrays/JOBID."""
    return Path(row.job_dir).parent.parent / ARRAYS / str(row.id)


def batch_script(tasks: dict[int, Path], shim_path: Path) -> str:
    """The array's batch script: the task's folder by SLURM_ARRAY_TASK_ID, then tfrun's shim in it."""
    command = shlex.join([sys.executable, "-S", *SAFE_PATH, "-m", "tfrun.runner.shim", "--batch"])
    cases = "".join(f"{index}) dir={shlex.quote(str(folder))} ;;\n" for index, folder in sorted(tasks.items()))
    return (
        "#!/bin/sh\n"
        "# each task of the array runs in its own tfrun job folder (runner/executors/slurm/arrays.py)\n"
        f'case "$SLURM_ARRAY_TASK_ID" in\n{cases}'
        '*) echo "tfrun: no task $SLURM_ARRAY_TASK_ID in this array" >&2; exit 1 ;;\nesac\n'
        f'PYTHONPATH={shlex.quote(str(shim_path))} exec {command} "$dir"\n'
    )


def array_sbatch_args(first: JobRow, folder: Path, indexes: list[int], settings_args: list[str]) -> list[str]:
    """sbatch's options for an array: a job's (`settings_args`, from its first task: the tasks share every
    option but their values), with the name, output and work dir the array's own, and --array."""
    shared = [arg for arg in settings_args[:-1] if not arg.startswith(_OWN)]
    return [
        f"--job-name=tfrun-array-{first.array_id}",
        f"--output={folder / 'output-%a'}",
        f"--chdir={folder}",
        f"--array={','.join(map(str, indexes))}",
        *shared,
        str(folder / SCRIPT),
    ]


async def launch(executor: Submitter, rows: list[JobRow], envs: list[dict[str, str]], grace: float) -> None:
    """Write each task's launch record, the array folder, then one sbatch for all of `rows`."""
    if rows[0].spec.tty:
        for row in rows:
            executor.records.write(Path(row.job_dir), {"error": "--tty jobs do not run on Slurm (yet)"})
        return
    folder = array_folder(rows[0])
    folder.mkdir(parents=True, exist_ok=True)
    for row, env in zip(rows, envs):
        job_dir = Path(row.job_dir)
        launch = launch_record(row, env, grace, executor.shim_path)
        _write_json(job_dir / ARRAY_LINK, {"folder": str(folder)})  # first: a task with a launch record has it
        jobdir.write_json(job_dir / jobdir.LAUNCH, launch)
        output = folder / f"output-{row.array_index}"
        output.unlink(missing_ok=True)  # one left by a launch that a dead daemon began
        output.symlink_to(job_dir / f"slurm-{row.id}.out")
    tasks = {int(row.array_index or 0): Path(row.job_dir) for row in rows}
    (folder / SCRIPT).write_text(batch_script(tasks, executor.shim_path))
    _write_json(folder / ARRAY_RECORD, {"tasks": {str(i): str(d) for i, d in tasks.items()}})
    crash_point("array-recorded")
    await _submit(executor, rows[0], folder, tasks, grace)


async def _submit(executor: Submitter, first: JobRow, folder: Path, tasks: dict[int, Path], grace: float) -> None:
    """One sbatch for `tasks`; each task's Slurm id (or sbatch's refusal) recorded in its folder."""
    args = array_sbatch_args(first, folder, sorted(tasks), sbatch_args(first, executor.settings(), grace))
    loop = asyncio.get_running_loop()
    try:
        slurm_id = await loop.run_in_executor(None, executor.slurm.submit, args)
    except SlurmError as exc:
        found = await loop.run_in_executor(None, _submitted, executor, folder)  # a timeout may hide a submit
        if found is None:
            log.warning("array of job %d: sbatch refused it: %s", first.id, exc)
            for job_dir in tasks.values():
                executor.records.write(job_dir, {"error": str(exc)})
            return
        slurm_id = found
    crash_point("array-submitted")
    _recorded(executor.records, folder, tasks, slurm_id)
    log.info("jobs %s: submitted to Slurm as array %s", ", ".join(Path(d).name for d in tasks.values()), slurm_id)


def _recorded(records: Records, folder: Path, tasks: dict[int, Path], slurm_id: str) -> None:
    """The array's Slurm id in its record, and each task's own (ARRAYID_INDEX) in its folder."""
    record: ArrayRecord = {"tasks": {str(i): str(d) for i, d in tasks.items()}, "slurm_id": slurm_id}
    _write_json(folder / ARRAY_RECORD, dict(record))
    now = time.time()
    for index, job_dir in tasks.items():
        records.write(job_dir, {"slurm_id": f"{slurm_id}_{index}", "submitted_at": now})


def _submitted(executor: Submitter, folder: Path) -> Optional[str]:
    """The Slurm id of an array submitted from `folder` if Slurm holds one (the folder is its work dir)."""
    try:
        queue = executor.slurm.queue()
    except SlurmError:
        return None
    return next((j.slurm_id.split("_")[0] for j in queue.values() if j.work_dir == str(folder)), None)


def submitted_with(job_dir: Path) -> Optional[Path]:
    """The array folder a task was (or was about to be) submitted from; None for a job that is no task."""
    folder = _read_json(job_dir / ARRAY_LINK).get("folder")
    return Path(folder) if isinstance(folder, str) else None


async def resume(executor: Submitter, row: JobRow, folder: Path) -> bool:
    """A task whose launch a dead daemon recorded and whose Slurm id it did not: its array found in squeue
    (its id recorded for every task of that submission), or submitted now, less the tasks cancelled since.
    False if the array's record is unreadable (the task is handed over again)."""
    record = _read_json(folder / ARRAY_RECORD)
    try:
        tasks = {int(i): Path(d) for i, d in record["tasks"].items()}
    except (ValueError, KeyError, TypeError, AttributeError):
        return False
    loop = asyncio.get_running_loop()
    found = record.get("slurm_id") or await loop.run_in_executor(None, _submitted, executor, folder)
    if isinstance(found, str):
        records = executor.records
        _recorded(records, folder, {i: d for i, d in tasks.items() if not records.read(d)}, found)
        return True
    left = {i: d for i, d in tasks.items() if not (d / jobdir.CANCEL).exists() and not executor.records.read(d)}
    if not left:
        return False
    try:
        launch_record = jobdir.read_launch(Path(row.job_dir) / jobdir.LAUNCH)
    except ValueError:
        launch_record = None
    grace = float(launch_record.get("grace", DEFAULT_GRACE_S)) if launch_record else DEFAULT_GRACE_S
    log.info("job %d: submitting its array (accepted before the last daemon stopped)", row.id)
    await _submit(executor, row, folder, left, grace)
    return True


def remove_unused(home: Path) -> None:
    """Delete the array folders of TFRUN_HOME none of whose tasks' folders remain (`tfrun rm` or `prune`
    removed them all). One with no readable record yet (its launch is being written) stays."""
    try:
        folders = list((home / ARRAYS).iterdir())
    except OSError:  # no Slurm arrays here
        return
    for folder in folders:
        tasks = _read_json(folder / ARRAY_RECORD).get("tasks")
        if isinstance(tasks, dict) and not any(Path(str(job_dir)).exists() for job_dir in tasks.values()):
            shutil.rmtree(folder, ignore_errors=True)


def _write_json(path: Path, data: dict[str, object]) -> None:
    """`path` replaced atomically (a temporary file, fsynced, renamed over): a daemon killed while writing
    leaves the old record or the new one."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    with open(tmp, "w") as f:
        f.write(json.dumps(data))
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def _read_json(path: Path) -> dict[str, Any]:
    """The object in `path`; empty if it is missing or damaged."""
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}
