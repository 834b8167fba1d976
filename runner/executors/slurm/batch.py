"""A job's submission to Slurm as files and arguments: sbatch's options, the batch script (tfrun's shim in the
foreground) and the launch record. Both ways of submitting build on it: one job a `sbatch`
(runner/executors/slurm/executor.py) and an array's tasks in one `sbatch --array` (runner/executors/slurm/arrays.py).
"""

from __future__ import annotations

import shlex
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from tfrun.constants import SAFE_PATH

from ...home import in_shim_pythonpath
from ...records.job import JobRow
from ...shim import jobdir
from ...shim import slurmtask as task
from .settings import SlurmSettings, nice

if TYPE_CHECKING:
    from ...shim.jobdir import LaunchRecord

SCRIPT = "slurm.sh"  # in the job's folder
SIGNAL_MARGIN_S = 5  # the shim's SIGTERM comes this much before the grace's SIGKILL would pass the time limit
_ALLOCATION_PREFIXES = ("SLURM_", "SLURMD_", "CUDA_VISIBLE_DEVICES", "GPU_DEVICE_ORDINAL", "ROCR_VISIBLE_DEVICES")


def sbatch_args(row: JobRow, settings: SlurmSettings, grace: float) -> list[str]:
    """sbatch's options for a job: tfrun's own first (the job's --partition and --time over the config's;
    its --priority as --nice, see settings.nice), the config's extras (checked at load never to touch them)
    last, the batch script after them."""
    job_dir = Path(row.job_dir)
    args = [
        "--parsable",
        f"--job-name=tfrun-{row.id}",
        f"--output={job_dir / f'slurm-{row.id}.out'}",
        "--open-mode=append",
        f"--chdir={job_dir}",
        f"--signal=B:TERM@{int(grace + 0.999) + SIGNAL_MARGIN_S}",
    ]
    spec = row.spec
    if spec.gpus:
        args.append(f"--gres=gpu:{spec.gpus}")
    if spec.nodes:
        args.append(f"--nodes={spec.nodes}")  # --gres is per node: --gpus N on each
    if spec.nodes and spec.nodes > 1:
        args.append("--ntasks-per-node=1")  # one task a node, started by slurmtask.py's srun
    niceness = nice(spec.priority)
    if niceness is not None:
        args.append(f"--nice={niceness}")
    partition, time_limit = spec.partition or settings.partition, spec.time_limit or settings.time
    for flag, value in (("partition", partition), ("account", settings.account), ("time", time_limit)):
        if value:
            args.append(f"--{flag}={value}")
    return [*args, *settings.sbatch_options, str(job_dir / SCRIPT)]


def batch_script(job_dir: Path, shim_path: Path) -> str:
    """The batch script: tfrun's shim in the foreground, as LocalExecutor starts it (`python -S -m`)."""
    command = [sys.executable, "-S", *SAFE_PATH, "-m", "tfrun.runner.shim", "--batch", str(job_dir)]
    return (
        "#!/bin/sh\n"
        "# tfrun's shim runs the job, records its end in exit.json and owns the cancel grace (shim/supervise.py)\n"
        f"PYTHONPATH={shlex.quote(str(shim_path))} exec {shlex.join(command)}\n"
    )


def launch_env(env: dict[str, str]) -> dict[str, str]:
    """The launch record's environment: the allocation's own variables (its SLURM_*, the GPUs Slurm chose)
    come from the allocation, never from the daemon's environment."""
    return {k: v for k, v in env.items() if not k.startswith(_ALLOCATION_PREFIXES)}


def launch_record(row: JobRow, env: dict[str, str], grace: float, shim_path: Path) -> LaunchRecord:
    """What the shim in the batch script runs: the job's command in its work dir, with `env` less the
    allocation's variables; a job of several nodes runs one task a node, each with its TF_CONFIG
    (runner/shim/slurmtask.py, run from the shim's copy at `shim_path`)."""
    job_dir = Path(row.job_dir)
    record: LaunchRecord = {
        "command": list(row.spec.command),
        "cwd": str(job_dir / jobdir.WORK),
        "env": launch_env(env),
        "grace": grace,
    }
    if row.spec.nodes and row.spec.nodes > 1:
        launcher = in_shim_pythonpath(shim_path, task.__file__)
        task.across_nodes(record, sys.executable, row.spec.nodes, str(launcher))
    return record
