"""Submitting, following and waiting for jobs on the local daemon, through the real commands."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from harness import TFRUN, Tfrun, gated_job, wait_for, write_script

# Every verb, on the local daemon and on a daemon reached through a real sshd: the same results.
pytestmark = [
    pytest.mark.slow,
    pytest.mark.parametrize("tf", ["local", pytest.param("ssh", marks=pytest.mark.ssh)], indirect=True),
]


def test_submit_follow_exits_with_the_jobs_code_and_passes_arguments_untouched(tf: Tfrun, project: Path) -> None:
    write_script(project, "train.py", "import sys\nprint('args', sys.argv[1:])\nsys.exit(7)\n")
    result = tf.run("submit", "--follow", str(project / "train.py"), "--epochs", "3", "-x", "--", "a b")
    assert result.returncode == 7, result.stderr
    assert result.stdout == "args ['--epochs', '3', '-x', '--', 'a b']\n"
    assert "job 1 submitted" in result.stderr and "uploaded 1 of 1 files" in result.stderr


def test_a_job_sees_its_variables_and_a_checkpoint_folder_of_its_own(tf: Tfrun, project: Path) -> None:
    write_script(
        project,
        "env.py",
        "import json, os\n"
        "keys = ['PYTHONUNBUFFERED', 'TFRUN_JOB_ID', 'TFRUN_JOB_DIR', 'TFRUN_CHECKPOINT_DIR', 'MY_VAR', 'OTHER']\n"
        "print(json.dumps({k: os.environ.get(k) for k in keys}))\n"
        "print(os.path.isdir(os.environ['TFRUN_CHECKPOINT_DIR']))\n",
    )
    job_id = tf.submit("--env", "MY_VAR=a=b c", "--env", "OTHER=", str(project / "env.py"))
    assert tf.run("wait", str(job_id)).returncode == 0
    first, second = tf.log(job_id).decode().splitlines()
    seen = json.loads(first)
    record = tf.job(job_id)
    assert seen == {
        "PYTHONUNBUFFERED": "1",
        "TFRUN_JOB_ID": str(job_id),
        "TFRUN_JOB_DIR": record["job_dir"],
        "TFRUN_CHECKPOINT_DIR": record["checkpoint_dir"],
        "MY_VAR": "a=b c",
        "OTHER": "",
    }
    assert second == "True"
    assert record["env"] == {"MY_VAR": "a=b c", "OTHER": ""}


def test_later_edits_never_change_a_submitted_job(tf: Tfrun, project: Path, gate: Path) -> None:
    write_script(project, "data.txt", "original\n")
    write_script(
        project,
        "show.py",
        f"import os, time\nwhile not os.path.exists({str(gate)!r}): time.sleep(0.05)\n"
        "print(open('data.txt').read(), end='')\n",
    )
    job_id = tf.submit(str(project / "show.py"))
    (project / "data.txt").write_text("edited\n")
    (project / "show.py").write_text("print('edited script')\n")
    gate.touch()
    assert tf.run("wait", str(job_id)).returncode == 0
    assert tf.log(job_id) == b"original\n"


def test_a_script_that_is_not_python_is_executed_directly_from_a_chosen_workdir(tf: Tfrun, project: Path) -> None:
    sub = project / "scripts"
    sub.mkdir()
    write_script(
        sub,
        "run.sh",
        '#!/bin/sh\necho "cwd=$(basename $(pwd)) args=$*"\nls scripts\nexit 4\n',
        executable=True,
    )
    result = tf.run("submit", "-f", "--workdir", str(project), str(sub / "run.sh"), "one", "--two")
    assert result.returncode == 4, result.stderr
    assert result.stdout == "cwd=work args=one --two\nrun.sh\n"


def test_a_script_whose_name_starts_with_a_dash_runs_as_a_script_not_an_option(tf: Tfrun, project: Path) -> None:
    """`python3 -dash.py` is "Unknown option -d": the job runs `./-dash.py`, for Python and directly."""
    write_script(project, "-dash.py", "import sys\nprint('argv0', sys.argv[0], sys.argv[1:])\n")
    write_script(project, "-x.sh", '#!/bin/sh\necho "x.sh $0 $*"\n', executable=True)
    result = tf.run("submit", "-f", str(project / "-dash.py"), "-v")
    assert result.returncode == 0, result.stderr
    assert result.stdout == "argv0 ./-dash.py ['-v']\n"
    result = tf.run("submit", "-f", str(project / "-x.sh"), "-v")
    assert result.returncode == 0, result.stderr
    assert result.stdout == "x.sh ./-x.sh -v\n"


def test_jobs_are_found_by_name_and_the_newest_of_a_name_wins(tf: Tfrun, project: Path) -> None:
    write_script(project, "a.py", "print('first')\n")
    write_script(project, "b.py", "print('second')\n")
    first = tf.submit("--name", "exp", str(project / "a.py"))
    second = tf.submit("--name", "exp", str(project / "b.py"))
    assert second > first
    assert tf.run("wait", "exp").returncode == 0
    assert tf.job("exp")["id"] == second
    assert tf.log("exp") == b"second\n"
    assert {j["id"] for j in tf.jobs()} == {first, second}


def test_a_job_killed_by_a_signal_exits_like_a_shell_says(tf: Tfrun, project: Path) -> None:
    write_script(
        project,
        "die.py",
        "import os, signal\nprint('dying', flush=True)\nos.kill(os.getpid(), signal.SIGKILL)\n",
    )
    result = tf.run("submit", "-f", str(project / "die.py"))
    assert result.returncode == 128 + signal.SIGKILL
    record = tf.job(1)
    assert (record["state"], record["exit_code"], record["signal"]) == ("failed", 137, 9)
    assert tf.run("wait", str(record["id"])).returncode == 137


def test_logs_follow_prints_every_byte_in_order_as_it_comes(tf: Tfrun, project: Path, gate: Path) -> None:
    write_script(
        project,
        "out.py",
        "import os, sys, time\n"
        "sys.stdout.buffer.write(b'bin\\xff\\x00\\r50%\\r100%\\n')\n"
        "print('to stderr', file=sys.stderr)\n"
        f"while not os.path.exists({str(gate)!r}): time.sleep(0.05)\n"
        "print('tail', flush=True)\n",
    )
    job_id = tf.submit(str(project / "out.py"))
    follower = subprocess.Popen([*TFRUN, "logs", "-f", str(job_id)], env=tf.env, stdout=-1, stderr=-1)
    wait_for(lambda: b"to stderr" in tf.log(job_id), what="first output")
    gate.touch()
    out, err = follower.communicate(timeout=60)
    assert follower.returncode == 0, err
    assert out == b"bin\xff\x00\r50%\r100%\nto stderr\ntail\n"
    assert out == (Path(tf.job(job_id)["log_path"])).read_bytes()


def test_ps_shows_running_jobs_and_all_with_a(tf: Tfrun, project: Path, gate: Path) -> None:
    write_script(project, "quick.py", "print('done')\n")
    write_script(project, "slow.py", gated_job(1, 0, 0, gate))
    quick = tf.submit(str(project / "quick.py"))
    tf.ok("wait", str(quick))
    slow = tf.submit("--name", "[bold]slow", str(project / "slow.py"))
    table = tf.ok("ps")
    assert "[bold]slow" in table and "running" in table and "quick.py" not in table
    assert "quick.py" in tf.ok("ps", "-a")
    gate.touch()
    tf.ok("wait", str(slow))
    assert tf.ok("ps").startswith("no jobs on box (" if tf.remote else "no jobs on this machine\n")


def test_submit_json_prints_the_whole_record(tf: Tfrun, project: Path) -> None:
    write_script(project, "x.py", "pass\n")
    record = json.loads(tf.ok("submit", "--json", "--name", "rec", str(project / "x.py"), "arg"))
    assert record["name"] == "rec" and record["args"] == ["arg"] and record["script"] == "x.py"
    assert record["command"][1:] == ["x.py", "arg"]
    assert Path(record["workdir"], "x.py").exists()


def test_python_option_picks_the_interpreter(tf: Tfrun, project: Path) -> None:
    write_script(project, "which.py", "import sys\nprint(sys.executable)\n")
    job_id = tf.submit("--python", sys.executable, str(project / "which.py"))
    tf.ok("wait", str(job_id))
    assert tf.log(job_id).decode().strip() == sys.executable


def test_a_job_outlives_the_client_that_submitted_it(tf: Tfrun, project: Path, gate: Path) -> None:
    write_script(project, "long.py", gated_job(3, 2, 0, gate))
    follower = subprocess.Popen([*TFRUN, "submit", "-f", str(project / "long.py")], env=tf.env, stdout=-1, stderr=-1)
    job = wait_for(lambda: tf.jobs(), what="the job")[0]
    os.kill(follower.pid, signal.SIGKILL)
    follower.wait()
    gate.touch()
    assert tf.run("wait", str(job["id"])).returncode == 0
    assert tf.log(job["id"]).decode().count("after") == 2


COUNTING = (
    "import os\n"
    "path = os.path.join(os.environ['TFRUN_CHECKPOINT_DIR'], 'runs')\n"
    "runs = int(open(path).read()) + 1 if os.path.exists(path) else 1\n"
    "open(path, 'w').write(str(runs))\n"
    "print('run', runs, open('data.txt').read(), flush=True)\n"
)


def test_restart_runs_the_snapshot_again_with_the_same_checkpoint_folder(tf: Tfrun, project: Path, gate: Path) -> None:
    write_script(project, "count.py", COUNTING)
    (project / "data.txt").write_text("v1")
    first = tf.submit(str(project / "count.py"))
    tf.ok("wait", str(first))
    (project / "data.txt").write_text("v2")  # the user's files moved on; a restart runs what was submitted
    result = tf.run("restart", "-f", str(first))
    assert result.returncode == 0, result.stderr
    assert result.stdout == "run 2 v1\n"
    second = tf.job(first)["restarted_as"]
    record = tf.job(second)
    assert record["restart_of"] == first and record["checkpoint_dir"] == tf.job(first)["checkpoint_dir"]
    write_script(project, "slow.py", gated_job(1, 0, 0, gate))
    running = tf.submit(str(project / "slow.py"))
    refused = tf.run("restart", str(running))
    assert refused.returncode == 2 and "still running" in refused.stderr and "Traceback" not in refused.stderr
    gate.touch()
    tf.ok("wait", str(running))


def test_max_restarts_runs_a_failing_job_again_until_the_budget_is_spent(tf: Tfrun, project: Path) -> None:
    write_script(project, "flaky.py", COUNTING + "raise SystemExit(3)\n")
    (project / "data.txt").write_text("v1")
    followed = tf.run("submit", "-f", "--max-restarts", "2", "--restart-on", "error", str(project / "flaky.py"))
    assert followed.returncode == 3
    assert followed.stdout == "run 1 v1\nrun 2 v1\nrun 3 v1\n"
    assert followed.stderr.count("restarted as job") == 2
    chain = [tf.job(1), tf.job(2), tf.job(3)]
    assert [(j["restart_of"], j["restarted_as"], j["restarts_left"], j["exit_code"]) for j in chain] == [
        (None, 2, 2, 3), (1, 3, 1, 3), (2, None, 0, 3),
    ]  # fmt: skip
    assert tf.run("wait", "1").returncode == 3, "waiting for the first job waits for the last restart"


def test_a_cancelled_job_is_not_restarted(tf: Tfrun, project: Path, gate: Path) -> None:
    write_script(project, "slow.py", gated_job(1, 0, 0, gate))
    job = tf.submit("--max-restarts", "3", str(project / "slow.py"))
    wait_for(lambda: tf.job(job)["state"] == "running", what="the job to run")
    tf.ok("cancel", "--grace", "1", str(job))
    assert tf.job(job)["restarted_as"] is None and len(tf.jobs()) == 1


def test_jobs_get_metrics_file_and_gpu_memory_growth_unless_they_say_otherwise(tf: Tfrun, project: Path) -> None:
    names = ("TFRUN_METRICS_FILE", "TF_FORCE_GPU_ALLOW_GROWTH")
    write_script(project, "env.py", f"import os\nfor k in {names!r}: print(os.environ[k])\n")
    default = tf.submit(str(project / "env.py"))
    opted_out = tf.submit("--env", "TF_FORCE_GPU_ALLOW_GROWTH=false", str(project / "env.py"))
    tf.ok("wait", str(default))
    tf.ok("wait", str(opted_out))
    assert tf.log(default).decode().split() == [str(tf.job_dir(default) / "metrics.jsonl"), "true"]
    assert tf.log(opted_out).decode().split()[1] == "false"
