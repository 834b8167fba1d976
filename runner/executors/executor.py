"""Where jobs run: the Executor interface under the lifecycle (LocalExecutor, a shim per job on this machine, is
runner/executors/local.py).

An executor spawns jobs and tells what it sees of them; it never writes a job's state. What it sees comes
back as changes (Started, Ended), which Runs (runner/executors/runs.py) makes moves of through the
lifecycle (runner/records/lifecycle.py), and Requeued (a batch system runs a running job again), which is no move.
The interface is shaped for a batch system as much as for this machine (issue 19, Slurm):

- `launch` hands a job over and returns once it is handed over (locally: its shim has started it or failed
  to; Slurm: `sbatch --parsable` answered with an id, stored before anything else is done with it);
  `launch_array` hands over tasks of one array together (Slurm: one `sbatch --array`);
- `due` picks the jobs worth a look now and `wait` waits for a reason to look (locally: a shim's exit);
- `poll` looks at many jobs at once (Slurm: one `squeue` for all of them, backing off as it is slow, then
  `sacct` for those it no longer lists), and reports only what it is sure of: an empty or failed answer
  is never proof that a job ended, so it is no change at all;
- `cancel` asks for a stop with a grace period (`scancel --signal=TERM`, then KILL) and waits for nothing:
  the end comes through `poll`, unless the job never started, which ends at once;
- `reconcile` is the first look after a daemon start, which may find jobs ended or gone while no daemon ran;
- `resume` starts again a queued job whose launch a dead daemon recorded but may not have made;
- `resources` is what the scheduler may give jobs (the devices); `places_jobs` says the executor's own
  scheduler places jobs instead (Slurm: every queued job is handed over at once, with no devices of tfrun's);
- `failed_to_start` says why a job handed over is still queued, or None where that is normal (Slurm: it
  waits in Slurm's queue, and its start comes through `poll`).

runner/executors/local.py is the local one, runner/executors/slurm/executor.py the Slurm one (`executor = "slurm"` in
config.toml).
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, NamedTuple, Optional, Protocol, Union

from tfrun.protocol.fields import Cause, State

from ..records.job import JobRow

if TYPE_CHECKING:
    from tfrun.protocol.admin import Check

log = logging.getLogger("tfrund")


class Started(NamedTuple):
    """A queued job runs: how the executor knows it (locally, its shim's and its process's identities)."""

    pid: Optional[int]
    shim_pid: Optional[int]
    shim_start: Optional[int]
    boot_id: Optional[str]
    started_at: Optional[float]

    def values(self) -> dict[str, Any]:
        """The job's fields this sets."""
        return self._asdict()


class Ended(NamedTuple):
    """A job ended (or is gone, `lost`); the fields left None are not written."""

    state: State
    exit_code: Optional[int] = None
    signal: Optional[int] = None
    started_at: Optional[float] = None
    finished_at: Optional[float] = None
    reason: Optional[str] = None
    # what the executor's batch system says of the job's end (Slurm's OUT_OF_MEMORY: "oom"), one account the
    # lifecycle weighs with the cgroup and the log (runner/records/lifecycle.py `end_cause`)
    cause: Optional[Cause] = None

    def values(self) -> dict[str, Any]:
        """The job's fields this sets, besides its state."""
        return {k: v for k, v in self._asdict().items() if k != "state" and v is not None}


class Requeued(NamedTuple):
    """A running job that its batch system stopped and runs again, as the same job (Slurm's requeue, after a
    `scontrol requeue` or a preemption), `times` so far. It stays running; its reason says so."""

    times: int

    def reason(self) -> str:
        return f"requeued by Slurm ({self.times} time{'s' if self.times > 1 else ''}): it runs again from its start"


Change = Union[Started, Ended, Requeued]


@dataclass(frozen=True)
class Capabilities:
    """What an executor can do, said by the executor itself: a handler refuses what it cannot, in these words
    (each a reason after the option's name, None where it can), and nothing outside the executors asks which
    executor runs the jobs."""

    no_tty: Optional[str] = None  # why `--tty` jobs cannot run here
    no_services: Optional[str] = None  # why TensorBoard and Jupyter cannot run here
    no_batch_options: Optional[str] = None  # why --partition, --time, --nodes mean nothing here
    files_here: bool = True  # a job writes its files on this machine, where file events tell of them
    log_settle_s: float = 0.0  # a follower ends once a final job's log has been quiet this long


class Executor(Protocol):
    """Runs jobs; tells what happened to them as changes, in the order they happened, per job."""

    capabilities: Capabilities

    async def launch(self, row: JobRow, env: dict[str, str], grace: float) -> None:
        """Hand the job over, to run its command in its work dir with `env`, killed `grace` after a stop."""

    async def launch_array(self, rows: list[JobRow], envs: list[dict[str, str]], grace: float) -> None:
        """Hand over tasks of one array (submit --array) together, each with its env: as one submission where
        the executor has arrays (Slurm's sbatch --array), else one `launch` each."""

    async def resume(self, row: JobRow) -> bool:
        """At daemon start: hand over again a queued job whose launch was recorded; False if none was."""

    def due(self, rows: Sequence[JobRow]) -> list[JobRow]:
        """Which of these unfinished jobs (none being started) are worth a `poll` now."""

    def looks_unasked(self) -> bool:
        """Whether `due` may name a job although no job was written since it was last asked (a shim exited,
        a sweep is due; Slurm: always)."""

    async def wait(self, timeout: float) -> None:
        """Return once a job may have changed (locally: a shim exited), or after `timeout` seconds."""

    def poll(self, rows: Sequence[JobRow]) -> list[tuple[int, Change]]:
        """What changed for these unfinished jobs since they were last recorded, with their ids."""

    def reconcile(self, rows: Sequence[JobRow]) -> list[tuple[int, Change]]:
        """At daemon start: `poll`, for jobs that may have changed while no daemon watched them."""

    async def cancel(self, row: JobRow, grace: float) -> Optional[Ended]:
        """Ask the job to stop, killed after `grace`; its end if it never started (it ends now), else None."""

    def failed_to_start(self, row: JobRow) -> Optional[str]:
        """Why a job that `launch` handed over is still queued once it returned (it failed); None if it
        waits in a queue of the executor's own (a batch system's), to start later."""

    def forget(self, job_id: int) -> None:
        """The job's end is recorded: drop what was kept to learn of it."""

    def resources(self) -> list[str]:
        """The devices that jobs may be given."""

    def places_jobs(self) -> bool:
        """Whether the executor's own scheduler places jobs (Slurm): then the daemon's scheduler hands every
        job over as soon as its `--after` jobs allow, with no devices, and keeps no GPU count or CPU cap."""

    def use_devices(self, devices: list[str]) -> None:
        """The config's GPUs, read again (a reload): where the executor gives jobs devices of its own."""

    def checks(self) -> list[Check]:
        """The executor's own checks for `tfrun doctor` (blocking: run off the event loop)."""
