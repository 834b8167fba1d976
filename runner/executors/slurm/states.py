"""Slurm's job states as tfrun's: which are still waiting, which run, and what a final one means.

A job's exit record (exit.json, written by tfrun's shim in the batch script) is exact: its code is the
job's own, and it says whether tfrun cancelled it. Slurm's final state adds what the shim cannot know: the
allocation ran out of memory (the cause `oom` of --restart-on) or time, or its node failed or it was
preempted (then the job is `lost`, which `--max-restarts` restarts under the default --restart-on). Without
an exit record (the shim was killed, or never ran) Slurm's state and exit code are all there is.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Optional

from tfrun.constants import EXIT_LOST
from tfrun.numerals import is_digits
from tfrun.protocol.fields import Cause, JobState

from ...records.oom import SLURM_OUT_OF_MEMORY as OUT_OF_MEMORY
from ..executor import Ended

if TYPE_CHECKING:
    from ...shim.jobdir import ExitRecord

PENDING = frozenset({"PENDING", "CONFIGURING", "REQUEUED", "REQUEUE_HOLD", "REQUEUE_FED", "RESV_DEL_HOLD"})
RUNNING = frozenset({"RUNNING", "COMPLETING", "SUSPENDED", "STOPPED", "SIGNALING", "STAGE_OUT", "RESIZING"})
# Final states that are not the job's doing: run it again (--max-restarts) if it may.
LOST = {"NODE_FAIL": "its node failed", "PREEMPTED": "it was preempted", "BOOT_FAIL": "its node failed to boot"}
# Final states that fail the job whatever it exited with, and why.
FAILED_STATES = {
    "OUT_OF_MEMORY": OUT_OF_MEMORY,
    "TIMEOUT": "its time limit was reached",
    "DEADLINE": "its deadline was reached",
    "REVOKED": "Slurm revoked it",
}
FINAL = frozenset({"COMPLETED", "FAILED", "CANCELLED", *LOST, *FAILED_STATES, "SPECIAL_EXIT"})
# What a failed state says of the cause (--restart-on) beyond the job's signal and code: lost is LOST's.
SLURM_CAUSES: dict[str, Cause] = {"OUT_OF_MEMORY": "oom"}


def normal(state: str) -> str:
    """A state as squeue or sacct writes it, reduced to its name: "CANCELLED by 0" and "CANCELLED+" are
    CANCELLED."""
    words = state.strip().split()
    return words[0].rstrip("+").upper() if words else ""


def phase(state: str) -> str:
    """ "pending", "running", "final", or "unknown" (a state this tfrun does not know: no change)."""
    name = normal(state)
    if name in PENDING:
        return "pending"
    if name in RUNNING:
        return "running"
    if name in FINAL:
        return "final"
    return "unknown"


def exit_code(text: str) -> tuple[Optional[int], Optional[int]]:
    """sacct's ExitCode "CODE:SIGNAL" as (the code as a shell reports it, the signal or None)."""
    code, _, sig = text.partition(":")
    if not is_digits(code):
        return None, None
    if is_digits(sig) and int(sig):
        return 128 + int(sig), int(sig)
    return int(code), None


def end_of(
    state: Optional[str],
    record: Optional[ExitRecord],
    cancel_requested: bool,
    started_at: Optional[float] = None,
    slurm_exit: tuple[Optional[int], Optional[int]] = (None, None),
    ran: bool = True,
    why: str = "",
) -> Ended:
    """How a job ended: from Slurm's final `state` (None: Slurm no longer tells) and the shim's exit
    `record` (None: it left none), whether tfrun asked for its cancel, whether its shim ever ran (`ran`), and
    Slurm's reason (`why`, e.g. BadConstraints)."""
    name = normal(state) if state else ""
    now = time.time()
    if name in LOST:
        return Ended(JobState.LOST, exit_code=EXIT_LOST, started_at=started_at, finished_at=now, reason=LOST[name])
    if record is not None and record.get("stopped") and (name == "CANCELLED" or cancel_requested):
        by = None if cancel_requested else "cancelled in Slurm (scancel)"  # its SIGTERM was the cancel's
        return from_record(record, started_at)._replace(state=JobState.CANCELLED, reason=by)
    if record is not None:
        ended = from_record(record, started_at)
        if name in FAILED_STATES:
            failed_code = ended.exit_code or 1  # killed for it, whatever the shim saw
            cause = SLURM_CAUSES.get(name)
            return ended._replace(state=JobState.FAILED, exit_code=failed_code, reason=FAILED_STATES[name], cause=cause)
        return ended
    code, sig = slurm_exit
    if name == "CANCELLED" or cancel_requested:
        by = None if cancel_requested else "cancelled in Slurm (scancel)"
        return Ended(JobState.CANCELLED, exit_code=code, signal=sig, started_at=started_at, finished_at=now, reason=by)
    if name in FAILED_STATES:
        return Ended(JobState.FAILED, exit_code=code or 1, signal=sig, started_at=started_at, finished_at=now,
                     reason=FAILED_STATES[name], cause=SLURM_CAUSES.get(name))  # fmt: skip
    if not ran and name:  # Slurm took it, then could not run it: no restart would do better
        because = f" ({why})" if why and why != "None" else ""
        return Ended(JobState.FAILED, exit_code=code or 1, signal=sig, finished_at=now,
                     reason=f"Slurm could not run it: {name}{because}")  # fmt: skip
    what = f"Slurm says {name}" if name else "Slurm no longer knows it"
    return Ended(
        JobState.LOST if code is None else JobState.FAILED,
        exit_code=EXIT_LOST if code is None else code,
        signal=sig,
        started_at=started_at,
        finished_at=now,
        reason=f"its shim left no exit record; {what}",
    )


def from_record(record: ExitRecord, started_at: Optional[float]) -> Ended:
    """The end an exit record says, as LocalExecutor reads it: cancelled, succeeded (code 0) or failed."""
    recorded = record.get("exit_code")
    code = recorded if isinstance(recorded, int) else 255
    sig = record.get("signal")
    state = JobState.CANCELLED if record.get("cancelled") else JobState.SUCCEEDED if code == 0 else JobState.FAILED
    error = record.get("error")
    return Ended(
        state,
        exit_code=code,
        signal=sig if isinstance(sig, int) else None,
        started_at=started_at or record.get("started_at"),
        finished_at=record.get("finished_at"),
        reason=error if isinstance(error, str) else None,
    )
