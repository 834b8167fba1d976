"""`tfrun doctor` (and so `tfrun hosts check`) on a Slurm login node: what a person needs to know before
submitting there. sbatch found and its version (tfrun's oldest supported: commands.Features), the
partitions with their state and nodes (the one [slurm] names, if any, must exist), the GPUs per node, and
whether accounting answers (`sacct`: how tfrund learns Slurm's end of a job that left squeue while no
daemon watched it). Each question is one Slurm command with a timeout (commands.CHECK_TIMEOUT_S).
"""

from __future__ import annotations

import shutil
from typing import Optional

from tfrun.protocol.admin import Check

from .commands import Partition, Slurm, SlurmError
from .settings import SlurmSettings

OK, WARN, FAIL = "ok", "warn", "fail"


def slurm_checks(slurm: Slurm, settings: SlurmSettings) -> list[Check]:
    """The Slurm lines, in the order a person would fix things; none past a missing sbatch."""
    try:
        features = slurm.features()
    except SlurmError as exc:
        advice = 'install Slurm\'s client commands here (sbatch, squeue, sacct), or set executor = "local"'
        return [Check("slurm", FAIL, str(exc), advice)]
    checks = [Check("slurm", OK, f"{features.text}, sbatch at {shutil.which('sbatch') or 'sbatch'}")]
    try:
        partitions = slurm.partitions()
    except SlurmError as exc:
        return [*checks, Check("slurm partitions", FAIL, str(exc), "is slurmctld up? (scontrol ping)")]
    checks.append(_partitions(partitions, settings.partition))
    checks.append(_gpus(partitions, settings.partition))
    error = slurm.accounting_error()
    if error is None:
        checks.append(Check("slurm accounting", OK, "sacct answers: the end of a job that left squeue is known"))
    else:
        advice = "a job that leaves squeue while tfrund is down then ends by its exit record alone, else lost"
        checks.append(Check("slurm accounting", WARN, error, advice))
    return checks


def _partitions(partitions: list[Partition], configured: Optional[str]) -> Check:
    shown = ", ".join(
        f"{p.name}{' (default)' if p.default else ''} {p.available}, {p.nodes} node{'s' if p.nodes != 1 else ''}"
        for p in partitions
    )
    if not partitions:
        return Check("slurm partitions", FAIL, "sinfo lists none", "is this node part of a cluster? (sinfo)")
    names = {p.name for p in partitions}
    if configured is not None and configured not in names:
        return Check("slurm partitions", FAIL, shown, f"[slurm] partition = {configured!r} is not one of them")
    if all(p.available != "up" for p in partitions):
        return Check("slurm partitions", WARN, shown, "no partition is up: jobs wait")
    return Check("slurm partitions", OK, shown)


def _gpus(partitions: list[Partition], configured: Optional[str]) -> Check:
    """GPUs per node in the partition jobs go to (the configured one, else the default), and elsewhere."""
    target = next((p for p in partitions if p.name == configured or (configured is None and p.default)), None)
    shown = "; ".join(f"{p.name}: {'/'.join(map(str, p.gpus_per_node))}" for p in partitions)
    if target is not None and not any(target.gpus_per_node):
        return Check("slurm gpus", WARN, f"per node: {shown}", f"jobs go to {target.name}, whose nodes have none")
    return Check("slurm gpus", OK, f"per node: {shown}")
