"""The Slurm executor (issue 19, first slice): its pure parts (state mapping, sbatch's options, the [slurm]
table), then a real tfrund with `executor = "slurm"` on the real single-node cluster (tests/harness/slurmcluster.py):
submit, wait and its exit code, logs, cancel, ps while pending and running, GPUs from Slurm."""

from __future__ import annotations

import json
import os
import shutil
import time
from pathlib import Path

import pytest
from harness import Tfrun, wait_for, write_script
from harness.slurmcluster import SlurmCluster, on_slurm_fixture, slurm_fixture, slurm_id_of  # noqa: F401 (fixtures)

from tfrun.constants import EXIT_LOST, SAFE_PATH
from tfrun.paths import Layout
from tfrun.protocol.fields import JobState
from tfrun.runner.config.settings import Config, ConfigError
from tfrun.runner.executors.slurm import states
from tfrun.runner.executors.slurm.batch import batch_script, launch_env, sbatch_args
from tfrun.runner.executors.slurm.commands import Features
from tfrun.runner.executors.slurm.settings import (
    SettingsError,
    SlurmSettings,
    job_options,
    nice,
    refused,
    slurm_time_limit,
)
from tfrun.runner.records.job import JobRow, JobSpec
from tfrun.runner.records.oom import SLURM_OUT_OF_MEMORY

pytestmark = [pytest.mark.slow]

# -- the state mapping ------------------------------------------------------------------------------------


def test_phases_of_slurm_states() -> None:
    assert states.phase("PENDING") == "pending" and states.phase("REQUEUED") == "pending"
    assert states.phase("RUNNING") == "running" and states.phase("COMPLETING") == "running"
    assert states.phase("CANCELLED by 0") == "final" and states.phase("OUT_OF_MEMORY") == "final"
    assert states.phase("SOMETHING_NEW") == "unknown"


def test_an_exit_record_is_exact_and_slurm_adds_what_the_shim_cannot_know() -> None:
    record = {"exit_code": 3, "signal": None, "started_at": 1.0, "finished_at": 2.0, "cancelled": False}
    failed = states.end_of("COMPLETED", record, cancel_requested=False)  # type: ignore[arg-type]
    assert (failed.state, failed.exit_code) == (JobState.FAILED, 3)
    ok = states.end_of("FAILED", {**record, "exit_code": 0}, False)  # type: ignore[arg-type]
    assert ok.state == JobState.SUCCEEDED
    cancelled = states.end_of("COMPLETED", {**record, "exit_code": 143, "cancelled": True}, True)  # type: ignore[arg-type]
    assert cancelled.state == JobState.CANCELLED
    oom = states.end_of("OUT_OF_MEMORY", {**record, "exit_code": 137}, False)  # type: ignore[arg-type]
    assert (oom.state, oom.exit_code, oom.reason) == (JobState.FAILED, 137, SLURM_OUT_OF_MEMORY)
    timeout = states.end_of("TIMEOUT", {**record, "exit_code": 0}, False)  # type: ignore[arg-type]
    assert timeout.state == JobState.FAILED and timeout.exit_code == 1 and "time limit" in str(timeout.reason)
    for lost in ("NODE_FAIL", "PREEMPTED"):
        ended = states.end_of(lost, record, False)  # type: ignore[arg-type]
        assert (ended.state, ended.exit_code) == (JobState.LOST, EXIT_LOST)


def test_without_an_exit_record_slurm_is_all_there_is() -> None:
    assert states.end_of("CANCELLED by 0", None, False).state == JobState.CANCELLED
    assert states.end_of("COMPLETED", None, True).state == JobState.CANCELLED  # tfrun asked
    oom = states.end_of("OUT_OF_MEMORY", None, False, slurm_exit=(None, None))
    assert (oom.state, oom.reason) == (JobState.FAILED, SLURM_OUT_OF_MEMORY)
    failed = states.end_of("FAILED", None, False, slurm_exit=states.exit_code("3:0"))
    assert (failed.state, failed.exit_code) == (JobState.FAILED, 3)
    gone = states.end_of(None, None, False)
    assert gone.state == JobState.LOST and "no longer knows" in str(gone.reason)
    assert states.exit_code("0:9") == (137, 9) and states.exit_code("") == (None, None)


# -- sbatch's options, the batch script, the [slurm] table ------------------------------------------------


def _row(tmp_path: Path, gpus: int = 0, **options: object) -> JobRow:
    spec = JobSpec(script="train.py", args=(), command=("python3", "train.py"), env={}, gpus=gpus, **options)  # type: ignore[arg-type]
    return JobRow(
        id=7,
        name=None,
        spec=spec,
        state=JobState.QUEUED,
        job_dir=str(tmp_path / "7"),
        checkpoint_dir="/c",
        created_at=0.0,
    )


def test_sbatch_options_put_tfruns_own_first_and_the_extras_last(tmp_path: Path) -> None:
    settings = SlurmSettings(partition="gpu", account="ml", time="60", sbatch_options=["--qos=high"])
    args = sbatch_args(_row(tmp_path, gpus=2), settings, grace=10.0)
    job_dir = tmp_path / "7"
    assert args[:6] == ["--parsable", "--job-name=tfrun-7", f"--output={job_dir}/slurm-7.out", "--open-mode=append",
                        f"--chdir={job_dir}", "--signal=B:TERM@15"]  # fmt: skip
    assert args[6:] == ["--gres=gpu:2", "--partition=gpu", "--account=ml", "--time=60", "--qos=high",
                        f"{job_dir}/slurm.sh"]  # fmt: skip
    assert not any(a.startswith("--gres") for a in sbatch_args(_row(tmp_path), SlurmSettings(), 10.0))
    script = batch_script(job_dir, tmp_path / "shimpath")
    assert (
        script.startswith("#!/bin/sh\n")
        and " ".join(["-S", *SAFE_PATH, "-m", "tfrun.runner.shim", "--batch", str(job_dir)]) in script
    )
    assert f"PYTHONPATH={tmp_path}/shimpath exec " in script  # the shim's own copy: `-S` runs no install's finder
    assert "exec " in script  # the shim is the batch script's process: scancel --batch reaches it


def test_a_jobs_own_slurm_options_win_over_the_configs(tmp_path: Path) -> None:
    settings = SlurmSettings(partition="gpu", time="60")
    row = _row(tmp_path, partition="debug", time_limit="5", nodes=1, priority=-7)
    args = sbatch_args(row, settings, grace=10.0)
    assert args[6:-1] == ["--nodes=1", "--nice=7", "--partition=debug", "--time=5"]
    assert not any(a.startswith("--nice") for a in sbatch_args(_row(tmp_path, priority=5), settings, 10.0))
    assert nice(-3) == 3 and nice(0) is None and nice(4) is None  # a negative nice needs a Slurm operator
    assert job_options("debug", "2h", 1) == ("debug", "120") and job_options(None, None, None) == (None, None)
    for bad in (
        ("a b", None, None),
        ("-x", None, None),
        ("gpu\n", None, None),  # a trailing newline would ride along into sbatch's argument
        ("²", None, None),
        (None, "60\n:", None),
        (None, "UNLIMITED", None),
        (None, "soon", None),
        (None, None, 0),
    ):
        with pytest.raises(SettingsError):
            job_options(*bad)


def test_the_allocations_variables_are_the_allocations() -> None:
    env = {"PATH": "/bin", "SLURM_JOB_ID": "1", "CUDA_VISIBLE_DEVICES": "0", "TFRUN_JOB_ID": "7"}
    assert launch_env(env) == {"PATH": "/bin", "TFRUN_JOB_ID": "7"}


def test_time_limits_are_finite() -> None:
    assert slurm_time_limit("4:00:00") == "4:00:00" and slurm_time_limit("1-12") == "1-12"
    assert slurm_time_limit("2h") == "120" and slurm_time_limit("90s") == "2"
    for never in ("UNLIMITED", "infinite", "0", "0:00:00", "soon"):
        assert slurm_time_limit(never) is None, never


def test_extra_options_may_not_touch_tfruns_own() -> None:
    for option in ("--output=x", "-o", "--out=x", "--job-name=a", "-Jx", "--signal=USR1@5", "--chdir=/",
                   "--time=UNLIMITED", "-t", "--partition=a", "--gres=gpu:1", "--array=1-3", "--wrap=x"):  # fmt: skip
        assert refused(option), option
    for option in ("--qos=high", "--constraint=a100", "--exclusive", "--mem=8G", "--nice=10"):
        assert refused(option) is None, option


def test_the_slurm_table_is_checked_at_load_naming_the_line(tmp_path: Path) -> None:
    layout = Layout(tmp_path)
    text = 'executor = "slurm"\n[slurm]\npartition = "gpu"\ntime = "2h"\nsbatch_options = ["--qos=a"]\n'
    config = Config.parse(text, layout)
    assert config.executor == "slurm" and config.slurm == SlurmSettings("gpu", None, "120", ["--qos=a"])
    assert Config.parse("", layout).executor == "local"
    bad = {
        'executor = "k8s"\n': "line 1: executor must be one of local, slurm",
        '[slurm]\n\nsbatch_options = ["-o/x"]\n': "line 3: [slurm] sbatch_options cannot hold '-o/x'",
        '[slurm]\ntime = "UNLIMITED"\n': "line 2: [slurm] time 'UNLIMITED' is not a time limit",
        '[slurm]\nqueue = "x"\n': "line 2: unknown key 'queue' in [slurm]",
    }
    for text, expected in bad.items():
        with pytest.raises(ConfigError, match=None) as caught:
            Config.parse(text, layout)
        assert expected in str(caught.value), (text, str(caught.value))


def test_features_by_version() -> None:
    features = Features.parse("slurm-wlm 22.05.8\n")
    assert features.version == (22, 5, 8) and features.supported and features.gpus_flag
    assert not Features.parse("slurm 17.02.1").supported


# -- on the real cluster ----------------------------------------------------------------------------------


@pytest.mark.slurm
def test_submit_wait_logs_and_exit_codes_on_slurm(on_slurm: Tfrun, slurm: SlurmCluster, project: Path) -> None:
    tf = on_slurm
    write_script(project, "hello.py", "import os\nprint('hello from', os.environ['SLURM_JOB_ID'], flush=True)\n")
    write_script(project, "three.py", "import sys\nprint('failing', flush=True)\nsys.exit(3)\n")
    ok = tf.submit(str(project / "hello.py"))
    three = tf.submit(str(project / "three.py"))
    assert tf.run("wait", str(ok), timeout=90).returncode == 0
    slurm_id = slurm_id_of(tf, ok)
    assert f"hello from {slurm_id}" in tf.log(ok).decode()
    assert tf.job(ok)["state"] == "succeeded"
    assert tf.run("wait", str(three), timeout=90).returncode == 3
    job = tf.job(three)
    assert (job["state"], job["exit_code"]) == ("failed", 3) and b"failing" in tf.log(three)
    assert (tf.job_dir(ok) / f"slurm-{ok}.out").exists()  # named by tfrun's id
    assert slurm.wait_final(int(slurm_id_of(tf, three)))[0] == "FAILED"  # the shim exits with the job's code


@pytest.mark.slurm
def test_gpu_jobs_get_distinct_devices_and_a_signal_is_an_exit_code(
    on_slurm: Tfrun, slurm: SlurmCluster, project: Path, tmp_path: Path
) -> None:
    """Two 1-GPU jobs at once each see one device of their own, as Slurm chose it (--gres=gpu:1); a job
    killed by a signal exits 128+N, as on a box."""
    tf = on_slurm
    gate = tmp_path / "both-running"
    shows = "import os, time\nprint('gpus', os.environ.get('CUDA_VISIBLE_DEVICES'), flush=True)\n"
    write_script(project, "gpu.py", shows + f"while not os.path.exists({str(gate)!r}):\n    time.sleep(0.1)\n")
    write_script(project, "killed.py", "import os, signal\nos.kill(os.getpid(), signal.SIGKILL)\n")
    jobs = [tf.submit("--gpus", "1", str(project / "gpu.py")) for _ in range(slurm.gpus_per_node)]
    wait_for(lambda: all(b"gpus" in tf.log(job) for job in jobs), timeout=60, what="both GPU jobs to run")
    devices = [tf.log(job).decode().split()[1] for job in jobs]
    assert sorted(devices) == [str(i) for i in range(slurm.gpus_per_node)], devices
    gate.touch()
    killed = tf.submit(str(project / "killed.py"))
    assert tf.run("wait", str(killed), timeout=90).returncode == 137
    ended = tf.job(killed)
    assert (ended["state"], ended["exit_code"], ended["signal"]) == ("failed", 137, 9), ended
    for job in jobs:
        assert tf.run("wait", str(job), timeout=90).returncode == 0


@pytest.mark.slurm
def test_ps_shows_pending_then_running_and_cancel_ends_it_cancelled(
    on_slurm: Tfrun,
    slurm: SlurmCluster,
    project: Path,
    tmp_path: Path,
) -> None:
    tf = on_slurm
    gate = tmp_path / "go"
    wait = f"import os, time\nwhile not os.path.exists({str(gate)!r}):\n    time.sleep(0.1)\n"
    write_script(project, "wait.py", wait)
    write_script(project, "loop.py", "import time\nprint('looping', flush=True)\nwhile True:\n    time.sleep(0.1)\n")
    # Both fake GPUs for the first job: the second waits in Slurm's queue (pending), queued in tfrun.
    first = tf.submit("--gpus", str(slurm.gpus_per_node), str(project / "wait.py"))
    second = tf.submit("--gpus", "1", str(project / "loop.py"))
    wait_for(lambda: tf.job(first)["state"] == "running", timeout=60, what="the first job to run")
    assert slurm.squeue_state(int(slurm_id_of(tf, second))) == "PENDING"
    assert tf.job(second)["state"] == "queued"
    assert "gpus           1 asked, none given yet" in tf.ok("status", str(second))
    assert f"gpus           {slurm.gpus_per_node}, chosen by the cluster on its node" in tf.ok("status", str(first))
    states_shown = {j["id"]: j["state"] for j in tf.jobs()}
    assert states_shown[first] == "running" and states_shown[second] == "queued"
    gate.touch()
    assert tf.run("wait", str(first), timeout=90).returncode == 0
    wait_for(lambda: b"looping" in tf.log(second), timeout=60, what="the second job to run")
    wait_for(lambda: tf.job(second)["state"] == "running", timeout=30, what="running")
    assert "CUDA_VISIBLE_DEVICES" not in json.loads((tf.job_dir(second) / "spec.json").read_text())["env"]
    result = tf.run("cancel", "--grace", "2", str(second), timeout=60)
    assert result.returncode == 0, result.stderr
    job = wait_for(lambda: (j := tf.job(second))["state"] != "running" and j, timeout=30, what="the cancel")
    assert job["state"] == "cancelled", job


@pytest.mark.slurm
def test_a_job_slurm_cannot_run_fails_saying_why(on_slurm: Tfrun, slurm: SlurmCluster, project: Path) -> None:
    tf = on_slurm
    write_script(project, "never.py", "print('never')\n")
    job = tf.submit("--gpus", str(slurm.gpus_per_node + 1), str(project / "never.py"))  # more than the node has
    assert tf.run("wait", str(job), timeout=60).returncode != 0
    ended = tf.job(job)
    assert ended["state"] == "failed" and "Slurm could not run it: FAILED" in ended["reason"], ended


@pytest.mark.slurm
def test_cancel_of_a_pending_job_ends_it_at_once(
    on_slurm: Tfrun, slurm: SlurmCluster, project: Path, tmp_path: Path
) -> None:
    tf = on_slurm
    gate = tmp_path / "go"
    write_script(
        project, "hold.py", f"import os, time\nwhile not os.path.exists({str(gate)!r}):\n    time.sleep(0.1)\n"
    )
    write_script(project, "never.py", "print('never')\n")
    holder = tf.submit("--gpus", str(slurm.gpus_per_node), str(project / "hold.py"))
    job = tf.submit("--gpus", "1", str(project / "never.py"))
    slurm_id = int(slurm_id_of(tf, job))
    wait_for(lambda: slurm.squeue_state(slurm_id) == "PENDING", timeout=30, what="pending")
    assert tf.run("cancel", str(job), timeout=30).returncode == 0
    ended = tf.job(job)
    assert ended["state"] == "cancelled" and ended["reason"] == "cancelled before it started", ended
    wait_for(lambda: slurm.squeue_state(slurm_id) in (None, "CANCELLED"), timeout=30, what="scancel")
    gate.touch()
    assert tf.run("wait", str(holder), timeout=60).returncode == 0
    assert tf.log(job) == b""


@pytest.mark.slurm
def test_ps_answers_while_squeue_hangs(on_slurm: Tfrun, slurm: SlurmCluster, project: Path, tmp_path: Path) -> None:
    """squeue runs off the event loop: a hung one (a fake squeue that sleeps first) never stalls the daemon."""
    tf = on_slurm
    fake, hang, hung = tmp_path / "fakebin", tmp_path / "hang", tmp_path / "hung"
    fake.mkdir()
    real = shutil.which("squeue", path=slurm.env["PATH"])
    (fake / "squeue").write_text(f'#!/bin/sh\nif [ -e {hang} ]; then touch {hung}; sleep 8; fi\nexec {real} "$@"\n')
    (fake / "squeue").chmod(0o755)
    tf.env["PATH"] = f"{fake}:{tf.env['PATH']}"
    write_script(project, "loop.py", "import time\nprint('looping', flush=True)\nwhile True:\n    time.sleep(0.1)\n")
    job = tf.submit("--gpus", "0", str(project / "loop.py"))
    wait_for(lambda: tf.job(job)["state"] == "running", timeout=60, what="running")
    hang.touch()
    wait_for(hung.exists, timeout=30, what="a hung squeue")
    for _ in range(2):
        began = time.monotonic()
        result = tf.run("ps", timeout=30)
        assert result.returncode == 0 and time.monotonic() - began < 2.5, (time.monotonic() - began, result)
        assert tf.job(job)["state"] == "running"  # no answer is no change
    os.unlink(hang)
    assert tf.run("cancel", "--grace", "1", str(job), timeout=60).returncode == 0


@pytest.mark.slurm
def test_partition_and_time_reach_sbatch(on_slurm: Tfrun, slurm: SlurmCluster, project: Path) -> None:
    tf = on_slurm
    write_script(project, "hello.py", "print('hello')\n")
    job = tf.submit("--partition", slurm.partition, "--time", "5", "--gpus", "0", str(project / "hello.py"))
    assert tf.run("wait", str(job), timeout=90).returncode == 0
    slurm_id = slurm_id_of(tf, job)
    fields = f"sacct -X -n -P -j {slurm_id} --format=Partition,Timelimit"
    shown = wait_for(lambda: (out := slurm.ok(fields).strip()).strip("|") and out, timeout=30, what="sacct's record")
    assert shown == f"{slurm.partition}|00:05:00", shown
    bad = tf.submit("--partition", "nosuchpartition", "--gpus", "0", str(project / "hello.py"))
    assert tf.run("wait", str(bad), timeout=60).returncode != 0
    ended = tf.job(bad)
    assert ended["state"] == "failed" and "Invalid partition name" in ended["reason"], ended
    refused_nodes = tf.run("submit", "--nodes", "1000", str(project / "hello.py"))
    assert refused_nodes.returncode != 0 and "--nodes 1000: from 1 to" in refused_nodes.stderr
    assert len(refused_nodes.stderr.strip().splitlines()) == 1, refused_nodes.stderr
    refused_time = tf.run("submit", "--time", "UNLIMITED", str(project / "hello.py"))
    assert refused_time.returncode != 0 and "not a time limit" in refused_time.stderr


def test_slurm_options_are_refused_on_a_local_daemon(tf: Tfrun, project: Path) -> None:
    write_script(project, "hello.py", "print('hello')\n")
    for option in (["--partition", "x"], ["--time", "5"]):
        result = tf.run("submit", *option, str(project / "hello.py"))
        assert result.returncode != 0 and "only on a Slurm host" in result.stderr, result.stderr
        assert len(result.stderr.strip().splitlines()) == 1, result.stderr
    assert tf.jobs() == []
