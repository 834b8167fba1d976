"""Multi-node jobs on Slurm (issue 19): `submit --nodes N` runs one task a node, each with a TF_CONFIG built from
the step's SLURM_* variables and its reserved ports (runner/shim/slurmtask.py), so MultiWorkerMirroredStrategy
trains across them; tfrun.jobs writes metrics and checkpoints on the chief alone.

First the pure parts (Slurm's notations, TF_CONFIG, sbatch's options, the chief), then a real tfrund with
`executor = "slurm"` on a real two-node cluster (tests/harness/slurmcluster.py, `nodes=2`: two slurmds on this machine):
a tf-keras job trained by two workers that end with the same weights, a failing task, a cancel, task 1's output
through `logs --task 1`, `pull` and the API, and the failed alert quoting the task that failed."""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import pytest
from harness import Receiver, Tfrun, no_internet, wait_for, write_script
from harness.slurmcluster import SlurmCluster, use_cluster
from harness.slurmconf import Unavailable

from tfrun.constants import MAX_NODES
from tfrun.jobs import cluster
from tfrun.protocol.fields import JobState
from tfrun.runner.executors.slurm.batch import launch_record, sbatch_args
from tfrun.runner.executors.slurm.settings import SettingsError, SlurmSettings, job_options
from tfrun.runner.records.job import JobRow, JobSpec
from tfrun.runner.shim import slurmtask as task

if TYPE_CHECKING:
    from tfrun.runner.shim.jobdir import LaunchRecord

# -- Slurm's notations and TF_CONFIG --------------------------------------------------------------------------


def test_host_lists_expand_as_slurm_writes_them() -> None:
    assert task.expand_hostlist("node[1-3,7]") == ["node1", "node2", "node3", "node7"]
    assert task.expand_hostlist("gpu[08-10],login") == ["gpu08", "gpu09", "gpu10", "login"]
    assert task.expand_hostlist("r[1-2]n[1-2]") == ["r1n1", "r1n2", "r2n1", "r2n2"]
    assert task.expand_hostlist("a,b") == ["a", "b"] and task.expand_hostlist("solo") == ["solo"]
    with pytest.raises(task.TaskError):
        task.expand_hostlist("node[1-]")


def test_counts_and_ports_expand() -> None:
    assert task.expand_counts("2(x3),1") == [2, 2, 2, 1] and task.expand_counts("1(x2)") == [1, 1]
    assert task.expand_ports("12000-12002,12010") == [12000, 12001, 12002, 12010]
    assert task.expand_ports("34434") == [34434]
    for bad in ("x", "2(3)"):
        with pytest.raises(task.TaskError):
            task.expand_counts(bad)
    with pytest.raises(task.TaskError):
        task.expand_ports("12000-")


def test_tf_config_names_every_task_at_its_own_port() -> None:
    hosts = task.task_nodes(["n1", "n2"], [2, 1])
    assert hosts == ["n1", "n1", "n2"]
    config = task.tf_config(["10.0.0.1", "10.0.0.1", "fe80::2"], [5000, 5001, 5002], 2)
    assert config == {
        "cluster": {"worker": ["10.0.0.1:5000", "10.0.0.1:5001", "[fe80::2]:5002"]},
        "task": {"type": "worker", "index": 2},
    }
    with pytest.raises(task.TaskError, match="1 reserved port"):
        task.tf_config(["a", "b"], [5000], 0)
    with pytest.raises(task.TaskError):
        task.task_nodes(["n1", "n2"], [1])


def test_a_tasks_environment_comes_from_the_steps_variables() -> None:
    step = {
        "SLURM_STEP_NODELIST": "nosuchnode[1-2]",
        "SLURM_STEP_TASKS_PER_NODE": "1(x2)",
        "SLURM_STEP_RESV_PORTS": "23272-23273",
        "SLURM_PROCID": "1",
        "PATH": "/nonexistent",  # no scontrol: each node keeps its name
        "CUDA_VISIBLE_DEVICES": "3",
    }
    env = task.task_env(step)
    assert json.loads(env["TF_CONFIG"]) == {
        "cluster": {"worker": ["nosuchnode1:23272", "nosuchnode2:23273"]},
        "task": {"type": "worker", "index": 1},
    }
    assert (env["TFRUN_TASK_INDEX"], env["TFRUN_NUM_TASKS"], env["CUDA_VISIBLE_DEVICES"]) == ("1", "2", "3")
    with pytest.raises(task.TaskError, match="SLURM_STEP_RESV_PORTS is not set"):
        task.task_env({k: v for k, v in step.items() if k != "SLURM_STEP_RESV_PORTS"})
    with pytest.raises(task.TaskError, match="task 2 of a step of 2"):
        task.task_env({**step, "SLURM_PROCID": "2"})


def test_the_first_task_to_fail_gives_the_jobs_code(tmp_path: Path) -> None:
    (tmp_path / "task-0.json").write_text(json.dumps({"exit_code": 143, "ended_at": 20.0}))  # killed by srun after
    (tmp_path / "task-1.json").write_text(json.dumps({"exit_code": 3, "ended_at": 10.0}))
    (tmp_path / "task-2.json").write_text("{")  # torn: ignored
    assert task.first_failure(str(tmp_path), 3) == 3 and task.first_failed_task(str(tmp_path), 3) == 1
    (tmp_path / "task-1.json").write_text(json.dumps({"exit_code": 0, "ended_at": 10.0}))
    assert task.first_failure(str(tmp_path), 3) == 143
    assert task.first_failure(str(tmp_path / "none"), 3) is None


def test_the_chief_is_worker_0_unless_a_chief_is_named(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("TF_CONFIG", raising=False)
    assert cluster.is_chief() and cluster.num_workers() == 1 and cluster.task_index() == 0
    workers = {"worker": ["a:1", "b:2"]}
    monkeypatch.setenv("TF_CONFIG", json.dumps({"cluster": workers, "task": {"type": "worker", "index": 1}}))
    assert not cluster.is_chief() and cluster.num_workers() == 2 and cluster.task_index() == 1
    monkeypatch.setenv("TF_CONFIG", json.dumps({"cluster": workers, "task": {"type": "worker", "index": 0}}))
    assert cluster.is_chief()
    named = {**workers, "chief": ["c:3"]}
    monkeypatch.setenv("TF_CONFIG", json.dumps({"cluster": named, "task": {"type": "worker", "index": 0}}))
    assert not cluster.is_chief() and cluster.num_workers() == 3
    monkeypatch.setenv("TF_CONFIG", json.dumps({"cluster": named, "task": {"type": "chief", "index": 0}}))
    assert cluster.is_chief()


def test_only_the_chief_writes_the_jobs_metrics(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from tfrun.jobs.metrics import MetricWriter

    metrics = tmp_path / "metrics.jsonl"
    monkeypatch.setenv("TFRUN_METRICS_FILE", str(metrics))
    for index in (1, 0):
        worker = {"cluster": {"worker": ["a:1", "b:2"]}, "task": {"type": "worker", "index": index}}
        monkeypatch.setenv("TF_CONFIG", json.dumps(worker))
        writer = MetricWriter()
        writer.write(1, loss=0.5 + index)
        writer.close()
    assert [json.loads(line)["loss"] for line in metrics.read_text().splitlines()] == [0.5]


def test_sbatch_asks_for_one_task_a_node(tmp_path: Path) -> None:
    spec = JobSpec(script="t.py", args=(), command=("python3", "t.py"), env={}, gpus=1, nodes=2)
    row = JobRow(id=7, name=None, spec=spec, state=JobState.QUEUED, job_dir=str(tmp_path), checkpoint_dir="/c",
                 created_at=0.0)  # fmt: skip
    args = sbatch_args(row, SlurmSettings(), 10.0)
    assert args[6:9] == ["--gres=gpu:1", "--nodes=2", "--ntasks-per-node=1"]
    launch: LaunchRecord = {"command": ["python3", "t.py"], "cwd": "/w", "env": {}}
    task.across_nodes(launch, "/py", 2, "/home/shimpath/tfrun/runner/shim/slurmtask.py")
    command = launch["command"]
    assert command[:2] == ["/py", "-S"] and command[3:] == ["launch", "2", "--", "python3", "t.py"]
    assert command[2] == "/home/shimpath/tfrun/runner/shim/slurmtask.py" and launch["term_leader_only"]
    record = launch_record(row, {}, 10.0, tmp_path / "shimpath")  # the daemon's copy, whose path outlives upgrades
    assert record["command"][2] == str(tmp_path / "shimpath" / "tfrun" / "runner" / "shim" / "slurmtask.py")
    assert job_options(None, None, 2) == (None, None)
    for bad in (0, MAX_NODES + 1):
        with pytest.raises(SettingsError, match="--nodes"):
            job_options(None, None, bad)


# -- on a real two-node cluster -----------------------------------------------------------------------------


@pytest.fixture(scope="module")
def two_nodes(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SlurmCluster]:
    """A cluster of two nodes, node1 and node2, each with 2 fake GPUs; no accounting (tfrun's exit records and
    squeue tell how the jobs end, and it starts faster)."""
    try:
        cluster = SlurmCluster(tmp_path_factory.mktemp("slurm2"), accounting=False, nodes=2)
    except Unavailable as exc:
        pytest.skip(str(exc))
    try:
        yield cluster
    finally:
        cluster.stop()
        shutil.rmtree(cluster.folder, ignore_errors=True)


@pytest.fixture
def on_two_nodes(tf: Tfrun, two_nodes: SlurmCluster) -> Tfrun:
    """A tfrund (started on demand by the client) that submits to the two-node cluster."""
    return use_cluster(tf, two_nodes)


# Two workers train one model under MultiWorkerMirroredStrategy (from tfrun.jobs.setup_gpus), with tfrun.jobs'
# callback and checkpoints; each prints its TF_CONFIG and a digest of its final weights.
TRAIN = """\
import hashlib, json, os
import numpy as np
import tensorflow as tf
from tfrun.jobs import Checkpoints, TfrunCallback, is_chief, setup_gpus

strategy = setup_gpus()
print("task", os.environ["TFRUN_TASK_INDEX"], "of", os.environ["TFRUN_NUM_TASKS"], "config",
      os.environ["TF_CONFIG"], flush=True)
rng = np.random.default_rng(int(os.environ["TFRUN_TASK_INDEX"]))  # different data on each worker
x = rng.normal(size=(128, 4)).astype("float32")
y = (x.sum(axis=1, keepdims=True) > 0).astype("float32")
with strategy.scope():
    model = tf.keras.Sequential([tf.keras.layers.Input((4,)), tf.keras.layers.Dense(8, activation="relu"),
                                 tf.keras.layers.Dense(1)])
    model.compile(optimizer=tf.keras.optimizers.SGD(0.1), loss="mse")
    checkpoints = Checkpoints(model=model, optimizer=model.optimizer)
options = tf.data.Options()
options.experimental_distribute.auto_shard_policy = tf.data.experimental.AutoShardPolicy.OFF
data = tf.data.Dataset.from_tensor_slices((x, y)).repeat().batch(16).with_options(options)
model.fit(data, epochs=2, steps_per_epoch=3, callbacks=[TfrunCallback(checkpoints)], verbose=0)
digest = hashlib.sha256(b"".join(w.tobytes() for w in model.get_weights())).hexdigest()
print("digest", digest, "chief", is_chief(), flush=True)
"""


def _has_tf_keras() -> bool:
    return all(importlib.util.find_spec(name) is not None for name in ("tensorflow", "tf_keras"))


def _line(text: str, word: str) -> str:
    """The one line of `text` that starts with `word`."""
    found = [line for line in text.splitlines() if line.startswith(word + " ")]
    assert len(found) == 1, (word, text)
    return found[0]


@pytest.mark.slow  # more than 10 s
@pytest.mark.slurm
@pytest.mark.tensorflow
@pytest.mark.skipif(not _has_tf_keras(), reason="needs tf-keras (.ci/run: pip install --no-deps tf-keras)")
def test_two_workers_on_two_nodes_end_with_the_same_weights(on_two_nodes: Tfrun, project: Path) -> None:
    tf = on_two_nodes
    write_script(project, "train.py", TRAIN)
    job = tf.submit("--nodes", "2", "--gpus", "1", "--env", "TF_USE_LEGACY_KERAS=1", "--python", sys.executable,
                    str(project / "train.py"))  # fmt: skip
    result = tf.run("wait", str(job), timeout=240)
    chief_log = tf.log(job).decode()
    other_log = (tf.job_dir(job) / "task-1.log").read_text()
    assert result.returncode == 0, (chief_log, other_log)
    assert tf.job(job)["state"] == "succeeded"
    chief, other = _line(chief_log, "digest").split(), _line(other_log, "digest").split()  # one in each log
    assert chief[1] == other[1] and (chief[3], other[3]) == ("True", "False")
    configs = [json.loads(_line(log, "task").split(" config ", 1)[1]) for log in (chief_log, other_log)]
    workers = configs[0]["cluster"]["worker"]
    assert configs[1]["cluster"]["worker"] == workers and len(workers) == 2
    assert len({address.rsplit(":", 1)[1] for address in workers}) == 2  # a port each
    assert [c["task"]["index"] for c in configs] == [0, 1]
    assert "MultiWorkerMirroredStrategy over 2 workers" in chief_log
    steps = [json.loads(line)["step"] for line in (tf.job_dir(job) / "metrics.jsonl").read_text().splitlines()]
    assert steps == [1, 2, 3, 4, 5, 6]  # the chief's alone
    saved = sorted(p.name for p in Path(tf.job(job)["checkpoint_dir"]).glob("ckpt-*.index"))
    assert saved == ["ckpt-3.index", "ckpt-6.index"]


@pytest.mark.slurm
def test_a_failing_task_fails_the_job_with_its_code(on_two_nodes: Tfrun, project: Path) -> None:
    tf = on_two_nodes
    write_script(
        project,
        "fail.py",
        "import os, sys, time\nif os.environ['TFRUN_TASK_INDEX'] == '1':\n    print('failing', flush=True)\n"
        "    sys.exit(3)\ntime.sleep(60)\n",
    )
    job = tf.submit("--nodes", "2", "--gpus", "0", str(project / "fail.py"))
    began = time.monotonic()
    assert tf.run("wait", str(job), timeout=90).returncode == 3
    assert time.monotonic() - began < 45  # task 0 was stopped, not waited for
    ended = tf.job(job)
    assert (ended["state"], ended["exit_code"]) == ("failed", 3), ended
    assert "failing" in (tf.job_dir(job) / "task-1.log").read_text()


@pytest.mark.slurm
def test_cancel_gives_every_task_its_grace(on_two_nodes: Tfrun, project: Path) -> None:
    """Each task's command gets the SIGTERM and has the grace to stop (srun itself would SIGKILL them all)."""
    tf = on_two_nodes
    write_script(project, "loop.py", LOOP)
    job = tf.submit("--nodes", "2", "--gpus", "0", str(project / "loop.py"))
    wait_for(lambda: b"looping" in tf.log(job), timeout=60, what="task 0 to run")
    task_log = tf.job_dir(job) / "task-1.log"
    wait_for(lambda: task_log.exists() and "looping" in task_log.read_text(), timeout=30, what="task 1 to run")
    assert tf.run("cancel", "--grace", "5", str(job), timeout=60).returncode == 0
    ended = wait_for(lambda: (j := tf.job(job))["state"] != "running" and j, timeout=60, what="the cancel")
    assert ended["state"] == "cancelled", ended
    assert "stopping 0" in tf.log(job).decode() and "stopping 1" in task_log.read_text()
    records = [json.loads((tf.job_dir(job) / f"task-{i}.json").read_text()) for i in (0, 1)]
    assert [r["exit_code"] for r in records] == [5, 5]  # each handler ran to its end, within the grace


LOOP = """\
import os, signal, sys, time

def stop(*_):
    print("stopping", os.environ["TFRUN_TASK_INDEX"], flush=True)
    time.sleep(0.5)
    sys.exit(5)

signal.signal(signal.SIGTERM, stop)
print("looping", flush=True)
while True:
    time.sleep(0.1)
"""


# Each task prints three numbered lines a second apart (task 1's go to task-1.log), then a line of its own.
TALK = """\
import os, sys, time
me = os.environ["TFRUN_TASK_INDEX"]
for line in range(1, 4):
    print(f"task {me} line {line}", flush=True)
    time.sleep(1)
print(f"task {me} done", flush=True)
"""


@pytest.mark.slurm
def test_logs_task_1_is_the_output_of_task_1(on_two_nodes: Tfrun, project: Path, tmp_path: Path) -> None:
    """`logs --task 1` (followed while it runs, filtered, its tail) shows task 1's task-I.log, `pull` copies it,
    the API reads it; a task the job does not have, or times on a task's log, are one line each."""
    tf = on_two_nodes
    write_script(project, "talk.py", TALK)
    job = str(tf.submit("--nodes", "2", "--gpus", "0", str(project / "talk.py")))
    followed = tf.run("logs", "-f", "--task", "1", job, timeout=120)  # from before it starts to its end
    assert followed.returncode == 0, followed.stderr
    task_1 = [f"task 1 line {n}" for n in (1, 2, 3)] + ["task 1 done"]
    assert followed.stdout.splitlines() == task_1
    assert tf.ok("logs", "--task", "1", job).splitlines() == task_1
    assert tf.ok("logs", "--task", "1", "--grep", "line [23]", job).splitlines() == task_1[1:3]
    assert tf.ok("logs", "--task", "1", "-n", "1", job).splitlines() == ["task 1 done"]
    assert "task 0 done" in tf.ok("logs", "--task", "0", job) == tf.ok("logs", job)
    for args, said in (
        (["--task", "2"], f"job {job} has tasks 0-1; no task 2"),
        (["--task", "1", "--since", "1h"], "task 1's log has no times (only task 0's has)"),
        (["--task", "1", "-t"], "task 1's log has no times (only task 0's has)"),
    ):
        refused = tf.run("logs", *args, job)
        assert refused.returncode != 0 and said in refused.stderr and len(refused.stderr.splitlines()) == 1, refused
    tf.ok("pull", job, "task-1.log", "--to", str(tmp_path / "pulled"))
    assert (tmp_path / "pulled" / "task-1.log").read_text().splitlines() == task_1
    env = {**os.environ, **tf.env}
    api = "import sys, tfrun; print('|'.join(tfrun.Client().logs(sys.argv[1], query=tfrun.LogQuery(task=1))))"
    read = subprocess.run([sys.executable, "-c", api, job], env=env, capture_output=True, text=True, timeout=60)
    assert read.stdout.strip() == "|".join(task_1), read.stderr


@pytest.mark.slurm
def test_the_failed_alert_quotes_the_task_that_failed(on_two_nodes: Tfrun, project: Path, receiver: Receiver) -> None:
    """Task 1 fails first: the failed alert says so and quotes task-1.log, not the chief's log (which shows
    only that it was stopped)."""
    tf = on_two_nodes
    no_internet(tf.env)
    write_script(
        project,
        "crash.py",
        "import os, sys, time\nif os.environ['TFRUN_TASK_INDEX'] == '1':\n"
        "    print('worker loading shard 7', flush=True)\n"
        "    raise RuntimeError('worker 1: shard 7 is corrupt')\n"
        "print('chief waiting for the workers', flush=True)\ntime.sleep(60)\n",
    )
    job = tf.submit("--nodes", "2", "--gpus", "0", "--notify", receiver.url, str(project / "crash.py"))
    assert tf.run("wait", str(job), timeout=90).returncode == 1
    wait_for(lambda: receiver.posts, timeout=60, what="the failed alert")
    (alert,) = [a for a in json.loads(tf.ok("alerts", "--json", str(job))) if a["rule"] == "failed"]
    assert "(task 1 of 2 failed first)" in alert["summary"], alert
    body = alert["body"].splitlines()
    quoted = body[body.index("Last lines of task 1's output:") + 1 :]
    assert quoted[0] == "    worker loading shard 7" and "    RuntimeError: worker 1: shard 7 is corrupt" in quoted
    assert not any("chief" in line for line in quoted)
    assert f"Log:         {tf.job_dir(job) / 'task-1.log'}  (tfrun logs {job} --task 1)" in body
    assert receiver.posts[0]["message"].rstrip("\n") == alert["body"].rstrip("\n")
