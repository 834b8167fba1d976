"""Job arrays (issue 19): `tfrun submit --array KEY=V1,V2,...` makes one job a value, the tasks of one array.
On a local daemon they are queued jobs like any other; on the real Slurm cluster (tests/harness/slurmcluster.py) they
are ONE sbatch --array, each task still a tfrun job with its own exit code, log and cancel. Bad arrays are
refused in one line, by the client and by the daemon."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
from harness import TFRUND, Tfrun, alive, serving_daemon, wait_for, write_script
from harness.slurmcluster import SlurmCluster, on_slurm_fixture, slurm_fixture, slurm_id_of  # noqa: F401 (fixtures)

from tfrun import arrays
from tfrun.protocol.channel import RemoteError
from tfrun.protocol.fields import ErrorCode
from tfrun.runner.faults import CRASH_AT_ENV

pytestmark = [pytest.mark.slow]

SHOW = """import os, sys
print("value", os.environ["LR"], "args", sys.argv[1:], "array", os.environ["TFRUN_ARRAY_ID"],
      os.environ["TFRUN_ARRAY_INDEX"], flush=True)
"""


def _submit_array(tf: Tfrun, *args: str) -> list[int]:
    return [int(line) for line in tf.ok("submit", *args).split()]


def test_an_array_of_four_tasks_each_sees_its_value_and_ps_groups_them(tf: Tfrun, project: Path) -> None:
    write_script(project, "show.py", SHOW)
    values = ["0.1", "0.01", "0.001", "0.0001"]
    ids = _submit_array(tf, "--name", "sweep", "--array", f"lr={','.join(values)}", str(project / "show.py"), "-e", "2")
    assert len(ids) == 4 and ids == sorted(ids)
    for index, (job, value) in enumerate(zip(ids, values)):
        assert tf.run("wait", str(job), timeout=60).returncode == 0
        assert f"value {value} args ['-e', '2', '--lr={value}'] array {ids[0]} {index}" in tf.log(job).decode()
    records = {job["id"]: job for job in tf.jobs()}
    assert [(records[j]["array_id"], records[j]["array_index"], records[j]["name"]) for j in ids] == [
        (ids[0], i, f"sweep-{i}") for i in range(4)
    ]
    assert records[ids[2]]["env"] == {"LR": "0.001"}
    lines = tf.ok("ps", "-a").splitlines()
    assert lines[2].split()[:4] == [f"{ids[0]}[0-3]", "sweep", "4", "succeeded"], lines  # the array's row
    assert [line.split()[:2] for line in lines[3:]] == [[str(j), f"sweep-{i}"] for i, j in enumerate(ids)], lines
    assert all(line.startswith("  ") for line in lines[3:])  # its tasks, under it
    assert tf.ok("ps", "-aq").split() == [str(j) for j in ids]  # scripts get ids only, as ever
    assert f"task 1 of array {ids[0]}" in tf.ok("status", str(ids[1]))


def test_repeated_arrays_make_every_combination(tf: Tfrun, project: Path) -> None:
    write_script(project, "both.py", "import os, sys\nprint(os.environ['LR'], os.environ['BS'], sys.argv[1:])\n")
    result = tf.run("submit", "--json", "--array", "lr=0.1,0.2", "--array", "bs=8,16", str(project / "both.py"))
    assert result.returncode == 0, result.stderr
    tasks = json.loads(result.stdout)
    assert [t["args"] for t in tasks] == [
        ["--lr=0.1", "--bs=8"], ["--lr=0.1", "--bs=16"], ["--lr=0.2", "--bs=8"], ["--lr=0.2", "--bs=16"]
    ]  # fmt: skip
    assert tf.run("wait", str(tasks[3]["id"]), timeout=60).returncode == 0
    assert tf.log(tasks[3]["id"]).decode() == "0.2 16 ['--lr=0.2', '--bs=16']\n"


@pytest.mark.parametrize(
    ("options", "says"),
    [
        (["--array", "lr"], "not KEY=V1,V2"),
        (["--array", "lr=0.1,,0.2"], "empty value"),
        (["--array", "lr="], "empty value"),
        (["--array", "1lr=1"], "use letters"),
        (["--array", "path=/a,/b"], "would set PATH"),
        (["--array", "lr=1", "--array", "LR=2"], "given twice"),
        (["--env", "LR=1", "--array", "lr=2,3"], "--env sets too"),
        (["--array", "lr=a\tb"], "control character"),
        (["--array", "a=" + ",".join(map(str, range(40))), "--array", "b=" + ",".join(map(str, range(40)))], "1000"),
        (["--array", "lr=1,2", "--follow"], "--follow takes one job"),
    ],
)
def test_bad_arrays_are_refused_in_one_line(tf: Tfrun, project: Path, options: list[str], says: str) -> None:
    write_script(project, "show.py", SHOW)
    result = tf.run("submit", *options, str(project / "show.py"))
    assert result.returncode == 2 and says in result.stderr, result.stderr
    assert len(result.stderr.strip().splitlines()) == 1 and "Traceback" not in result.stderr, result.stderr


def test_the_daemon_checks_an_array_itself(tf: Tfrun, project: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The Python API sends what it is given: the daemon refuses a bad array, making no job, and runs a good one."""
    from tfrun.client.library.api import Client, JobOptions

    write_script(project, "show.py", SHOW)
    for name, value in tf.env.items():
        monkeypatch.setenv(name, value)
    client = Client()
    for axes, says in (([("path", ["/a"])], "would set PATH"), ([("lr", ["a,b"])], "comma")):
        with pytest.raises(RemoteError) as refused:
            client.submit_array(str(project / "show.py"), axes)
        assert refused.value.code == ErrorCode.INVALID_INPUT and says in refused.value.message
    with pytest.raises(RemoteError, match="with the task index"):
        client.submit_array(str(project / "show.py"), [("lr", ["1", "2"])], options=JobOptions(name="n" * 128))
    tasks = client.submit_array(str(project / "show.py"), [("lr", ["1", "2"])])
    assert [task.wait().state for task in tasks] == ["succeeded", "succeeded"]
    assert [job["array_index"] for job in tf.jobs()] == [0, 1]


@pytest.mark.parametrize("crash", ["submit-accepted", "prepare-manifest-written"])
def test_an_array_whose_daemon_dies_before_answering_runs_once(
    tf: Tfrun, project: Path, tmp_path: Path, crash: str
) -> None:
    """As a job's submit: the next daemon answers with the tasks the first one made (or, where it died before
    building them, makes them in their place), and each task runs once."""
    runs = tmp_path / "runs"
    write_script(project, "once.py", f"import os\nopen({str(runs)!r}, 'a').write(os.environ['LR'] + '\\n')\n")
    subprocess.run([*TFRUND, "start"], env={**tf.env, CRASH_AT_ENV: crash}, check=True, timeout=60)
    first = wait_for(lambda: serving_daemon(tf.home))
    ids = _submit_array(tf, "--array", "lr=1,2,3", str(project / "once.py"))  # the next daemon dies nowhere
    assert not alive(first) and f"{crash}: killing myself" in (tf.home / "tfrund.log").read_text()
    assert [job["id"] for job in tf.jobs() if job["state"] != "failed"] == ids  # (failed: never built)
    for job in ids:
        assert tf.run("wait", str(job)).returncode == 0
    assert sorted(runs.read_text().split()) == ["1", "2", "3"]


def test_the_shared_checks() -> None:
    assert arrays.parse("batch_size=8,16") == ("batch_size", ["8", "16"])
    assert arrays.tasks([("a", ["1", "2"]), ("b", ["x"])]) == [{"a": "1", "b": "x"}, {"a": "2", "b": "x"}]
    assert arrays.task_env({"batch_size": "8"}) == {"BATCH_SIZE": "8"}
    assert arrays.task_args({"batch_size": "8"}) == ["--batch_size=8"]
    assert arrays.task_name("sweep", 3) == "sweep-3" and arrays.task_name(None, 3) is None
    arrays.check([("lr", [str(i) for i in range(arrays.MAX_ARRAY_TASKS)])])  # the cap itself is allowed
    with pytest.raises(arrays.ArrayError):
        arrays.check([("lr", [str(i) for i in range(arrays.MAX_ARRAY_TASKS + 1)])])
    for reserved in ("tfrun_job_id", "slurm_x", "pythonpath", "ld_preload", "cuda_visible_devices", "home"):
        with pytest.raises(arrays.ArrayError, match="relies on"):
            arrays.check([(reserved, ["1"])])


# -- on the real cluster ----------------------------------------------------------------------------------


@pytest.mark.slurm
def test_an_array_of_four_tasks_is_one_sbatch_on_slurm(
    on_slurm: Tfrun, slurm: SlurmCluster, project: Path, tmp_path: Path
) -> None:
    tf = on_slurm
    script = """import os, sys, time
index = int(os.environ["TFRUN_ARRAY_INDEX"])
print("lr", os.environ["LR"], sys.argv[1:], "slurm task", os.environ["SLURM_ARRAY_TASK_ID"], flush=True)
while index == 3:  # the last task runs until it is cancelled
    time.sleep(0.1)
sys.exit(index)
"""
    write_script(project, "task.py", script)
    values = ["0.1", "0.01", "0.001", "0.0001"]
    ids = _submit_array(tf, "--gpus", "0", "--array", f"lr={','.join(values)}", str(project / "task.py"))
    slurm_ids = [slurm_id_of(tf, job) for job in ids]
    base = slurm_ids[0].split("_")[0]
    assert slurm_ids == [f"{base}_{i}" for i in range(4)], slurm_ids  # ONE sbatch: one array, four tasks
    for index, job in enumerate(ids[:3]):
        assert tf.run("wait", str(job), timeout=90).returncode == index
        assert f"lr {values[index]} ['--lr={values[index]}'] slurm task {index}" in tf.log(job).decode()
        assert (tf.job_dir(job) / f"slurm-{job}.out").exists()  # the batch output in the task's own folder
    assert [tf.job(job)["state"] for job in ids[:3]] == ["succeeded", "failed", "failed"]
    wait_for(lambda: b"lr 0.0001" in tf.log(ids[3]), timeout=60, what="the last task to run")
    wait_for(lambda: tf.job(ids[3])["state"] == "running", timeout=30, what="running")
    assert tf.ok("ps").splitlines()[2].split()[:4] == [f"{ids[0]}[3]", "-", "1", "running"]
    assert tf.run("cancel", "--grace", "2", str(ids[3]), timeout=60).returncode == 0
    assert tf.job(ids[3])["state"] == "cancelled"
    accounted = f"sacct -X -n -P -j {base} --format=JobID,State,ExitCode"
    shown = wait_for(
        lambda: len(lines := slurm.ok(accounted).splitlines()) == 4 and "RUNNING" not in lines[3] and lines,
        timeout=60,
        what="sacct's record of the four tasks",
    )
    # Each task ended as itself. (The cancelled one reads FAILED 15:0 to Slurm: tfrun's shim ended it with TERM.)
    assert shown[:3] == [f"{base}_0|COMPLETED|0:0", f"{base}_1|FAILED|1:0", f"{base}_2|FAILED|2:0"], shown
    assert shown[3].startswith(f"{base}_3|"), shown
    folder = tf.home / "slurm-arrays" / str(ids[0])  # the submission's own folder: it goes with its last task
    tf.ok("rm", *map(str, ids[:3]))
    assert (folder / "array.json").exists()
    tf.ok("rm", str(ids[3]))
    assert not folder.exists()


@pytest.mark.slurm
@pytest.mark.parametrize("crash", ["array-recorded", "array-submitted"])
def test_a_daemon_that_dies_around_sbatch_never_submits_an_array_twice(
    on_slurm: Tfrun, slurm: SlurmCluster, project: Path, crash: str
) -> None:
    """Killed before sbatch, the next daemon submits the array; killed after it, before the tasks' Slurm ids
    were recorded, it finds the array in squeue by its folder. Either way Slurm ran ONE array of 3 tasks."""
    tf = on_slurm
    write_script(project, "hello.py", "import os\nprint('hello', os.environ['LR'])\n")
    subprocess.run([*TFRUND, "start"], env={**tf.env, CRASH_AT_ENV: crash}, check=True, timeout=60)
    first = wait_for(lambda: serving_daemon(tf.home))
    ids = _submit_array(tf, "--gpus", "0", "--array", "lr=1,2,3", str(project / "hello.py"))
    assert not alive(first) and f"{crash}: killing myself" in (tf.home / "tfrund.log").read_text()
    for job in ids:
        assert tf.run("wait", str(job), timeout=90).returncode == 0
    folder = tf.home / "slurm-arrays" / str(ids[0])
    accounted = "sacct -X -n -P --format=JobID,WorkDir,State"
    shown = wait_for(
        lambda: (
            len(lines := [line for line in slurm.ok(accounted).splitlines() if f"|{folder}|" in line]) == 3 and lines
        ),
        timeout=60,
        what="sacct's record of the array",
    )
    base = shown[0].split("_")[0]
    assert sorted(line.split("|")[0] for line in shown) == [f"{base}_{i}" for i in range(3)], shown


def test_after_an_arrays_name_waits_for_every_task(tf: Tfrun, project: Path, gate: Path) -> None:
    """The job that compares a sweep runs once all of its tasks succeeded; one failed task fails it unstarted."""
    write_script(project, "task.py", f"import os, sys, time\nwhile not os.path.exists({str(gate)!r}):\n"
                 "    time.sleep(0.05)\nsys.exit(int(os.environ['CODE']))\n")  # fmt: skip
    write_script(project, "compare.py", "print('compared')\n")
    ok = _submit_array(tf, "--name", "sw", "--array", "code=0,0,0,0,0,0", str(project / "task.py"))
    bad = _submit_array(tf, "--name", "sw2", "--array", "code=0,3", str(project / "task.py"))
    after_ok = tf.submit("--after", "sw", str(project / "compare.py"))
    after_bad = tf.submit("--after", "sw2", str(project / "compare.py"))
    waiting = f"waiting for job(s) {', '.join(map(str, ok[:5]))} and 1 more to succeed"  # the list cut short
    wait_for(lambda: tf.job(after_ok)["waiting"] == waiting, what=waiting)
    gate.touch()
    assert tf.run("wait", str(after_ok), timeout=60).returncode == 0 and b"compared" in tf.log(after_ok)
    assert all(tf.job(task)["state"] == "succeeded" for task in ok)
    assert tf.run("wait", str(after_bad), timeout=60).returncode != 0
    assert tf.job(after_bad)["reason"] == f"job {bad[1]}, which it runs after, failed" and not tf.log(after_bad)
    assert "--after: no job or array 'sw3'" in tf.run("submit", "--after", "sw3", str(project / "compare.py")).stderr
