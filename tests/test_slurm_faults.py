"""Faults on Slurm (issue 19): a job Slurm kills over its memory limit (a real kill, by jobacct_gather's
OverMemoryKill on a cluster of the module's own) gives an oom alert; `scontrol requeue` of a running job
keeps it the same tfrun job, counted, resumed from its checkpoint; a tfrund killed -9 mid-job learns the true
end at its restart; a log follower waits for a log that has stopped growing; --tty is refused at submit;
`tfrun doctor` (so `hosts check`) shows Slurm's own checks; and the whole through the real sshd."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from harness import TFRUN, Sshd, Tfrun, remote_client, wait_for, write_script
from harness.slurmcluster import SlurmCluster, slurm_fixture, slurm_id_of, use_cluster  # noqa: F401 (a fixture)
from harness.slurmconf import Unavailable

from tfrun.protocol.logs import LogChunk, LogEnd, ReadLog
from tfrun.protocol.wire import Message
from tfrun.runner.executors.executor import Ended, Requeued
from tfrun.runner.executors.slurm import states
from tfrun.runner.executors.slurm.checks import slurm_checks
from tfrun.runner.executors.slurm.commands import QueuedJob, Slurm, gpu_count
from tfrun.runner.executors.slurm.executor import MISSING_GRACE_S, SlurmExecutor
from tfrun.runner.executors.slurm.settings import SlurmSettings
from tfrun.runner.executors.slurm.watcher import LISTED_PER_S, POLL_INTERVAL_S, Watcher
from tfrun.runner.logs import logstream
from tfrun.runner.logs.loggrowth import LogGrowth
from tfrun.runner.records.job import JobRow, JobSpec
from tfrun.runner.records.oom import SLURM_OUT_OF_MEMORY

pytestmark = [pytest.mark.slow]


@pytest.fixture
def on_slurm(tf: Tfrun, slurm: SlurmCluster, tmp_path: Path) -> Tfrun:
    return use_cluster(tf, slurm, tmp_path / "checkpoints")


def _gated(project: Path, name: str, gate: Path, code: int) -> Path:
    """A job that prints, then waits for `gate` and exits with `code`."""
    text = f"import os, sys, time\nprint('{name} runs', flush=True)\nwhile not os.path.exists({str(gate)!r}):\n"
    return write_script(project, f"{name}.py", text + f"    time.sleep(0.1)\nsys.exit({code})\n")


# -- out of memory -----------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def memory_slurm(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SlurmCluster]:
    """A cluster of this module's own that kills a job over its --mem (no cgroups here: TaskPlugin=task/none,
    so jobacct_gather's OverMemoryKill, sampling each second); no accounting, which it does not need."""
    try:
        cluster = SlurmCluster(
            tmp_path_factory.mktemp("slurm-memory"), gpus_per_node=0, accounting=False, memory_mb=2000
        )
    except Unavailable as exc:
        pytest.skip(str(exc))
    yield cluster
    cluster.stop()


@pytest.mark.slurm
def test_slurm_killing_a_job_over_its_memory_gives_an_oom_alert(
    tf: Tfrun, memory_slurm: SlurmCluster, project: Path, tmp_path: Path
) -> None:
    use_cluster(tf, memory_slurm, tmp_path / "checkpoints", 'sbatch_options = ["--mem=100M"]\n')
    eat = "import time\nx = bytearray(400 << 20)\nx[::4096] = b'1' * len(x[::4096])\nprint('ate', flush=True)\n"
    write_script(project, "eat.py", eat + "time.sleep(60)\n")
    job = tf.submit("--gpus", "0", str(project / "eat.py"))
    began = time.monotonic()
    assert tf.run("wait", str(job), timeout=90).returncode == 137
    ended = tf.job(job)
    assert (ended["state"], ended["signal"], ended["reason"]) == ("failed", 9, SLURM_OUT_OF_MEMORY), ended
    assert ended["cause"] == "oom", "what --restart-on oom restarts"
    out = (tf.job_dir(job) / f"slurm-{job}.out").read_text()
    assert "exceeded memory limit" in out  # slurmstepd's own words: Slurm's state is only FAILED here

    def oom_alert() -> dict[str, object] | None:
        alerts = json.loads(tf.ok("alerts", "--json", str(job)))
        return next((a for a in alerts if a["rule"] == "oom"), None)

    alert = wait_for(oom_alert, timeout=30, what="the oom alert")
    assert "killed by Slurm over its memory limit" in str(alert["summary"]), alert
    print(f"memory kill: submit to the oom alert in {time.monotonic() - began:.1f}s", file=sys.stderr)


def test_out_of_memory_states_are_failed_out_of_memory() -> None:
    """Slurm's OUT_OF_MEMORY (task/cgroup) is the same end as the kill found in slurm-ID.out."""
    ended = states.end_of("OUT_OF_MEMORY", None, False, slurm_exit=(137, 9))
    assert (ended.state, ended.exit_code, ended.reason) == ("failed", 137, SLURM_OUT_OF_MEMORY)
    record = {"exit_code": 143, "signal": None, "started_at": 1.0, "cancelled": False, "stopped": True}
    cancelled = states.end_of("CANCELLED by 0", record, False)  # type: ignore[arg-type]
    assert (cancelled.state, cancelled.exit_code) == ("cancelled", 143)  # Slurm's SIGTERM was a scancel
    assert gpu_count("gpu:a100:4(S:0-1),gpu:v100:2") == 6 and gpu_count("(null)") == 0


# -- requeue -----------------------------------------------------------------------------------------------

CHECKPOINTED = """import os, pathlib, time
ck = pathlib.Path(os.environ["TFRUN_CHECKPOINT_DIR"]) / "step"
start = int(ck.read_text()) if ck.exists() else 0
print("resuming from", start, flush=True)
step = start
while not os.path.exists(GATE):
    step += 1
    tmp = ck.with_suffix(".tmp")
    tmp.write_text(str(step))
    os.replace(tmp, ck)
    time.sleep(0.1)
print("done at", step, flush=True)
"""


@pytest.mark.slurm
def test_a_requeued_job_stays_the_same_job_and_resumes_from_its_checkpoint(
    on_slurm: Tfrun, slurm: SlurmCluster, project: Path, tmp_path: Path
) -> None:
    tf, gate = on_slurm, tmp_path / "go"
    write_script(project, "train.py", f"GATE = {str(gate)!r}\n" + CHECKPOINTED)
    job = tf.submit("--gpus", "0", str(project / "train.py"))
    wait_for(lambda: tf.job(job)["state"] == "running", timeout=60, what="running")
    checkpoint = Path(tf.job(job)["checkpoint_dir"]) / "step"
    wait_for(lambda: checkpoint.exists() and int(checkpoint.read_text() or 0) >= 3, timeout=30, what="a checkpoint")
    requeued_at = time.monotonic()
    slurm.ok(["scontrol", "requeue", slurm_id_of(tf, job)])
    wait_for(lambda: "requeued by Slurm (1 time)" in (tf.job(job)["reason"] or ""), timeout=30, what="the requeue")
    assert tf.job(job)["state"] == "running"  # the same job, counted, not a new one

    def resumed() -> int | None:
        runs = [line for line in tf.log(job).decode().splitlines() if line.startswith("resuming from")]
        return int(runs[1].split()[-1]) if len(runs) > 1 else None

    assert wait_for(resumed, timeout=60, what="the second run") >= 3
    print(f"requeue: running again in {time.monotonic() - requeued_at:.1f}s", file=sys.stderr)
    assert "tfrun: Slurm requeued this job; it starts again (run 2)" in tf.log(job).decode()
    assert (tf.job_dir(job) / "exit.json.run-0").exists()  # the first run's, stopped by the requeue, set aside
    gate.touch()
    waited = tf.run("wait", str(job), timeout=60)
    ended = tf.job(job)
    assert waited.returncode == 0, (ended, tf.log(job).decode())
    assert ended["state"] == "succeeded" and ended["reason"].startswith("requeued by Slurm (1 time)"), ended
    assert ended["restarted_as"] is None and len(tf.jobs()) == 1


def test_a_job_held_in_slurms_queue_costs_no_file_read_at_a_poll(tmp_path: Path) -> None:
    """A thousand held jobs cost tfrund what none do: each one's slurm.json is read once and kept (this daemon
    alone writes it), and an answer that says a queued job still waits reads nothing of its folder (a start
    is told by the answer that says it runs). Shown with the folder moved away after the first look."""
    job_dir = tmp_path / "1"
    job_dir.mkdir()
    (job_dir / "slurm.json").write_text(json.dumps({"slurm_id": "7"}))
    (job_dir / "shim.json").write_text(json.dumps({"shim_pid": 1, "job_pid": 2, "started_at": 10.0}))
    spec = JobSpec(script="x.py", args=(), command=("python3", "x.py"), env={})
    row = JobRow(1, None, "queued", spec, str(job_dir), str(tmp_path), 0.0)
    executor = SlurmExecutor(SlurmSettings, tmp_path / "shimpath")
    assert executor.records.of(row.id, job_dir) == {"slurm_id": "7"}
    job_dir.rename(tmp_path / "elsewhere")
    held = {"7": QueuedJob("7", "PENDING", str(job_dir), reason="JobHeldUser")}
    record = executor.records.of(row.id, job_dir)
    assert record == {"slurm_id": "7"}
    assert executor._check(row, record, held, {}, asked_at=time.time()) == []
    executor.records.write(tmp_path / "elsewhere", {"slurm_id": "7", "kill_at": 1.0})
    assert json.loads((tmp_path / "elsewhere" / "slurm.json").read_text())["kill_at"] == 1.0
    executor.forget(row.id)
    assert executor.records.of(row.id, job_dir) == {}  # read again: the folder holds none now


@pytest.mark.slurm
def test_a_long_answer_from_squeue_is_asked_for_less_often(
    slurm: SlurmCluster, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Slurm is asked for at most LISTED_PER_S job lines a second: an answer that lists 600 held jobs is due again
    after 3 s, not 1 s, so that watching a queue of a thousand costs what a hundred do (squeue, slurmctld and the
    daemon each work by the line). Shown with the real squeue of an array of 600 held tasks."""
    for name in ("SLURM_CONF", "PATH"):
        monkeypatch.setenv(name, slurm.env[name])
    script = tmp_path / "held.sh"
    script.write_text("#!/bin/sh\nsleep 600\n")
    array = slurm.sbatch("--hold", "--array=0-599", f"--partition={slurm.partition}", "-o", "/dev/null", str(script))
    watcher = Watcher(Slurm())
    try:
        snapshot = watcher.now([f"{array}_0"])
        assert snapshot is not None and len([i for i in snapshot.queue if i.startswith(f"{array}_")]) == 600
        assert watcher._interval == len(snapshot.queue) / LISTED_PER_S > POLL_INTERVAL_S  # other tests' jobs too
    finally:
        slurm.ok(["scancel", str(array)])

    def short() -> bool:  # the cancelled tasks are listed until MinJobAge has passed (4 to 12 s here)
        snapshot = watcher.now([])
        return snapshot is not None and len(snapshot.queue) <= LISTED_PER_S

    wait_for(short, timeout=60, what="the cancelled tasks to leave squeue")
    assert watcher._interval == POLL_INTERVAL_S


def test_a_record_of_slurms_own_sigterm_waits_for_slurms_word(tmp_path: Path) -> None:
    """The killed run's exit record (Slurm's SIGTERM: `stopped`) never ends a job that Slurm holds again or
    still runs; a plain one ends a job Slurm no longer lists at once, a stopped one after MISSING_GRACE_S."""
    job_dir = tmp_path / "1"
    job_dir.mkdir()
    spec = JobSpec(script="x.py", args=(), command=("python3", "x.py"), env={})
    row = JobRow(1, None, "running", spec, str(job_dir), str(tmp_path), 0.0, started_at=1.0)
    shim = {"shim_pid": 1, "job_pid": 2, "started_at": 10.0, "slurm_restarts": 0}
    stopped = {
        "exit_code": 143,
        "signal": 15,
        "started_at": 10.0,
        "ended_at": 11.0,
        "cancelled": False,
        "stopped": True,
    }
    (job_dir / "shim.json").write_text(json.dumps(shim))
    (job_dir / "exit.json").write_text(json.dumps(stopped))
    (job_dir / "slurm.json").write_text(json.dumps({"slurm_id": "7"}))
    executor = SlurmExecutor(SlurmSettings, tmp_path / "shimpath")

    def check(state: str | None) -> list[object]:
        queue = {"7": QueuedJob("7", state, str(job_dir))} if state else {}
        return list(executor._check(row, executor.records.read(job_dir), queue, {}, asked_at=time.time()))

    assert check("PENDING") == [Requeued(1)] and check("PENDING") == []  # once per requeue
    assert check("RUNNING") == [] and check("COMPLETING") == []  # settled long ago, but Slurm has not said
    assert check(None) == []  # absent: a grace, as for a job without a record
    executor._missing_since[row.id] -= MISSING_GRACE_S + 1
    [ended] = check(None)
    assert isinstance(ended, Ended) and (ended.state, ended.exit_code) == ("failed", 143)
    (job_dir / "exit.json").write_text(json.dumps({**stopped, "stopped": False, "exit_code": 3}))
    [ended] = check(None)
    assert isinstance(ended, Ended) and (ended.state, ended.exit_code) == ("failed", 3)


# -- a daemon killed mid-job --------------------------------------------------------------------------------


@pytest.mark.slurm
def test_a_daemon_killed_mid_job_learns_the_true_ends(
    on_slurm: Tfrun, slurm: SlurmCluster, project: Path, tmp_path: Path
) -> None:
    """One job ends while no daemon runs (its exit code, read at the restart), one runs on (running, then its
    true end)."""
    tf = on_slurm
    gone, stays = tmp_path / "gone", tmp_path / "stays"
    early = tf.submit("--gpus", "0", str(_gated(project, "early", gone, 3)))
    late = tf.submit("--gpus", "0", str(_gated(project, "late", stays, 5)))
    wait_for(lambda: all(tf.job(job)["state"] == "running" for job in (early, late)), timeout=60, what="both to run")
    tf.kill_daemon()
    gone.touch()
    assert slurm.wait_final(int(slurm_id_of(tf, early))) == ("FAILED", "3:0")
    jobs = {j["id"]: j for j in tf.jobs()}  # the client starts a daemon, which reconciles before it answers
    assert (jobs[early]["state"], jobs[early]["exit_code"]) == ("failed", 3), jobs[early]
    assert jobs[late]["state"] == "running", jobs[late]
    stays.touch()
    assert tf.run("wait", str(late), timeout=60).returncode == 5
    assert b"late runs" in tf.log(late)


# -- log followers ------------------------------------------------------------------------------------------


def test_a_follower_waits_for_the_log_to_stop_growing_after_the_end(tmp_path: Path) -> None:
    """The job is final already, and its log still grows (a shared filesystem shows the last bytes late):
    with a settle time the follower gets them; without one it ends at the end it saw first."""
    (tmp_path / "output.log").write_bytes(b"first\n")
    spec = JobSpec(script="x.py", args=(), command=("python3", "x.py"), env={})
    row = JobRow(1, None, "succeeded", spec, str(tmp_path), str(tmp_path), 0.0, exit_code=0)

    async def follow(settle: float) -> bytes:
        got: list[Message] = []

        async def send(message: Message) -> None:
            got.append(message)

        async def late_bytes() -> None:
            await asyncio.sleep(0.3)
            with open(tmp_path / "output.log", "ab") as f:
                f.write(b"late\n")

        req = ReadLog(job="1", follow=True)
        chosen = await logstream.selection(req)
        writer = asyncio.create_task(late_bytes())
        growth = LogGrowth(asyncio.get_running_loop())
        try:
            await logstream.stream(req, chosen, row, lambda: row, growth, send, settle)
        finally:
            growth.stop()
            await writer
        assert isinstance(got[-1], LogEnd)
        return b"".join(m.data for m in got if isinstance(m, LogChunk))

    assert asyncio.run(follow(0.0)) == b"first\n"  # a local job's: its log can no longer grow
    (tmp_path / "output.log").write_bytes(b"first\n")
    assert asyncio.run(follow(1.0)) == b"first\nlate\n"


# -- what is refused, what is shown --------------------------------------------------------------------------


@pytest.mark.slurm
def test_tty_is_refused_at_submit_in_one_line(on_slurm: Tfrun, project: Path) -> None:
    write_script(project, "hello.py", "print('hello')\n")
    result = on_slurm.run("submit", "--tty", str(project / "hello.py"))
    assert result.returncode != 0 and "--tty: not on a Slurm host" in result.stderr, result.stderr
    assert len(result.stderr.strip().splitlines()) == 1 and on_slurm.jobs() == []


def _slurm_lines(checks: list[dict[str, str]]) -> dict[str, tuple[str, str]]:
    return {c["name"]: (c["status"], c["detail"]) for c in checks if c["name"].startswith("slurm")}


@pytest.mark.slurm
def test_doctor_shows_slurm(on_slurm: Tfrun, slurm: SlurmCluster) -> None:
    shown = _slurm_lines(json.loads(on_slurm.run("doctor", "--json", timeout=200).stdout))
    version = "{}.{:02d}.{}".format(*slurm.versions()["sbatch"])  # as sbatch --version writes it: 22.05.8
    assert shown["slurm"][0] == "ok" and version in shown["slurm"][1], shown
    assert shown["slurm partitions"] == ("ok", f"{slurm.partition} (default) up, 1 node"), shown
    assert shown["slurm gpus"] == ("ok", f"per node: {slurm.partition}: {slurm.gpus_per_node}"), shown
    assert shown["slurm accounting"][0] == "ok", shown


@pytest.mark.slurm
def test_doctor_names_what_is_wrong(slurm: SlurmCluster, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SLURM_CONF", slurm.env["SLURM_CONF"])
    monkeypatch.setenv("PATH", slurm.env["PATH"])
    wrong = {c.name: c for c in slurm_checks(Slurm(), SlurmSettings(partition="nosuch"))}
    assert wrong["slurm partitions"].status == "fail" and "'nosuch' is not one of them" in str(
        wrong["slurm partitions"].advice
    )
    monkeypatch.setenv("PATH", str(tmp_path))  # no sbatch here
    [missing] = slurm_checks(Slurm(), SlurmSettings())
    assert (missing.name, missing.status) == ("slurm", "fail") and "sbatch not found" in missing.detail


# -- over SSH -----------------------------------------------------------------------------------------------


@pytest.mark.ssh
@pytest.mark.slurm
def test_slurm_through_the_real_sshd(tf: Tfrun, slurm: SlurmCluster, sshd: Sshd, project: Path, tmp_path: Path) -> None:
    """The client on another machine, tfrund on the login node behind sshd: hosts check shows Slurm; submit,
    follow the log, wait for exit code 3, cancel with a grace."""
    use_cluster(tf, slurm, tmp_path / "checkpoints")
    remote_client(tf, sshd)
    config = tf.client_home / ".config" / "tfrun" / "config.toml"
    box_env = {"TFRUN_HOME": str(tf.home), "SLURM_CONF": slurm.env["SLURM_CONF"], "PATH": slurm.env["PATH"]}
    entries = ", ".join(f"{k} = {json.dumps(v)}" for k, v in box_env.items())
    text = config.read_text().replace(f"env = {{ TFRUN_HOME = {json.dumps(str(tf.home))} }}", f"env = {{ {entries} }}")
    assert text != config.read_text()
    config.write_text(text)
    check = tf.run("hosts", "check", "--json", "box", timeout=240)
    steps = [step["step"] for step in json.loads(check.stdout)]
    assert any(step.startswith("slurm partitions: debug (default) up") for step in steps), steps
    gate = tmp_path / "go"
    job = tf.submit("--gpus", "0", str(_gated(project, "three", gate, 3)))
    wait_for(lambda: b"three runs" in tf.log(job), timeout=60, what="its output over ssh")
    follower = subprocess.Popen([*TFRUN, "logs", "-f", str(job)], env=tf.env, stdout=subprocess.PIPE)
    gate.touch()
    followed, _ = follower.communicate(timeout=90)
    assert followed == b"three runs\n", followed
    assert tf.run("wait", str(job), timeout=60).returncode == 3
    loop = write_script(
        project, "loop.py", "import time\nprint('looping', flush=True)\nwhile True:\n    time.sleep(0.1)\n"
    )
    looping = tf.submit("--gpus", "0", str(loop))
    wait_for(lambda: tf.job(looping)["state"] == "running", timeout=60, what="running")
    began = time.monotonic()
    assert tf.run("cancel", "--grace", "2", str(looping), timeout=60).returncode == 0
    assert tf.job(looping)["state"] == "cancelled"
    print(f"over ssh: cancel --grace 2 took {time.monotonic() - began:.1f}s", file=sys.stderr)
