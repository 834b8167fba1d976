"""The GPU-aware queue, on a box whose config names two devices (TFRUN_GPUS=0,1; no real GPU needed):
each job gets GPUs of its own, jobs that do not fit wait their turn, `--after` chains, and a daemon
restart keeps every assignment."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from harness import Tfrun, wait_for, write_script


@pytest.fixture
def box(tf: Tfrun) -> Tfrun:
    tf.env["TFRUN_GPUS"] = "0,1"
    return tf


def gpu_job(folder: Path, gates: Path) -> Path:
    """A job that prints the GPUs it was given, then waits until a file named after its job id appears."""
    return write_script(
        folder,
        "train.py",
        "import os, time\n"
        "print('devices=' + os.environ.get('CUDA_VISIBLE_DEVICES', 'unset'), flush=True)\n"
        f"gate = os.path.join({str(gates)!r}, os.environ['TFRUN_JOB_ID'])\n"
        "while not os.path.exists(gate):\n    time.sleep(0.05)\n",
    )


def devices_of(tf: Tfrun, job: int) -> str:
    """CUDA_VISIBLE_DEVICES as the job saw it, once it printed it ("" for set but empty)."""
    line = wait_for(lambda: _devices_line(tf, job), what=f"job {job}'s devices")
    return str(line).split("=", 1)[1]


def _devices_line(tf: Tfrun, job: int) -> str:
    return next((line for line in tf.log(job).decode().splitlines() if line.startswith("devices=")), "")


def release(gates: Path, job: int) -> None:
    (gates / str(job)).touch()


@pytest.fixture
def gates(tmp_path: Path) -> Path:
    folder = tmp_path / "gates"
    folder.mkdir()
    return folder


def test_three_one_gpu_jobs_on_two_gpus(box: Tfrun, project: Path, gates: Path) -> None:
    script = str(gpu_job(project, gates))
    first, second, third = (box.submit("--gpus", "1", script) for _ in range(3))
    assert {devices_of(box, first), devices_of(box, second)} == {"0", "1"}
    third_record = box.job(third)
    assert third_record["state"] == "queued" and third_record["gpus"] == []
    assert third_record["waiting"] == "waiting for 1 GPU(s); 0 free"
    freed = devices_of(box, first)
    release(gates, first)
    assert devices_of(box, third) == freed
    assert box.job(third)["gpus"] == [freed] and box.job(third)["state"] == "running"
    for job in (second, third):
        release(gates, job)
    assert all(box.run("wait", str(job)).returncode == 0 for job in (first, second, third))


def test_the_default_is_one_gpu_and_a_cpu_job_sees_none(box: Tfrun, project: Path, gates: Path) -> None:
    script = str(gpu_job(project, gates))
    default, cpu = box.submit(script), box.submit("--gpus", "0", script)
    assert devices_of(box, default) in ("0", "1") and box.job(default)["gpus_requested"] == 1
    assert devices_of(box, cpu) == ""  # CUDA_VISIBLE_DEVICES set empty: no GPU at all, not every GPU
    for job in (default, cpu):
        release(gates, job)


def test_a_two_gpu_job_waits_for_both_and_holds_back_later_gpu_jobs(box: Tfrun, project: Path, gates: Path) -> None:
    script = str(gpu_job(project, gates))
    one = box.submit("--gpus", "1", script)
    devices_of(box, one)
    both = box.submit("--gpus", "2", script)
    later = box.submit("--gpus", "1", script)  # would fit now, but the 2-GPU job is first in line
    cpu = box.submit("--gpus", "0", script)  # needs no GPU: not held back
    assert devices_of(box, cpu) == ""
    assert box.job(both)["state"] == "queued" and box.job(later)["state"] == "queued"
    release(gates, one)
    assert devices_of(box, both) == "0,1" and box.job(later)["state"] == "queued"
    release(gates, both)
    assert devices_of(box, later) in ("0", "1")
    for job in (later, cpu):
        release(gates, job)


def test_priority_goes_first(box: Tfrun, project: Path, gates: Path) -> None:
    script = str(gpu_job(project, gates))
    holders = [box.submit("--gpus", "1", script) for _ in range(2)]
    for job in holders:
        devices_of(box, job)
    low = box.submit("--gpus", "1", script)
    high = box.submit("--gpus", "1", "--priority", "5", script)
    release(gates, holders[0])
    devices_of(box, high)
    assert box.job(low)["state"] == "queued"
    for job in (holders[1], high, low):
        release(gates, job)


def test_after_chains_and_a_failure_propagates(box: Tfrun, project: Path, gates: Path) -> None:
    script = str(gpu_job(project, gates))
    write_script(project, "fail.py", "raise SystemExit(3)\n")
    first = box.submit("--gpus", "0", script)
    second = box.submit("--gpus", "0", "--after", str(first), script)
    third = box.submit("--gpus", "0", "--after", str(second), str(project / "fail.py"))
    fourth = box.submit("--gpus", "0", "--after", f"{first},{third}", script)
    assert box.job(second)["waiting"] == f"waiting for job(s) {first} to succeed"
    assert box.job(second)["after"] == [first]
    release(gates, first)
    devices_of(box, second)
    assert box.job(third)["state"] == "queued"
    release(gates, second)
    assert box.run("wait", str(third)).returncode == 3
    assert box.run("wait", str(fourth)).returncode != 0
    record = box.job(fourth)
    assert record["state"] == "failed" and record["reason"] == f"job {third}, which it runs after, failed"
    assert box.job(fourth)["started_at"] is None


def test_after_a_job_that_is_restarted_waits_for_its_last_run(tf: Tfrun, project: Path, tmp_path: Path) -> None:
    """--max-restarts: the first run fails, the restart succeeds; the job after it runs (it had failed unstarted)."""
    marker = tmp_path / "ran-once"
    flaky = write_script(project, "flaky.py", f"import os, sys\nif not os.path.exists({str(marker)!r}):\n"
                         f"    open({str(marker)!r}, 'w').close()\n    sys.exit(3)\n")  # fmt: skip
    write_script(project, "after.py", "print('after it')\n")
    first = tf.submit("--max-restarts", "1", "--restart-on", "error", str(flaky))
    second = tf.submit("--after", str(first), str(project / "after.py"))
    assert tf.run("wait", str(second)).returncode == 0, tf.job(second)["reason"]
    assert tf.job(first)["state"] == "failed" and tf.job(tf.job(first)["restarted_as"])["state"] == "succeeded"
    assert tf.log(second) == b"after it\n"
    write_script(project, "fails.py", "raise SystemExit(4)\n")
    failing = tf.submit("--max-restarts", "1", "--restart-on", "error", str(project / "fails.py"))
    third = tf.submit("--after", str(failing), str(project / "after.py"))
    assert tf.run("wait", str(third)).returncode != 0
    restart = tf.job(failing)["restarted_as"]
    assert tf.job(third)["reason"] == f"job {failing}, which it runs after, failed in its restart, job {restart}"


def test_a_daemon_restart_keeps_assignments(box: Tfrun, project: Path, gates: Path) -> None:
    script = str(gpu_job(project, gates))
    running = [box.submit("--gpus", "1", script) for _ in range(2)]
    waiting = box.submit("--gpus", "1", script)
    given = {job: devices_of(box, job) for job in running}
    box.kill_daemon()
    assert json.loads(box.ok("status", "--json", str(waiting)))["state"] == "queued"  # a new daemon
    assert {job: box.job(job)["gpus"] for job in running} == {job: [d] for job, d in given.items()}
    assert box.job(waiting)["state"] == "queued"
    release(gates, running[1])
    assert devices_of(box, waiting) == given[running[1]]
    for job in (running[0], waiting):
        release(gates, job)


def test_a_cap_on_cpu_only_jobs(tf: Tfrun, project: Path, gates: Path) -> None:
    tf.home.mkdir(mode=0o700, parents=True)
    (tf.home / "config.toml").write_text("max_cpu_jobs = 1\n")
    script = str(gpu_job(project, gates))
    first, second = tf.submit(script), tf.submit(script)
    assert devices_of(tf, first) == "unset"  # no GPUs on this box: the variable is left alone
    assert tf.job(second)["waiting"] == "waiting for one of the 1 CPU-only job slots"
    release(gates, first)
    devices_of(tf, second)
    release(gates, second)


def test_asking_for_more_gpus_than_the_box_has_is_refused(box: Tfrun, project: Path) -> None:
    write_script(project, "x.py", "print(1)\n")
    result = box.run("submit", "--gpus", "3", str(project / "x.py"))
    assert result.returncode == 2 and "asks for 3 GPU(s) and this box has 2 (0, 1)" in result.stderr
    missing = box.run("submit", "--after", "nosuchjob", str(project / "x.py"))
    assert missing.returncode == 3 and "--after: no job or array 'nosuchjob'" in missing.stderr


def test_gpus_shows_each_gpu_its_memory_and_its_job(box: Tfrun, project: Path, gates: Path, tmp_path: Path) -> None:
    standin = tmp_path / "nvml.json"  # what NVML would say; no GPU can exist here
    gib = 1 << 30
    standin.write_text(
        json.dumps(
            [
                {"index": 0, "name": "NVIDIA H200", "used": 10 * gib, "total": 141 * gib, "utilization": 87},
                {"index": 1, "name": "NVIDIA H200", "used": 0, "total": 141 * gib, "utilization": 0},
            ]
        )
    )
    box.env["TFRUN_GPU_STANDIN"] = str(standin)
    job = box.submit("--gpus", "1", str(gpu_job(project, gates)))
    device = devices_of(box, job)
    found = {gpu["device"]: gpu for gpu in json.loads(box.ok("gpus", "--json"))}
    assert set(found) == {"0", "1"} and found[device]["job"] == job
    assert [gpu["job"] for d, gpu in found.items() if d != device] == [None]
    assert found["0"]["memory_used"] == 10 * gib and found["0"]["utilization"] == 87
    table = box.ok("gpus")
    assert "NVIDIA H200" in table and "87%" in table and "10.7 GB / 151.4 GB (7%)" in table
    release(gates, job)
