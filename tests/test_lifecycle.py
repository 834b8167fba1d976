"""A job never ends without its truth: not when tfrund dies half way through recording its end, not when
its folder stops taking writes."""

from __future__ import annotations

import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
from harness import Tfrun, alive, disks, gated_job, wait_for, write_script

from tfrun.runner.faults import CRASH_AT_ENV, END_OF_JOB

FLAKY = """\
import os, sys, time
if os.path.exists({ran!r}):
    sys.exit(0)  # the restart
open({ran!r}, "w").close()
while not os.path.exists({gate!r}):
    time.sleep(0.05)
sys.exit(52)
"""


@pytest.mark.parametrize("point", END_OF_JOB)
def test_a_daemon_killed_anywhere_in_a_jobs_end_leaves_what_the_next_one_finishes(
    tf: Tfrun, project: Path, gate: Path, tmp_path: Path, point: str
) -> None:
    """The job fails with restarts left while a daemon that dies at `point` supervises it; the next daemon
    must leave the job failed with its own code and run exactly one restart."""
    write_script(project, "flaky.py", FLAKY.format(ran=str(tmp_path / "ran"), gate=str(gate)))
    job = tf.submit("--max-restarts", "1", "--restart-on", "error", str(project / "flaky.py"))
    tf.shim_pid(job)
    tf.kill_daemon()
    tf.env[CRASH_AT_ENV] = point  # only for the daemon that re-adopts the job and sees it end
    assert tf.daemon("start").returncode == 0
    crashing = tf.daemon_pid()
    del tf.env[CRASH_AT_ENV]
    gate.touch()
    wait_for(lambda: not alive(crashing), what=f"the daemon to kill itself at {point}")
    assert f"{CRASH_AT_ENV}={point}: killing myself here" in (tf.home / "tfrund.log").read_text()

    assert tf.run("wait", str(job)).returncode == 0, "wait follows the first job to its restart's end"
    jobs = tf.jobs()
    assert len(jobs) == 2, "exactly one restart"
    first, restart = tf.job(job), jobs[1]
    assert (first["state"], first["exit_code"], first["restarted_as"]) == ("failed", 52, restart["id"])
    assert (restart["state"], restart["exit_code"], restart["restart_of"]) == ("succeeded", 0, job)


def test_a_job_whose_folder_turns_read_only_still_ends_with_its_own_exit_code(
    tf: Tfrun, project: Path, gate: Path
) -> None:
    if os.geteuid() != 0:
        pytest.skip("needs root: the job folder is bind-mounted read-only (chmod does not stop root)")
    write_script(project, "job.py", gated_job(1, 1, 52, gate))
    job = tf.submit(str(project / "job.py"))
    tf.shim_pid(job)
    folder = str(tf.job_dir(job))
    bound = subprocess.run(["mount", "--bind", folder, folder], capture_output=True, text=True)
    if bound.returncode != 0:
        pytest.skip(f"cannot bind-mount here: {bound.stderr.strip()}")
    try:
        # The job's log stays writable: its descriptor was opened before, through the folder's own mount.
        subprocess.run(["mount", "-o", "remount,ro,bind", folder], check=True)
        gate.touch()
        result = tf.run("wait", str(job))
    finally:
        subprocess.run(["umount", "-l", folder], check=True)
    assert result.returncode == 52, result.stderr
    record = tf.job(job)
    assert (record["state"], record["exit_code"]) == ("failed", 52)
    assert record["reason"] == "job folder not writable: Read-only file system"
    assert b"after 0" in tf.log(job)
    assert not (tf.home / "run" / "exits" / f"{job}.json").exists(), "the spare record goes once recorded"


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[Path]:
    """A 32 MiB tmpfs: a disk that a test can fill."""
    with disks.small_disk(tmp_path / "disk") as folder:
        yield folder


def test_a_job_that_ends_on_a_full_disk_still_ends_with_its_own_exit_code(
    small_disk: Path, project: Path, gate: Path
) -> None:
    """The whole home is full, the database's disk too: the spare record was reserved while there was room."""
    tf = Tfrun(small_disk / "home")
    try:
        write_script(project, "job.py", gated_job(1, 0, 52, gate))
        job = tf.submit(str(project / "job.py"))
        wait_for(lambda: tf.log(job), what="the job to print its line while it can")
        spare = tf.home / "run" / "exits" / f"{job}.json"
        filler = disks.fill_up(small_disk)
        gate.touch()
        wait_for(lambda: spare.read_bytes().strip(), what="the shim to fill its spare exit record")
        filler.unlink()
        assert tf.run("wait", str(job)).returncode == 52
        record = tf.job(job)
        assert (record["state"], record["exit_code"]) == ("failed", 52)
        assert record["reason"] == "job folder not writable: No space left on device"
        assert not spare.exists()
    finally:
        tf.cleanup()
