"""Faults a box meets, on a small disk of the test's own (a tmpfs) and under a low descriptor limit: a database
left empty, a job that writes faster than its log is read, a full disk, the open files used up. Nothing is lost,
the user is told in one line, and the daemon's own log stays bounded."""

from __future__ import annotations

import io
import resource
import socket
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Optional

import pytest
from harness import TFRUN, TFRUND, Tfrun, gated_job, wait_for, write_script
from harness.alerting import alerts_of
from harness.disks import fill_up, small_disk

from tfrun.constants import FILE_CHUNK_BYTES
from tfrun.paths import Layout
from tfrun.runner.records import jobfiles
from tfrun.runner.records.store import Store

pytestmark = [pytest.mark.slow]


@pytest.fixture
def disk(tmp_path: Path) -> Iterator[Path]:
    """A 32 MiB tmpfs of the test's own."""
    with small_disk(tmp_path / "disk") as folder:
        yield folder


class Served:
    """A `tfrund run` of `tf`'s home with its log outside the home (on a disk with room: what it writes is
    counted), under an open-files limit of (soft, hard) where one is given."""

    def __init__(self, tf: Tfrun, log: Path, nofile: Optional[tuple[int, int]] = None) -> None:
        self.log = log
        limit = (lambda: resource.setrlimit(resource.RLIMIT_NOFILE, nofile)) if nofile else None
        with open(log, "ab") as out:  # the daemon's own descriptor on it stays open
            self.proc = subprocess.Popen(
                [*TFRUND, "run"], env=tf.env, stdout=out, stderr=out, stdin=subprocess.DEVNULL, preexec_fn=limit
            )
        wait_for(lambda: tf.daemon("status").returncode == 0, what="tfrund run to serve")

    def text(self) -> str:
        return self.log.read_text(errors="replace")

    def stop(self) -> None:
        self.proc.terminate()
        self.proc.wait(30)


def test_an_empty_database_beside_job_folders_is_refused_not_started_over(disk: Path, project: Path) -> None:
    """0 bytes, as a crash or a full disk leaves it: SQLite would make it a new database and `ps -a` said "no
    jobs". Refused, naming the file and what to do; once moved aside, a new database, and new ids."""
    tf = Tfrun(disk / "home")
    try:
        write_script(project, "hi.py", "print('hi')\n")
        jobs = [tf.submit(str(project / "hi.py")) for _ in range(3)]
        assert tf.run("wait", str(jobs[-1])).returncode == 0
        assert tf.daemon("stop").returncode == 0
        database = tf.home / "tfrun.db"
        database.write_bytes(b"")
        refused = tf.run("ps", "-a")
        assert refused.returncode == 125, refused
        assert refused.stderr.strip().splitlines() == [
            f"tfrun: error: tfrund cannot start: {database} is empty (0 bytes: a crash or a full disk left it) "
            f"while {tf.home / 'jobs'} holds 3 job folder(s) it recorded; restore it from a backup, or move it "
            "aside to start afresh (the folders stay, and new jobs take new ids)"
        ]
        assert database.stat().st_size == 0 and sorted(int(p.name) for p in (tf.home / "jobs").iterdir()) == jobs
        database.rename(tf.home / "tfrun.db.empty")
        assert tf.submit(str(project / "hi.py")) == 4  # none of the old folders is written into
    finally:
        tf.cleanup()


def test_a_half_made_job_leaves_no_folder_when_a_full_disk_undoes_it(disk: Path, tmp_path: Path) -> None:
    """The row's commit fails on the full disk: the folder made for it goes too (it stayed, and its id was skipped
    for ever as an earlier database's)."""
    from tfrun.runner.records.job import JobSpec

    store = Store(disk / "tfrun.db")
    try:
        jobs = disk / "jobs"
        filler = fill_up(disk)
        with pytest.raises(Exception, match="full"):
            for _ in range(100):  # a few may still fit in the pages SQLite has
                store.create_job(None, JobSpec("x.py", (), ("x.py",), {}), jobs, tmp_path)
        made = {int(p.name) for p in jobs.iterdir()} if jobs.exists() else set()
        assert made == {row.id for row in store.list(include_final=True)}
        filler.unlink()
        row = store.create_job(None, JobSpec("x.py", (), ("x.py",), {}), jobs, tmp_path)
        assert row.id == max(made, default=0) + 1, "no id skipped"
    finally:
        store.close()


def read_slowly(proc: subprocess.Popen[bytes], seconds: float) -> tuple[bytes, bool]:
    """What `proc` printed, read 64 kB every 50 ms (a client slower than the job), and whether it ended."""
    assert isinstance(proc.stdout, io.BufferedReader)
    out, deadline = b"", time.monotonic() + seconds
    while time.monotonic() < deadline:
        chunk = proc.stdout.read1(64 << 10)
        if not chunk:
            return out, proc.wait(10) is not None
        out += chunk
        time.sleep(0.05)
    proc.kill()
    return out, False


def test_a_tail_of_a_job_writing_fast_ends_where_the_log_ended_when_asked(tf: Tfrun, project: Path) -> None:
    """`logs --tail 5` chased the end of a log that kept moving: 2,060,006 lines (447 MB) in 6.3 s, and on."""
    write_script(project, "fast.py", """\
import sys, time
for n in range(0, 12_000_000, 10_000):  # flat out, up to some 900 MB
    sys.stdout.write("".join(f"step {n + i} loss=0.5 {'x' * 60}\\n" for i in range(10_000)))
    sys.stdout.flush()
time.sleep(3600)
""")  # fmt: skip
    job = tf.submit(str(project / "fast.py"))
    log = tf.job_dir(job) / "output.log"
    wait_for(lambda: log.exists() and log.stat().st_size > 2 << 20, what="2 MB of log")
    try:
        for args in (["--tail", "5"], ["--tail", "5", "-e", "step"]):
            proc = subprocess.Popen([*TFRUN, "logs", str(job), *args], env=tf.env, stdout=subprocess.PIPE)
            out, ended = read_slowly(proc, 20)
            assert ended and proc.returncode == 0, (args, len(out))
            lines = out.decode().splitlines()
            assert len(lines) == 5 and all(line.startswith("step ") for line in lines), (args, lines)
            steps = [int(line.split()[1]) for line in lines]
            assert steps == list(range(steps[0], steps[0] + 5)), "the last 5 lines as the log held them"
    finally:
        tf.run("cancel", str(job))


def test_a_submit_on_a_full_disk_is_one_line_and_leaves_nothing_half_made(disk: Path, project: Path) -> None:
    """It was `tfrund internal error: [Errno 28] No space left on device`, exit 125 (a daemon not reached),
    with a traceback in tfrund.log."""
    tf = Tfrun(disk / "home")
    try:
        write_script(project, "hi.py", "print('hi')\n")
        first = tf.submit(str(project / "hi.py"))
        filler = fill_up(disk)
        for name in ("hi.py", "new.py"):  # its contents on the box already; contents to upload first
            write_script(project, name, f"print({name!r})\n")
            refused = tf.run("submit", str(project / name))
            assert refused.returncode == 1, refused
            (line,) = refused.stderr.strip().splitlines()
            assert line.startswith(f"tfrun: error: the disk at {disk} (which holds {tf.home}) is full: "), line
            assert " free of " in line and "free some space there" in line, line
        assert sorted(p.name for p in (tf.home / "jobs").iterdir()) == [str(first)], "no job half made"
        assert [job["id"] for job in tf.jobs()] == [first]
        assert "Traceback" not in (tf.home / "tfrund.log").read_text()
        filler.unlink()
        assert tf.submit(str(project / "new.py")) == first + 1
    finally:
        tf.cleanup()


def test_a_full_disk_is_one_alert_a_mark_in_each_jobs_log_and_one_line_in_tfrunds(
    disk: Path, project: Path, tmp_path: Path, gate: Path
) -> None:
    """Lines a job could not write left no trace a user sees, and tfrund.log took a `database or disk is full`
    traceback every 0.2 s from the job that ended meanwhile."""
    tf = Tfrun(disk / "home")
    served = Served(tf, tmp_path / "tfrund.log")
    try:
        ticks = "import time\nfor i in range(10**6):\n    try:\n        print('tick', i, flush=True)\n"
        write_script(project, "ticks.py", ticks + "    except OSError:\n        pass\n    time.sleep(0.05)\n")
        write_script(project, "ends.py", gated_job(1, 1, 0, gate))
        ticking, ending = tf.submit(str(project / "ticks.py")), tf.submit(str(project / "ends.py"))
        wait_for(lambda: b"before" in tf.log(ending), what="the second job to print")
        filler = fill_up(disk)
        gate.touch()  # it ends on the full disk: its end cannot be recorded until there is room
        wait_for(lambda: "is full" in served.text(), what="tfrund to see the disk full")
        time.sleep(3)  # some 15 turns of the monitor, each of which failed to record the end
        filler.unlink()
        assert tf.run("wait", str(ending)).returncode == 0
        marked = wait_for(lambda: tf.job(ticking)["reason"], what="the running job's reason")
        assert marked.startswith("output may be missing: the disk was full from "), marked
        logged = tf.log(ticking).decode().splitlines()
        (mark,) = [line for line in logged if line.startswith("[tfrun:")]
        assert mark.startswith("[tfrun: the disk was full from ") and mark.endswith("may be missing here]")
        assert logged[-1].startswith("tick"), "the job's lines go on after the mark"
        (alert,) = [a for a in alerts_of(tf) if a["rule"] == "disk-full"]
        assert alert["job_id"] is None and f"the disk at {disk}" in alert["summary"]
        daemon_log = served.text()
        assert "Traceback" not in daemon_log, daemon_log[-3000:]
        assert daemon_log.count("WARNING the disk at") == 1 and daemon_log.count("has room again") == 1, daemon_log
        assert daemon_log.count("check failed") <= 1 and len(daemon_log.splitlines()) < 15, daemon_log
    finally:
        tf.run("cancel", "--all")
        served.stop()
        tf.cleanup()


def soft_open_files(pid: int) -> int:
    for line in Path(f"/proc/{pid}/limits").read_text().splitlines():
        if line.startswith("Max open files"):
            return int(line.split()[3])
    raise AssertionError("no open files limit")


def test_tfrund_raises_its_open_files_limit_to_the_hard_one(tf: Tfrun, tmp_path: Path) -> None:
    served = Served(tf, tmp_path / "tfrund.log", nofile=(64, 4096))
    try:
        assert soft_open_files(served.proc.pid) == 4096
    finally:
        served.stop()


def test_at_the_open_files_limit_tfrund_logs_one_line_and_serves_again(tf: Tfrun, tmp_path: Path) -> None:
    """asyncio's accept loop (Python 3.11.7) logged a traceback for each try of its backlog after an EMFILE:
    11,304 of them (5.3 MB) in 9 s."""
    served = Served(tf, tmp_path / "tfrund.log", nofile=(48, 48))
    clients = []
    try:
        socket_path = str(Layout(tf.home).socket)
        for _ in range(120):  # each holds a descriptor of the daemon until its hello times out
            client = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            client.connect(socket_path)
            clients.append(client)
        time.sleep(4)
        for client in clients:
            client.close()
        wait_for(lambda: tf.run("ps").returncode == 0, what="tfrund to serve again")
        text = served.text()
        assert "out of system resource" in text, text[-2000:]
        assert text.count("out of system resource") <= 2 and len(text) < 20_000, (len(text), text[-3000:])
    finally:
        for client in clients:
            client.close()
        served.stop()


def test_a_file_read_for_pull_ends_where_it_ended_when_asked(tmp_path: Path) -> None:
    """`pull` of a log a job keeps writing chased its end as `logs --tail` did: what is written after the first
    chunk is read is not sent."""
    log = tmp_path / "output.log"
    log.write_bytes(b"x" * (FILE_CHUNK_BYTES * 2 + 5))
    with open(log, "rb") as f:
        reading = jobfiles.chunks(f, 0)
        first = next(reading)
        with open(log, "ab") as job:
            job.write(b"y" * (FILE_CHUNK_BYTES * 10))
        rest = list(reading)
    sent = [first, *rest]
    assert sum(len(c.data) for c in sent) == FILE_CHUNK_BYTES * 2 + 5 and b"y" not in b"".join(c.data for c in sent)
    assert [c.last for c in sent] == [False, False, True]
