"""GPUs shared by a team (issue 27): two users' daemons on one box, each with its own TFRUN_HOME, never put
two jobs on one GPU; a process outside tfrun that holds a GPU's memory keeps jobs off it; a holder killed
with SIGKILL (its shim and its daemon) frees its GPU for the other daemon's queued job.

The box's GPUs are the stand-in's (TFRUN_GPU_STANDIN, two of them, with UUIDs), in a folder both users reach,
so their leases are in `<stand-in>.leases/` there, not in the box's /tmp/tfrun-gpus. The victim is the test
itself (root, through the `tf` fixture); the other user runs the same tfrun as themself (tests/harness/otheruser.py).
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from harness import TFRUN, TFRUND, Tfrun, wait_for, write_script
from harness.otheruser import OtherUser, other_user

pytestmark = [pytest.mark.root]

GIB = 1 << 30


@pytest.fixture
def shared() -> Iterator[Path]:
    """A folder both users reach, as /tmp is (mode 1777), for the stand-in, the jobs' records and gates."""
    folder = Path(f"/tmp/tfrun-test-gpus-{uuid.uuid4().hex[:8]}")
    folder.mkdir()
    folder.chmod(0o1777)
    for sub in ("records", "gates"):
        (folder / sub).mkdir()
        (folder / sub).chmod(0o1777)
    yield folder
    shutil.rmtree(folder, ignore_errors=True)


def standin(shared: Path, processes: Any = ()) -> Path:
    """Two GPUs as NVML would list them; `processes`: those using GPU 0 ([{"pid", "used"}])."""
    path = shared / "nvml.json"
    gpus = [
        {"index": i, "name": "NVIDIA H200", "uuid": f"GPU-{i}aa-test", "used": 0, "total": 141 * GIB} for i in range(2)
    ]
    gpus[0]["processes"] = list(processes)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(gpus))
    tmp.chmod(0o644)
    tmp.replace(path)  # read afresh at each look: never half written
    return path


def recording_job(folder: Path, shared: Path, who: str, gated: bool = False) -> Path:
    """A job that records its GPUs and when it ran (its own clock) in the shared records folder; `gated`:
    it runs until a file named `<who>-<job id>` appears in the gates folder."""
    name = f"{who}-train.py"
    gate = f"while not os.path.exists(os.path.join({str(shared / 'gates')!r}, {who!r} + '-' + job)):\n" \
           "    time.sleep(0.05)\n" if gated else "time.sleep(0.3)\n"  # fmt: skip
    script = write_script(
        folder,
        name,
        "import os, time\n"
        "job = os.environ['TFRUN_JOB_ID']\n"
        "start = time.time()\n"
        f"{gate}"
        f"with open(os.path.join({str(shared / 'records')!r}, {who!r} + '-' + job), 'w') as f:\n"
        "    f.write(f\"{os.environ.get('CUDA_VISIBLE_DEVICES')} {start} {time.time()}\")\n",
    )
    script.chmod(0o644)
    return script


class Other:
    """The other user's tfrun: their own TFRUN_HOME under their home, the same stand-in GPUs."""

    def __init__(self, user: OtherUser, gpus: Path) -> None:
        self.user = user
        self.home = user.home / "tfrun"
        self.env = user.env(TFRUN_HOME=str(self.home), TFRUN_GPU_STANDIN=str(gpus))

    def ok(self, *args: str) -> str:
        result = self.user.run([*TFRUN, *args], env=self.env, timeout=120)
        assert result.returncode == 0, f"tfrun {' '.join(args)} as {self.user.name}: {result.stderr}"
        return result.stdout

    def submit(self, *args: str) -> int:
        return int(self.ok("submit", *args).strip())

    def daemon(self, *args: str) -> str:
        result = self.user.run([*TFRUND, *args], env=self.env, timeout=60)
        assert result.returncode == 0, f"tfrund {' '.join(args)} as {self.user.name}: {result.stderr}"
        return result.stdout

    def project(self, shared: Path, gated: bool = False) -> Path:
        folder = self.user.home / "project"
        folder.mkdir(exist_ok=True)
        recording_job(folder, shared, self.user.name, gated)
        shutil.chown(folder, self.user.uid, self.user.gid)
        return folder / f"{self.user.name}-train.py"


def records(shared: Path) -> dict[str, tuple[str, float, float]]:
    found = {}
    for path in (shared / "records").iterdir():
        device, start, end = path.read_text().split()
        found[path.name] = (device, float(start), float(end))
    return found


def waiting_reason(tf: Tfrun, job: int) -> str:
    return str(tf.job(job).get("waiting") or "")


@pytest.mark.slow  # more than 10 s
def test_two_users_daemons_never_put_two_jobs_on_one_gpu(tf: Tfrun, shared: Path, project: Path) -> None:
    gpus = standin(shared)
    tf.env["TFRUN_GPU_STANDIN"] = str(gpus)
    mine = recording_job(project, shared, "root")
    with other_user("tfg") as user:
        other = Other(user, gpus)
        theirs = other.project(shared)
        started = time.monotonic()
        for _ in range(20):  # both daemons' queues fill at once, each job on one of the two GPUs
            tf.submit("--gpus", "1", str(mine))
            other.submit("--gpus", "1", str(theirs))
        wait_for(lambda: len(records(shared)) == 40, timeout=90, what="all 40 jobs to run")
        elapsed = time.monotonic() - started
    by_device: dict[str, list[tuple[float, float, str]]] = {}
    for name, (device, start, end) in records(shared).items():
        by_device.setdefault(device, []).append((start, end, name))
    assert set(by_device) <= {"0", "1"}, by_device.keys()
    for device, runs in by_device.items():
        runs.sort()
        for (_, end, before), (start, _, after) in zip(runs, runs[1:]):
            assert start >= end, f"GPU {device}: {after} started at {start} while {before} ran until {end}"
    assert {name.split("-")[0] for name in records(shared)} == {"root", user.name}
    assert elapsed < 75  # both GPUs were used: a GPU stays free no longer than a recheck


def test_a_process_outside_tfrun_holding_a_gpus_memory_keeps_jobs_off_it(
    tf: Tfrun, shared: Path, project: Path
) -> None:
    with other_user("tfn") as user:
        notebook = user.popen([sys.executable, "-c", "import time; time.sleep(120)"])
        try:
            gpus = standin(shared, [{"pid": notebook.pid, "used": 3 * GIB + GIB // 5}])
            tf.env["TFRUN_GPU_STANDIN"] = str(gpus)
            script = str(recording_job(project, shared, "root", gated=True))
            first = tf.submit("--gpus", "1", script)
            second = tf.submit("--gpus", "1", script)
            wait_for(lambda: "held outside" in waiting_reason(tf, second), what="the second job to wait")
            held = f"a process of uid {user.uid} (pid {notebook.pid}, 3.2 GiB)"
            assert f"GPU 0 by {held}" in waiting_reason(tf, second)
            assert tf.job(first)["gpus"] == ["1"]
            found = {gpu["device"]: gpu for gpu in json.loads(tf.ok("gpus", "--json"))}
            assert found["0"]["held_by"] == held and found["0"]["job"] is None
            assert f"held by {held}" in tf.ok("gpus")
            assert held in tf.ok("ps")  # why the job waits
            standin(shared)  # the notebook let go of its memory
            wait_for(lambda: tf.job(second)["gpus"] == ["0"], what="the second job to start on GPU 0")
        finally:
            notebook.kill()
            notebook.wait()
    for job in (first, second):
        (shared / "gates" / f"root-{job}").touch()


def test_a_holder_killed_with_sigkill_frees_its_gpu_for_the_other_daemons_job(
    tf: Tfrun, shared: Path, project: Path
) -> None:
    gpus = standin(shared)
    tf.env["TFRUN_GPU_STANDIN"] = str(gpus)
    with other_user("tfk") as user:
        other = Other(user, gpus)
        theirs = str(other.project(shared, gated=True))
        held = [other.submit("--gpus", "1", theirs) for _ in range(2)]  # both GPUs, until their gates open
        wait_for(lambda: all(_state(other, job) == "running" for job in held), what="their jobs to run")
        job = tf.submit("--gpus", "1", str(recording_job(project, shared, "root", gated=True)))
        wait_for(lambda: "held outside" in waiting_reason(tf, job), what="our job to wait")
        assert f"a lease of user {user.name} (uid {user.uid}) that pid " in waiting_reason(tf, job)
        assert f"held by a lease of user {user.name} (uid {user.uid})" in tf.ok("gpus")
        victim = held[0]
        device = json.loads(other.ok("status", "--json", str(victim)))["gpus"][0]
        shim = json.loads((other.home / "jobs" / str(victim) / "shim.json").read_text())["shim_pid"]
        daemon = int(json.loads(other.daemon("status", "--json"))["pid"])
        os.kill(daemon, signal.SIGKILL)
        os.kill(shim, signal.SIGKILL)
        wait_for(lambda: tf.job(job)["gpus"] == [device], what=f"our job to start on GPU {device}")
        (shared / "gates" / f"root-{job}").touch()
        wait_for(lambda: f"root-{job}" in records(shared), what="our job to end")


def _state(other: Other, job: int) -> str:
    return str(json.loads(other.ok("status", "--json", str(job)))["state"])


def test_a_lease_folder_without_the_sticky_bit_is_refused_in_one_line(tf: Tfrun, shared: Path, project: Path) -> None:
    gpus = standin(shared)
    with other_user("tfl") as user:
        leases = Path(f"{gpus}.leases")
        leases.mkdir()
        leases.chmod(0o777)  # anyone could delete a lease in it, and so take a GPU that is in use
        os.chown(leases, user.uid, user.gid)
        tf.env["TFRUN_GPU_STANDIN"] = str(gpus)
        job = tf.submit("--gpus", "1", str(recording_job(project, shared, "root")))
        wait_for(lambda: "held outside" in waiting_reason(tf, job), what="the job to wait")
        why = waiting_reason(tf, job)
        assert f"GPU lease folder {leases} lacks the sticky bit" in why and f"chmod 1777 {leases}" in why
        assert f"uid {user.uid}" in why and "\n" not in why and "Traceback" not in why
        subprocess.run([*TFRUN, "cancel", str(job)], env=tf.env, capture_output=True, timeout=60)
