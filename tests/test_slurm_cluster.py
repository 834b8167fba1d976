"""The test cluster of tests/harness/slurmcluster.py works the way tfrund's Slurm executor uses Slurm (issue 19): submit
with `sbatch --parsable --gres`, watch in squeue, read the final state and exit code from sacct once the job
has left squeue, cancel with scancel, detect versions."""

from __future__ import annotations

import contextlib
import time
from pathlib import Path

import pytest
from harness import wait_for
from harness.slurmcluster import FINAL_STATES, SlurmCluster, slurm_fixture  # noqa: F401 - the fixture slurm

pytestmark = [pytest.mark.slurm]


@pytest.mark.slow  # more than 10 s
def test_a_failing_gpu_job_is_seen_in_squeue_then_in_sacct(slurm: SlurmCluster, tmp_path: Path) -> None:
    output = tmp_path / "out.log"
    job = slurm.sbatch("--gres=gpu:1", f"--output={output}", "--job-name=tfrun-1",
                       "--wrap", "echo gpus=$CUDA_VISIBLE_DEVICES; sleep 1; exit 3")  # fmt: skip
    assert slurm.squeue_state(job) in ("PENDING", "CONFIGURING", "RUNNING"), "a fresh job is listed by squeue"
    # Finished jobs stay in `squeue -t all` (final state shown) until MinJobAge and slurmctld's purge: never
    # read "not in squeue" as the state. Plain squeue hides them once they end.
    wait_for(lambda: slurm.squeue_state(job) in FINAL_STATES, timeout=20, what="the job to end")
    assert slurm.ok(["squeue", "-h", "-j", str(job), "-o", "%T"]).strip() == ""
    wait_for(lambda: slurm.squeue_state(job) is None, timeout=90, what="the job to leave squeue")
    assert slurm.sacct(job) == ("FAILED", "3:0")
    assert output.read_text() == "gpus=0\n", "one fake GPU, exported as CUDA_VISIBLE_DEVICES"
    raw = slurm.ok(["sacct", "-j", str(job), "-n", "-P", "-o", "State,ExitCode"]).splitlines()
    assert raw[0] == "FAILED|3:0", raw  # the allocation; then its steps (batch, extern)


def test_scancel_of_a_running_job_ends_it_cancelled(slurm: SlurmCluster, tmp_path: Path) -> None:
    marker = tmp_path / "running"
    job = slurm.sbatch(f"--output={tmp_path / 'out.log'}", "--wrap", f"touch {marker}; sleep 300")
    wait_for(marker.exists, timeout=20, what="the job to run")
    assert slurm.squeue_state(job) == "RUNNING"
    began = time.monotonic()
    slurm.ok(["scancel", str(job)])
    # The allocation's ExitCode of a cancelled job is 0:0; its batch step's carries the signal (0:15).
    assert slurm.wait_final(job, timeout=30) == ("CANCELLED", "0:0")
    assert time.monotonic() - began < 15
    # The batch step's row reaches accounting after the allocation's: under load, sacct gave 0:0 for it at first.
    expected = [f"{job}|CANCELLED by 0|0:0", f"{job}.batch|CANCELLED|0:15"]
    rows: list[str] = []

    def settled() -> bool:
        rows[:] = slurm.ok(["sacct", "-j", str(job), "-n", "-P", "-o", "JobID,State,ExitCode"]).splitlines()[:2]
        return rows == expected

    with contextlib.suppress(AssertionError):
        wait_for(settled, timeout=15, what="the batch step's final row")
    assert rows == expected


def test_versions_and_the_node_are_detected(slurm: SlurmCluster) -> None:
    versions = slurm.versions()
    assert set(versions.values()) == {versions["sbatch"]}, versions
    assert versions["sbatch"] >= (20, 11), versions
    nodes = slurm.ok(["sinfo", "-h", "-N", "-o", "%N|%P|%c|%G"]).split()
    assert nodes == [f"localhost|{slurm.partition}*|{slurm.cpus}|gpu:{slurm.gpus_per_node}"], nodes


def test_srun_reserves_ports_for_tf_config_only_when_given_a_count(slurm: SlurmCluster) -> None:
    """Multi-node TF_CONFIG takes its ports from `srun --resv-ports=N` (MpiParams=ports): on 22.05 a bare
    --resv-ports reserves none when no MPI plugin asks for them."""
    script = "echo $SLURM_PROCID ports=$SLURM_STEP_RESV_PORTS"
    bare = slurm.ok(["srun", "-n", "2", "--resv-ports", "bash", "-c", script]).split()
    counted = sorted(slurm.ok(["srun", "-n", "2", "--resv-ports=1", "bash", "-c", script]).splitlines())
    assert sorted(bare) == ["0", "1", "ports=", "ports="], bare
    port = counted[0].split("=")[1]
    assert counted == [f"0 ports={port}", f"1 ports={port}"], counted
    assert slurm.ports.mpi <= int(port) < slurm.ports.mpi + 10
