"""A daemon whose home, lock file or socket is removed or replaced under it serves nobody any more (the next
verb starts another beside it): it stops within seconds, says why, and its jobs keep running."""

from __future__ import annotations

import os
import shutil
import subprocess
import time
from pathlib import Path
from typing import Callable

import pytest
from harness import TFRUND, Tfrun, alive, gated_job, wait_for, write_script

STOPS_WITHIN_S = 15.0  # the daemon looks every 2 s; a loaded machine may take longer to wake it


def foreground(tf: Tfrun) -> subprocess.Popen[str]:
    """`tfrund run` with its stderr on a pipe, once it serves its socket."""
    proc = subprocess.Popen([*TFRUND, "run"], env=tf.env, stderr=subprocess.PIPE, text=True)
    wait_for(lambda: (tf.home / "run" / "tfrund.sock").exists() or proc.poll() is not None, what="the socket")
    assert proc.poll() is None, proc.communicate()[1]
    return proc


def replace_socket(tf: Tfrun) -> None:
    """Another file where the socket was, as a second daemon's bind would leave it."""
    socket_path = tf.home / "run" / "tfrund.sock"
    socket_path.unlink()
    socket_path.write_text("not this daemon's\n")


@pytest.mark.parametrize(
    "remove, reason",
    [
        (lambda tf: shutil.rmtree(tf.home), "its home {home} was removed or replaced"),
        (lambda tf: (tf.home / "run" / "tfrund.lock").unlink(), "its lock file {home}/run/tfrund.lock was removed"),
        (replace_socket, "its socket {home}/run/tfrund.sock was removed or replaced"),
    ],
    ids=["home", "lock", "socket"],
)
def test_a_daemon_that_lost_its_home_stops_and_says_why_on_stderr(
    tf: Tfrun, remove: Callable[[Tfrun], object], reason: str
) -> None:
    proc = foreground(tf)
    remove(tf)
    started = time.monotonic()
    try:
        _, stderr = proc.communicate(timeout=STOPS_WITHIN_S)
    finally:
        proc.kill()
    assert proc.returncode == 0, stderr
    assert time.monotonic() - started < STOPS_WITHIN_S
    assert reason.format(home=tf.home) in stderr, stderr
    assert "its jobs keep running, and the next tfrun verb starts a daemon for the home" in stderr
    if remove is replace_socket:  # a later daemon's socket is never removed by this one
        assert (tf.home / "run" / "tfrund.sock").read_text() == "not this daemon's\n"


def test_a_daemon_whose_home_is_removed_stops_and_the_next_verb_starts_a_fresh_one(tf: Tfrun) -> None:
    """What the issue saw: `rm -rf` of the home left the old daemon running beside the next verb's."""
    tf.ok("ps")
    old = tf.daemon_pid()
    shutil.rmtree(tf.home)
    wait_for(lambda: not alive(old), timeout=STOPS_WITHIN_S, what="the daemon to stop")
    assert tf.ok("ps", "--json").strip() == "[]"
    assert tf.daemon_pid() != old


def test_a_running_job_outlives_a_daemon_whose_lock_was_removed(tf: Tfrun, project: Path, gate: Path) -> None:
    write_script(project, "train.py", gated_job(2, 2, 0, gate))
    job = tf.submit(str(project / "train.py"))
    wait_for(lambda: tf.job(job)["state"] == "running", what="the job to run")
    old = tf.daemon_pid()
    (tf.home / "run" / "tfrund.lock").unlink()
    wait_for(lambda: not alive(old), timeout=STOPS_WITHIN_S, what="the daemon to stop")
    log = (tf.home / "tfrund.log").read_text()
    assert f"tfrund (pid {old}) stops: its lock file {tf.home}/run/tfrund.lock was removed or replaced" in log
    assert tf.job(job)["state"] == "running"  # a new daemon, which adopted it
    assert tf.daemon_pid() != old
    gate.touch()
    assert tf.run("wait", str(job)).returncode == 0
    assert tf.log(job).count(b"after") == 2


def test_a_daemon_that_keeps_its_home_keeps_serving(tf: Tfrun) -> None:
    """The look costs three stats and stops nothing: the daemon of an untouched home stays."""
    tf.ok("ps")
    pid = tf.daemon_pid()
    time.sleep(5)
    assert alive(pid) and tf.daemon_pid() == pid
    assert "stops:" not in (tf.home / "tfrund.log").read_text()
    assert os.path.exists(tf.home / "run" / "tfrund.sock")
