"""Test-only fault injection: TFRUN_TEST_CRASH_AT=<point> makes tfrund SIGKILL itself at that named point.

The tests kill the daemon between two steps of a job's lifecycle this way, to prove that the next daemon
finishes whatever the dead one began. Unset, as it always is outside the tests, a point costs one string
comparison.
"""

from __future__ import annotations

import logging
import os
import signal

CRASH_AT_ENV = "TFRUN_TEST_CRASH_AT"

# The end of a job that fails with a restart due, in the order it passes them.
END_OF_JOB = (
    "end-before-commit",  # the job's end and its restart are written, not committed
    "end-after-commit",  # committed; the restart's snapshot manifest is not written yet
    "prepare-manifest-written",  # the restart's manifest is written; its work dir is not built
    "prepare-built",  # its work dir is built and it is marked prepared; the scheduler has not taken it
    "start-scheduled",  # the scheduler gave it its GPUs; its spec is not written, no shim runs
    "start-spawned",  # its shim runs the job; the daemon has not recorded the start
)

# Every point.
POINTS = (
    *END_OF_JOB,
    "submit-accepted",  # a submitted job is recorded and started; its client has not been answered
    "array-recorded",  # Slurm: an array's launch records and its array.json are written; sbatch is not run
    "array-submitted",  # Slurm: sbatch took the array; its tasks' Slurm ids are not recorded
)

_CHOSEN = os.environ.get(CRASH_AT_ENV)


def crash_point(name: str) -> None:
    """Die here, as a crash or the OOM killer would, if the tests chose this point."""
    assert name in POINTS, f"unknown crash point {name!r}"
    if name == _CHOSEN:
        logging.getLogger("tfrund").warning("%s=%s: killing myself here", CRASH_AT_ENV, name)
        os.kill(os.getpid(), signal.SIGKILL)
