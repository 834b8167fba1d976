"""Restarts by cause (`submit --max-restarts N --restart-on CAUSES`, tfrun/restarts.py): a script's own error
runs once, what goes wrong around it (its shim lost, the OOM killer, a signal) runs it again, and `status`
says why each restart happened or why none did. Real daemons, shims and jobs; Slurm's states as the
executor maps them."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from harness import Tfrun, alive, gated_job, wait_for, write_script
from test_alerts import _memory_cgroup

from tfrun import restarts
from tfrun.protocol.fields import BadValue, JobState, checked_kwargs
from tfrun.protocol.submit import Submit
from tfrun.runner.executors.slurm import states
from tfrun.runner.records.job import JobSpec
from tfrun.runner.records.lifecycle import Lifecycle
from tfrun.runner.records.store import Store


def _status_line(tf: Tfrun, job: int, key: str) -> str:
    """One line of `tfrun status JOB`, its key and value as the user reads them."""
    lines = [line for line in tf.ok("status", str(job)).splitlines() if line.startswith(key + " ")]
    assert len(lines) == 1, f"no {key!r} line in status"
    return " ".join(lines[0].split())


@pytest.mark.parametrize(("options", "shown"), [(("--restart-on", "lost,oom"), "lost,oom"), ((), "lost,oom,signal")])
def test_a_script_that_raises_at_once_runs_once(tf: Tfrun, project: Path, options: tuple[str, ...], shown: str) -> None:
    """A bug (a KeyError at step 1) fails the same way every time: with restarts left and --restart-on
    without `error` (the default has none), it runs once, and status says why it was not run again."""
    write_script(project, "buggy.py", "print('step 1', flush=True)\n{}['lr']\n")
    job = tf.submit("--max-restarts", "3", *options, str(project / "buggy.py"))
    assert tf.run("wait", str(job)).returncode == 1
    assert len(tf.jobs()) == 1 and tf.log(job).count(b"step 1") == 1
    record = tf.job(job)
    assert (record["state"], record["cause"], record["restarted_as"], record["restarts_left"]) == (
        "failed",
        "error",
        None,
        3,
    )
    assert _status_line(tf, job, "restarted as") == (
        f"restarted as not restarted: it exited with code 1, and --restart-on is {shown}"
    )


def test_error_in_restart_on_runs_a_failing_script_again_and_status_counts_the_restarts(
    tf: Tfrun, project: Path
) -> None:
    write_script(project, "fails.py", "import sys\nprint('run', flush=True)\nsys.exit(3)\n")
    job = tf.submit("--max-restarts", "2", "--restart-on", "error", str(project / "fails.py"))
    assert tf.run("wait", str(job)).returncode == 3, "wait follows the chain to its last run"
    assert [j["id"] for j in tf.jobs()] == [job, job + 1, job + 2]
    assert [tf.job(j)["cause"] for j in (job, job + 1, job + 2)] == ["error"] * 3
    assert (
        _status_line(tf, job, "restarted as") == f"restarted as job {job + 1}: it exited with code 3 (restart 1 of 2)"
    )
    assert (
        _status_line(tf, job + 1, "restarted as")
        == f"restarted as job {job + 2}: it exited with code 3 (restart 2 of 2)"
    )
    assert _status_line(tf, job + 2, "restarted as") == "restarted as -", "no restarts left: nothing to explain"
    assert _status_line(tf, job, "restart on") == "restart on error"


def test_a_lost_job_is_restarted_after_kill_9_of_its_shim(tf: Tfrun, project: Path, gate: Path) -> None:
    """The shim gone without an exit record while the daemon watches: lost (its orphaned job is killed, which
    is no signal of the job's), and --restart-on lost runs it again."""
    write_script(project, "job.py", gated_job(1, 1, 0, gate))
    job = tf.submit("--max-restarts", "1", "--restart-on", "lost", str(project / "job.py"))
    shim = tf.shim_pid(job)
    wait_for(lambda: tf.job(job)["state"] == "running", what="the job to run")
    os.kill(shim, signal.SIGKILL)
    wait_for(lambda: not alive(shim), what="the shim to die")
    restart = wait_for(lambda: tf.job(job)["restarted_as"], what="the restart")
    record = tf.job(job)
    assert (record["state"], record["cause"]) == ("lost", "lost")
    gate.touch()
    assert tf.run("wait", str(job)).returncode == 0, "the restart ran to its end"
    assert tf.job(restart)["restart_of"] == job
    line = _status_line(tf, job, "restarted as")
    assert line.startswith(f"restarted as job {restart}: it was lost (") and line.endswith(") (restart 1 of 1)")


def test_a_kill_9_of_the_job_is_a_signal_which_restart_on_oom_does_not_restart(tf: Tfrun, project: Path) -> None:
    """A SIGKILL that was not the OOM killer's is no OOM: --restart-on oom leaves it failed, and says why."""
    write_script(project, "job.py", "import time\nprint('up', flush=True)\ntime.sleep(60)\n")
    job = tf.submit("--max-restarts", "1", "--restart-on", "oom", str(project / "job.py"))
    pid = wait_for(lambda: tf.job(job)["pid"], what="the job's pid")
    wait_for(lambda: b"up" in tf.log(job), what="its output")
    os.kill(pid, signal.SIGKILL)
    assert tf.run("wait", str(job)).returncode == 137
    assert (tf.job(job)["cause"], tf.job(job)["restarted_as"], len(tf.jobs())) == ("signal", None, 1)
    assert _status_line(tf, job, "restarted as") == (
        "restarted as not restarted: it was killed by SIGKILL (signal 9), and --restart-on is oom"
    )


@pytest.fixture
def memory_limited(tf: Tfrun, tmp_path: Path) -> Iterator[Tfrun]:
    """`tf` with its daemon (so its shims and jobs) in a memory cgroup of 200 MB, as test_alerts.py does."""
    group = _memory_cgroup(tmp_path)
    tf.prefix = ["sh", "-c", f'echo $$ > {group / "cgroup.procs"} && exec "$@"', "sh"]
    try:
        yield tf
    finally:
        tf.cleanup()
        tf.prefix = []
        wait_for(lambda: not (group / "cgroup.procs").read_text().strip(), what="the cgroup to empty")
        group.rmdir()


def test_a_job_the_oom_killer_killed_is_restarted_with_restart_on_oom(
    memory_limited: Tfrun, project: Path, tmp_path: Path
) -> None:
    tf = memory_limited
    ran = tmp_path / "ran"
    write_script(project, "hog.py", f"import os\nif not os.path.exists({str(ran)!r}):\n"
                 f"    open({str(ran)!r}, 'w').close()\n    blocks = []\n    while True:\n"
                 "        blocks.append(bytearray(16 << 20))\nprint('fits this time')\n")  # fmt: skip
    job = tf.submit("--max-restarts", "2", "--restart-on", "oom", str(project / "hog.py"))
    assert tf.run("wait", str(job)).returncode == 0, "the restart ran to its end"
    first = tf.job(job)
    assert (first["state"], first["signal"], first["cause"]) == ("failed", signal.SIGKILL, "oom")
    assert tf.log(first["restarted_as"]) == b"fits this time\n"
    assert _status_line(tf, job, "restarted as") == (
        f"restarted as job {first['restarted_as']}: it was OOM-killed (restart 1 of 2)"
    )


# -- the option, the request, the spec ---------------------------------------------------------------------


def test_an_unknown_cause_is_a_one_line_usage_error_naming_the_valid_ones(tf: Tfrun, project: Path) -> None:
    script = str(write_script(project, "x.py", "print('x')\n"))
    refused = tf.run("submit", "--max-restarts", "1", "--restart-on", "lost,reboot", script)
    assert refused.returncode == 2 and refused.stderr.count("\n") == 1, refused.stderr
    assert "unknown cause 'reboot': the causes are lost, oom, signal, error, all" in refused.stderr
    garbled = tf.run("submit", "--max-restarts", "1", "--restart-on", os.fsdecode(b"lost\xff"), script)
    assert garbled.returncode == 2 and "unknown cause 'lost\\xff'" in garbled.stderr, garbled.stderr
    alone = tf.run("submit", "--restart-on", "all", script)
    assert alone.returncode == 2 and "--restart-on goes with --max-restarts N" in alone.stderr
    assert not (tf.home / "jobs").exists() or not any((tf.home / "jobs").iterdir()), "nothing was submitted"


def test_the_api_takes_the_same_causes_and_refuses_an_unknown_one_before_sending(tf: Tfrun, project: Path) -> None:
    script = str(write_script(project, "x.py", "raise SystemExit(5)\n"))
    code = (
        "import sys, tfrun\nc = tfrun.Client()\n"
        "try:\n    c.submit(sys.argv[1], options=tfrun.JobOptions(max_restarts=1, restart_on=['oops']))\n"
        "except ValueError as e:\n    print('refused:', e)\n"
        "j = c.submit(sys.argv[1], options=tfrun.JobOptions(max_restarts=1, restart_on=['all'])).wait()\n"
        "print(j.state, j.restart_of, j.cause)\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", code, script], env=tf.env, capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines() == [
        "refused: unknown cause 'oops': the causes are lost, oom, signal, error, all",
        "failed 1 error",
    ]


def test_the_causes_parse_as_the_option_spells_them() -> None:
    assert restarts.parse("all") == ("lost", "oom", "signal", "error")
    assert restarts.parse(["error,lost", "Lost"]) == ("lost", "error")
    with pytest.raises(ValueError, match="name at least one cause"):
        restarts.parse(" , ")


def test_the_request_refuses_a_cause_it_does_not_know() -> None:
    base = {"files": [], "script": "x.py"}
    assert checked_kwargs(Submit, {**base, "restart_on": ["lost", "error"]})["restart_on"] == ["lost", "error"]
    with pytest.raises(BadValue, match="expected one of lost, oom, signal, error"):
        checked_kwargs(Submit, {**base, "restart_on": ["reboot"]})
    with pytest.raises(BadValue, match="more than 4 items"):
        checked_kwargs(Submit, {**base, "restart_on": ["lost"] * 5})


# -- Slurm: a node failure or preemption is lost -----------------------------------------------------------


@pytest.fixture
def lifecycle(tmp_path: Path) -> Iterator[Lifecycle]:
    store = Store(tmp_path / "tfrun.db")
    yield Lifecycle(store, tmp_path / "jobs", lambda: tmp_path / "checkpoints")
    store.close()


RECORD = {"exit_code": 143, "signal": 15, "stopped": True, "started_at": 1.0, "finished_at": 2.0}


@pytest.mark.parametrize(
    ("slurm_state", "record", "cause", "restarted"),
    [
        *((name, RECORD, "lost", True) for name in sorted(states.LOST)),  # node failure, preemption, boot failure
        ("OUT_OF_MEMORY", {**RECORD, "exit_code": 137, "signal": 9, "stopped": False}, "oom", True),
        ("OUT_OF_MEMORY", None, "oom", True),
        ("TIMEOUT", RECORD, "signal", True),  # killed by Slurm's SIGTERM at its time limit
        ("FAILED", {**RECORD, "exit_code": 1, "signal": None, "stopped": False}, "error", False),
    ],
)
def test_slurms_final_states_end_a_job_with_their_cause(
    lifecycle: Lifecycle, slurm_state: str, record: dict[str, object] | None, cause: str, restarted: bool
) -> None:
    """The Slurm executor's end of a job (runner/executors/slurm/states.py) through the lifecycle, under the default
    --restart-on: Slurm's NODE_FAIL, PREEMPTED and BOOT_FAIL are lost, and run again."""
    spec = JobSpec(script="x.py", args=(), command=("python3", "x.py"), env={}, max_restarts=1)
    row = lifecycle.start(lifecycle.create("j", spec), pid=None, shim_pid=None, shim_start=None, boot_id=None,
                          started_at=1.0)  # fmt: skip
    change = states.end_of(slurm_state, record, cancel_requested=False, started_at=1.0)  # type: ignore[arg-type]
    ended, restart = lifecycle.end(row, change.state, **change.values())
    assert (ended.cause, restart is not None) == (cause, restarted)
    assert ended.state == (JobState.LOST if cause == "lost" else JobState.FAILED)
