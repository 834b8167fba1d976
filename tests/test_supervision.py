"""A job outlives its daemon: kill -9 tfrund, restart it, and every job is accounted for truthfully."""

from __future__ import annotations

import os
import signal
import socket
import sqlite3
import subprocess
import threading
import time
from pathlib import Path

import pytest
from harness import (
    TFRUN,
    TFRUND,
    Tfrun,
    alive,
    connected,
    gated_job,
    kill_and_await_successor,
    local_and_ssh,
    own_sockets,
    serving_daemon,
    wait_for,
    write_script,
)

pytestmark = [pytest.mark.slow]


def test_kill_9_of_the_daemon_with_five_jobs_running_loses_nothing(tf: Tfrun, project: Path, gate: Path) -> None:
    codes = [0, 1, 2, 7, 42]
    ids = []
    for code in codes:
        write_script(project, f"job{code}.py", gated_job(200, 300, code, gate))
        ids.append(tf.submit(str(project / f"job{code}.py")))
    wait_for(lambda: all(tf.log(i).count(b"before") == 200 for i in ids), what="jobs to reach the gate")
    shims = [tf.shim_pid(i) for i in ids]

    tf.kill_daemon()
    assert all(alive(pid) for pid in shims), "jobs must survive their daemon"

    tf.daemon("start")
    assert [j["state"] for j in tf.jobs()] == ["running"] * 5, "a restarted daemon re-adopts running jobs"
    gate.touch()
    for job_id, code in zip(ids, codes):
        assert tf.run("wait", str(job_id)).returncode == code
        record = tf.job(job_id)
        assert (record["state"], record["exit_code"]) == ("succeeded" if code == 0 else "failed", code)
        lines = tf.log(job_id).decode().splitlines()
        assert lines == [f"before {i} {'x' * 50}" for i in range(200)] + [f"after {i} {'y' * 50}" for i in range(300)]
    log = (tf.home / "tfrund.log").read_text()
    assert log.count("re-adopted") == 5


def test_a_job_that_ends_while_the_daemon_is_down_is_recorded_at_the_next_start(
    tf: Tfrun, project: Path, gate: Path
) -> None:
    write_script(project, "job.py", gated_job(1, 1, 5, gate))
    job_id = tf.submit(str(project / "job.py"))
    tf.shim_pid(job_id)
    tf.kill_daemon()
    gate.touch()
    wait_for(lambda: (tf.job_dir(job_id) / "exit.json").exists(), what="the job to end")
    record = tf.job(job_id)  # starts a new daemon on demand
    assert (record["state"], record["exit_code"], record["signal"]) == ("failed", 5, None)
    assert record["finished_at"] < time.time() and record["finished_at"] >= record["started_at"]


def test_a_job_whose_shim_is_killed_is_lost_and_stopped(tf: Tfrun, project: Path) -> None:
    write_script(project, "forever.py", "import time\nprint('up', flush=True)\ntime.sleep(600)\n")
    job_id = tf.submit(str(project / "forever.py"))
    shim = tf.shim_pid(job_id)
    job_pid = tf.job(job_id)["pid"]
    os.kill(shim, signal.SIGKILL)
    result = tf.run("wait", str(job_id))
    assert result.returncode == 255
    record = tf.job(job_id)
    assert record["state"] == "lost" and "shim" in record["reason"]
    wait_for(lambda: not alive(job_pid), what="the unsupervised job to be stopped")


def test_records_from_before_a_reboot_are_lost_even_if_the_pid_is_alive(tf: Tfrun, project: Path) -> None:
    write_script(project, "forever.py", "import time\ntime.sleep(600)\n")
    job_id = tf.submit(str(project / "forever.py"))
    tf.shim_pid(job_id)
    tf.daemon("stop")
    # What a reboot changes: the boot id. The pid and start time still match a live process here.
    with sqlite3.connect(tf.home / "tfrun.db") as db:
        db.execute("UPDATE jobs SET boot_id='an-earlier-boot' WHERE id=?", (job_id,))
    record = tf.job(job_id)
    assert record["state"] == "lost" and "rebooted" in record["reason"]
    assert tf.run("wait", str(job_id)).returncode == 255


CANCEL_JOB = """\
#!/bin/bash
pids={pids}
echo $$ >> $pids
bash -c 'trap "" TERM; echo $$ >> '$pids'; while true; do sleep 0.1; done' &
sleep 1000 &
echo $! >> $pids
setsid bash -c 'trap "" TERM; echo $$ >> '$pids'; sleep 1000' &
echo started
wait
"""


@local_and_ssh
def test_cancel_leaves_no_process_of_the_job_alive(tf: Tfrun, project: Path, tmp_path: Path) -> None:
    pids_file = tmp_path / "pids"
    write_script(project, "tree.sh", CANCEL_JOB.format(pids=pids_file), executable=True)
    job_id = tf.submit(str(project / "tree.sh"))
    wait_for(lambda: pids_file.exists() and len(pids_file.read_text().split()) == 4, what="the process tree")
    pids = [int(p) for p in pids_file.read_text().split()]
    assert all(alive(p) for p in pids)

    started = time.monotonic()
    result = tf.run("cancel", "--grace", "1", str(job_id))
    assert result.returncode == 0, result.stderr
    assert time.monotonic() - started >= 1.0, "SIGTERM-ignoring processes get the whole grace period"
    assert [p for p in pids if alive(p)] == []
    record = tf.job(job_id)
    assert record["state"] == "cancelled" and record["exit_code"] == 128 + signal.SIGTERM
    assert "cancelled" in result.stdout
    assert tf.run("wait", str(job_id)).returncode == 128 + signal.SIGTERM


def test_cancel_survives_a_daemon_restart_in_the_middle(tf: Tfrun, project: Path, tmp_path: Path) -> None:
    """The shim owns the grace timer: killing the daemon mid-cancel does not stop the SIGKILL."""
    marker = tmp_path / "term"
    write_script(
        project,
        "stubborn.py",
        f"import signal, time\nsignal.signal(signal.SIGTERM, lambda *a: open({str(marker)!r}, 'w').close())\n"
        "print('up', flush=True)\nwhile True: time.sleep(0.1)\n",
    )
    job_id = tf.submit(str(project / "stubborn.py"))
    wait_for(lambda: tf.log(job_id) == b"up\n", what="the job to start")
    job_pid = tf.job(job_id)["pid"]
    canceller = subprocess.Popen([*TFRUN, "cancel", "--grace", "2", str(job_id)], env=tf.env)
    wait_for(marker.exists, what="SIGTERM to reach the job")
    tf.kill_daemon()
    canceller.kill()
    wait_for(lambda: not alive(job_pid), timeout=10, what="SIGKILL after the grace period")
    record = tf.job(job_id)
    assert (record["state"], record["exit_code"]) == ("cancelled", 128 + signal.SIGKILL)


@local_and_ssh
def test_cancel_of_an_ended_or_unknown_job_says_so(tf: Tfrun, project: Path) -> None:
    write_script(project, "ok.py", "pass\n")
    job_id = tf.submit(str(project / "ok.py"))
    tf.ok("wait", str(job_id))
    result = tf.run("cancel", str(job_id))
    assert result.returncode == 1 and "already ended (succeeded)" in result.stderr
    result = tf.run("cancel", "4242")
    assert result.returncode == 3 and "no job '4242'" in result.stderr


def test_stopping_the_daemon_leaves_jobs_running(tf: Tfrun, project: Path, gate: Path) -> None:
    write_script(project, "job.py", gated_job(1, 1, 0, gate))
    job_id = tf.submit(str(project / "job.py"))
    shim = tf.shim_pid(job_id)
    result = tf.daemon("stop")
    assert result.returncode == 0 and "1 running job(s) keep running" in result.stdout
    assert tf.daemon("status").returncode == 1
    assert alive(shim)
    gate.touch()
    assert tf.run("wait", str(job_id)).returncode == 0


def test_wait_and_logs_follow_carry_on_through_a_daemon_crash(tf: Tfrun, project: Path, gate: Path) -> None:
    """Followers resume at the byte they reached: no gap and no duplicate, compared byte for byte."""
    write_script(
        project,
        "chatty.py",
        "import hashlib, os, time\n"
        "i = 0\n"
        f"while not os.path.exists({str(gate)!r}) or i < 3000:\n"
        "    print(i, hashlib.sha256(str(i).encode()).hexdigest(), flush=True)\n"
        "    i += 1\n"
        "    time.sleep(0.001)\n"
        "raise SystemExit(3)\n",
    )
    job_id = tf.submit(str(project / "chatty.py"))
    follower = subprocess.Popen([*TFRUN, "logs", "-f", str(job_id)], env=tf.env, stdout=-1, stderr=-1)
    waiter = subprocess.Popen([*TFRUN, "wait", str(job_id)], env=tf.env, stdout=-1, stderr=-1)
    wait_for(lambda: tf.log(job_id).count(b"\n") > 500, what="output to flow")
    first = tf.daemon_pid()
    tf.kill_daemon()
    # The reconnecting clients start a new daemon by themselves; kill that one as well.
    wait_for(lambda: tf.daemon("status").returncode == 0 and tf.daemon_pid() != first, what="a new daemon")
    tf.kill_daemon()
    gate.touch()
    out, err = follower.communicate(timeout=120)
    assert follower.returncode == 3, err
    assert waiter.wait(timeout=60) == 3
    full = (tf.job_dir(job_id) / "output.log").read_bytes()
    assert out == full
    lines = full.decode().splitlines()
    assert [int(line.split()[0]) for line in lines] == list(range(len(lines)))


def test_processes_a_job_leaves_behind_are_stopped_when_it_ends(tf: Tfrun, project: Path, tmp_path: Path) -> None:
    """The job is its whole process tree: background children do not outlive it, and its code is the main one's."""
    pids_file = tmp_path / "pids"
    write_script(
        project,
        "leaves.sh",
        f"#!/bin/bash\nsleep 1000 &\necho $! >> {pids_file}\nsetsid sleep 1000 &\necho $! >> {pids_file}\nexit 6\n",
        executable=True,
    )
    job_id = tf.submit(str(project / "leaves.sh"))
    assert tf.run("wait", str(job_id)).returncode == 6
    pids = [int(p) for p in pids_file.read_text().split()]
    assert len(pids) == 2 and not any(alive(p) for p in pids)


def test_a_job_lost_while_the_daemon_was_down_is_restarted_when_it_comes_back(
    tf: Tfrun, project: Path, gate: Path
) -> None:
    write_script(project, "again.py", gated_job(1, 1, 0, gate))
    job = tf.submit("--max-restarts", "1", str(project / "again.py"))
    shim = tf.shim_pid(job)
    tf.kill_daemon()
    os.kill(shim, signal.SIGKILL)  # nobody is left to record how the job ends: it is lost
    wait_for(lambda: not alive(shim), what="the shim to die")
    gate.touch()
    first = tf.job(job)  # starts a daemon, which reconciles: lost, and a restart is due
    assert first["state"] == "lost" and first["restarted_as"] is not None
    assert tf.run("wait", str(job)).returncode == 0, "the restart ran to the end"
    assert tf.job(first["restarted_as"])["restart_of"] == job


def test_a_follower_and_a_waiter_carry_on_through_a_dozen_daemon_crashes(tf: Tfrun, project: Path, gate: Path) -> None:
    """Reconnects are not counted: for as long as the job lives and a daemon comes back, they carry on."""
    write_script(project, "job.py", gated_job(20, 20, 7, gate))
    job_id = tf.submit(str(project / "job.py"))
    idle = own_sockets(tf.home)
    follower = subprocess.Popen([*TFRUN, "logs", "-f", str(job_id)], env=tf.env, stdout=-1, stderr=-1)
    waiter = subprocess.Popen([*TFRUN, "wait", str(job_id)], env=tf.env, stdout=-1, stderr=-1)
    pid = wait_for(lambda: serving_daemon(tf.home))
    wait_for(lambda: connected(pid, idle + 2), what="both clients to connect")
    for _ in range(12):
        kill_and_await_successor(tf.home, clients=lambda: 2, idle_sockets=idle)
    gate.touch()
    out, err = follower.communicate(timeout=60)
    assert follower.returncode == 7, err
    assert out == (tf.job_dir(job_id) / "output.log").read_bytes()
    assert waiter.wait(timeout=60) == 7


def dies_in_the_hello(path: Path) -> threading.Thread:
    """A listener at the daemon's socket path that takes one connection and hangs up before answering the
    hello, then is gone: a daemon killed the moment a client reached it (SIGKILL leaves the socket file)."""
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(str(path))
    listener.listen()

    def once() -> None:
        conn, _ = listener.accept()
        conn.recv(1)  # the client's hello has begun to arrive
        listener.close()
        conn.close()

    thread = threading.Thread(target=once, daemon=True)
    thread.start()
    return thread


@pytest.mark.parametrize("verb", ["wait", "status"])
def test_a_client_that_reaches_a_daemon_dying_in_the_hello_starts_the_next_one(
    tf: Tfrun, project: Path, gate: Path, verb: str
) -> None:
    """`wait` (asyncio) and `status` (the plain socket of a running daemon) alike: the next daemon answers."""
    write_script(project, "job.py", gated_job(1, 1, 4, gate))
    job_id = tf.submit(str(project / "job.py"))
    tf.kill_daemon()
    socket_path = tf.home / "run" / "tfrund.sock"
    socket_path.unlink()
    dying = dies_in_the_hello(socket_path)
    gate.touch()
    result = tf.run(verb, str(job_id))
    dying.join(timeout=5)
    assert not dying.is_alive(), "the client never reached the dying daemon"
    assert serving_daemon(tf.home) is not None, result.stderr
    if verb == "wait":
        assert result.returncode == 4, result.stderr
    else:
        assert result.returncode == 0 and result.stdout.split()[:2] == ["id", str(job_id)], result.stderr


@pytest.mark.parametrize("setting", ["env", "config"])
def test_a_waiter_gives_up_once_no_daemon_answered_for_the_reconnect_timeout(
    tf: Tfrun, project: Path, gate: Path, setting: str
) -> None:
    """Not before, whatever the count of reconnects; and it says so in one line. The job runs on."""
    write_script(project, "job.py", gated_job(1, 1, 5, gate))
    job_id = tf.submit(str(project / "job.py"))
    if setting == "env":
        tf.env["TFRUN_RECONNECT_TIMEOUT"] = "3s"
    else:
        config = tf.client_home / ".config" / "tfrun" / "config.toml"
        config.parent.mkdir(parents=True, exist_ok=True)
        config.write_text('reconnect_timeout = "3s"\n')
    idle = own_sockets(tf.home)
    clients = [subprocess.Popen([*TFRUN, *verb, str(job_id)], env=tf.env, stdout=-1, stderr=-1, text=True)
               for verb in (["wait"], ["logs", "-f"])]  # fmt: skip
    wait_for(lambda: connected(serving_daemon(tf.home) or 0, idle + 2), what="both clients to connect")
    (tf.home / "config.toml").write_text("not toml [\n")  # no daemon can start any more
    shim = tf.shim_pid(job_id)
    tf.kill_daemon()
    lost_at = time.monotonic()
    for client in clients:
        _, err = client.communicate(timeout=60)
        assert client.returncode == 125, err
        assert err.count("\n") == 1 and "no tfrund answered for 3s" in err and "config.toml" in err, err
    assert 3 <= time.monotonic() - lost_at < 15
    assert alive(shim), "the job runs on"
    (tf.home / "config.toml").unlink()
    gate.touch()
    assert tf.run("wait", str(job_id)).returncode == 5


def test_a_reconnect_timeout_that_is_not_a_duration_is_refused_at_once(tf: Tfrun) -> None:
    tf.env["TFRUN_RECONNECT_TIMEOUT"] = "soon"
    result = tf.run("wait", "1")
    assert result.returncode == 2 and "TFRUN_RECONNECT_TIMEOUT must be a duration" in result.stderr, result.stderr


@pytest.mark.parametrize("crash", ["submit-accepted", "prepare-manifest-written"])
def test_a_submit_whose_daemon_dies_before_answering_runs_once_and_prints_its_id(
    tf: Tfrun, project: Path, tmp_path: Path, crash: str
) -> None:
    """The client sends the same submit (its submission id) to the next daemon, which answers with the job the
    first one made, or, where that one died before building it, makes it in its place. The first try goes over
    the plain socket (the daemon is up), the next through the API (client/library/submission.py's send_here)."""
    runs = tmp_path / "runs"
    write_script(project, "once.py", f"open({str(runs)!r}, 'a').write('ran\\n')\n")
    subprocess.run([*TFRUND, "start"], env={**tf.env, "TFRUN_TEST_CRASH_AT": crash}, check=True, timeout=60)
    first = wait_for(lambda: serving_daemon(tf.home))
    result = tf.run("submit", str(project / "once.py"))  # the next daemon it starts dies nowhere
    assert result.returncode == 0, result.stderr
    assert not alive(first) and f"{crash}: killing myself" in (tf.home / "tfrund.log").read_text()
    job_id = int(result.stdout)
    assert [job["id"] for job in tf.jobs()] == [job_id]
    assert tf.run("wait", str(job_id)).returncode == 0
    assert runs.read_text() == "ran\n"


def test_a_job_whose_shim_exited_is_due_once_in_a_look(tmp_path: Path) -> None:
    """A shim followed by a pidfd that exits makes its job due; the job must be named once, not also as one
    no pidfd follows (its shim is gone): two ends of one job in one look was a move from succeeded to
    succeeded, a traceback in the daemon's log."""
    import asyncio

    from tfrun.paths import Layout
    from tfrun.protocol.fields import JobState
    from tfrun.runner.executors.local import LocalExecutor
    from tfrun.runner.records.job import JobRow, JobSpec
    from tfrun.runner.shim.process import boot_id, start_ticks

    shim = subprocess.Popen(["sleep", "30"])
    start = start_ticks(shim.pid)
    assert start is not None
    spec = JobSpec(script="x.py", args=(), command=("true",), env={})
    row = JobRow(1, None, JobState.RUNNING, spec, str(tmp_path), str(tmp_path), time.time(),
                 shim_pid=shim.pid, shim_start=start, boot_id=boot_id())  # fmt: skip

    async def looks() -> tuple[list[int], list[int]]:
        executor = LocalExecutor(Layout(tmp_path / "home"), [])
        executor._swept_at = time.monotonic()  # no sweep due: only what the pidfd tells
        followed = [r.id for r in executor.due([row])]
        shim.kill()
        shim.wait()
        await executor.wait(10)
        return followed, [r.id for r in executor.due([row])]

    followed, after_exit = asyncio.run(looks())
    assert followed == []  # followed by its pidfd: nothing to look at while it runs
    assert after_exit == [1]
