"""One daemon per home, whatever races or garbage reach it; the handshake refuses other protocol versions."""

from __future__ import annotations

import asyncio
import hashlib
import json
import os
import socket
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest
from harness import (
    TFRUN,
    TFRUND,
    Tfrun,
    alive,
    gated_job,
    open_fds,
    own_sockets,
    processes_of,
    serving_daemon,
    sockets,
    wait_for,
    write_script,
)

from tfrun.paths import Layout
from tfrun.protocol.channel import Channel
from tfrun.protocol.jobs import JobList, JobReply, ListJobs
from tfrun.protocol.submit import FileEntry, PutBlobs, Submit
from tfrun.protocol.wire import PROTOCOL_VERSION, Hello, encode, read_message, write_message
from tfrun.runner.records.store import SCHEMA_VERSION

pytestmark = [pytest.mark.slow]


def daemons_of(home: Path) -> list[int]:
    """Pids of `tfrund run` processes serving `home`."""
    found = []
    for pid in processes_of(home):
        try:
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if b"tfrun.runner" in cmdline and b"run" in cmdline:
            found.append(pid)
    return found


def test_twenty_submits_from_twenty_processes_get_twenty_jobs_and_one_daemon(tf: Tfrun, project: Path) -> None:
    write_script(project, "hi.py", "import os\nprint('job', os.environ['TFRUN_JOB_ID'])\n")
    clients = [
        subprocess.Popen([*TFRUN, "submit", str(project / "hi.py")], env=tf.env, stdout=-1, stderr=-1, text=True)
        for _ in range(20)
    ]
    outputs = [c.communicate(timeout=120) for c in clients]
    assert [c.returncode for c in clients] == [0] * 20, [err for _, err in outputs]
    ids = sorted(int(out) for out, _ in outputs)
    assert ids == list(range(1, 21))
    assert daemons_of(tf.home) == [tf.daemon_pid()]
    for job_id in ids:
        assert tf.run("wait", str(job_id)).returncode == 0
        assert tf.log(job_id) == f"job {job_id}\n".encode()


@pytest.mark.skipif(
    sys.version_info < (3, 11), reason="Python's -P (it keeps the working folder off sys.path) is 3.11's"
)
def test_a_folder_named_tfrun_where_the_user_stands_does_not_stop_the_daemon(tf: Tfrun, project: Path) -> None:
    """The parent folder of a checkout holds `tfrun/` (without __init__.py): a process started there with `python -m`
    imported it as tfrun, in front of the editable install the README makes, and tfrund could not start."""
    here = project.parent / "parent"
    (here / "tfrun").mkdir(parents=True)
    result = tf.run("submit", "-f", str(write_script(project, "hi.py", "print('hi there')\n")), cwd=here)
    assert (result.returncode, result.stdout) == (0, "hi there\n"), result.stderr


def test_a_second_daemon_on_the_same_home_refuses_to_start(tf: Tfrun) -> None:
    assert tf.daemon("start").returncode == 0
    pid = tf.daemon_pid()
    result = tf.daemon("run")
    assert result.returncode == 1
    assert f"tfrund (pid {pid}) is already running for {tf.home}" in result.stderr
    again = tf.daemon("start")
    assert again.returncode == 0 and f"pid {pid}" in again.stdout
    assert daemons_of(tf.home) == [pid]


def test_status_says_what_a_script_needs(tf: Tfrun, project: Path) -> None:
    stopped = tf.daemon("status", "--json")
    assert stopped.returncode == 1 and json.loads(stopped.stdout)["running"] is False
    write_script(project, "ok.py", "pass\n")
    tf.ok("wait", str(tf.submit(str(project / "ok.py"))))
    status = json.loads(tf.daemon("status", "--json").stdout)
    assert status["pid"] == tf.daemon_pid() and status["version"] and status["protocol"] == PROTOCOL_VERSION
    assert Path(status["socket"]).is_socket() and status["home"] == str(tf.home)
    assert status["jobs"]["succeeded"] == 1 and status["jobs"]["running"] == 0
    assert (Path(status["socket"]).parent.stat().st_mode & 0o777) == 0o700


def test_garbage_on_the_socket_is_refused_and_the_daemon_keeps_serving(tf: Tfrun) -> None:
    tf.daemon("start")
    path = str(tf.home / "run" / "tfrund.sock")

    def exchange(data: bytes) -> bytes:
        with socket.socket(socket.AF_UNIX) as sock:
            sock.settimeout(20)
            sock.connect(path)
            try:
                sock.sendall(data)
                sock.shutdown(socket.SHUT_WR)
            except OSError:
                pass
            chunks = []
            try:
                while chunk := sock.recv(65536):
                    chunks.append(chunk)
            except ConnectionResetError:
                pass  # the daemon hung up with our bytes unread: what it said before is what counts
            return b"".join(chunks)

    idle = socket.socket(socket.AF_UNIX)
    idle.connect(path)  # says nothing at all, and must not hold up anyone else
    assert b"bad_request" in exchange(b"\x00\xff\xfe garbage\n")
    assert b"bad_request" in exchange(b'{"type": "submit"}\n')
    assert b"expected a hello" in exchange(encode(ListJobs()))
    assert b"bad_request" in exchange(b"x" * (17 << 20))
    assert b"middle of a frame" in exchange(os.urandom(4096).replace(b"\n", b""))
    assert tf.ok("ps").strip() == "no jobs on this machine"
    idle.close()
    assert daemons_of(tf.home) == [tf.daemon_pid()]


def test_a_client_of_another_protocol_is_told_both_versions(tf: Tfrun) -> None:
    tf.daemon("start")
    with socket.socket(socket.AF_UNIX) as sock:
        sock.connect(str(tf.home / "run" / "tfrund.sock"))
        sock.sendall(encode(Hello(protocol=99, version="9.9.9", role="client")))
        reply = json.loads(sock.makefile("rb").readline())
    assert reply["type"] == "error" and reply["code"] == "version_mismatch"
    assert (
        "protocol 99" in reply["message"]
        and f"protocol {PROTOCOL_VERSION}" in reply["message"]
        and "9.9.9" in reply["message"]
    )


def test_a_daemon_of_another_protocol_is_refused_by_the_client(tf: Tfrun, tmp_path: Path) -> None:
    """A real peer on the socket that answers like a future tfrund."""
    run_dir = tf.home / "run"
    run_dir.mkdir(parents=True, mode=0o700)
    server = socket.socket(socket.AF_UNIX)
    server.bind(str(run_dir / "tfrund.sock"))
    server.listen()
    client = subprocess.Popen([*TFRUN, "ps"], env=tf.env, stdout=-1, stderr=-1, text=True)
    conn, _ = server.accept()
    conn.makefile("rb").readline()
    conn.sendall(encode(Hello(protocol=PROTOCOL_VERSION + 1, version="2.0.0", role="daemon")))
    _, err = client.communicate(timeout=30)
    conn.close()
    server.close()
    assert client.returncode == 125
    assert err.startswith("tfrun: error: protocol mismatch") and f"protocol {PROTOCOL_VERSION + 1}" in err
    assert "tfrund 2.0.0" in err
    assert len(err.strip().splitlines()) == 1


def test_dial_stdio_bridges_the_protocol_over_a_pipe(tf: Tfrun) -> None:
    bridge = subprocess.Popen([*TFRUND, "dial-stdio"], env=tf.env, stdin=-1, stdout=-1)
    assert bridge.stdin is not None and bridge.stdout is not None
    bridge.stdin.write(
        encode(Hello(protocol=PROTOCOL_VERSION, version="test", role="client")) + encode(ListJobs(all=True))
    )
    bridge.stdin.close()
    data = bridge.stdout.read()
    assert bridge.wait(timeout=30) == 0

    async def parse() -> list[object]:
        reader = asyncio.StreamReader()
        reader.feed_data(data)
        reader.feed_eof()
        return [await read_message(reader), await read_message(reader), await read_message(reader)]

    hello, jobs, end = asyncio.run(parse())
    assert isinstance(hello, Hello) and hello.role == "daemon"
    assert jobs == JobList(jobs=[]) and end is None


def test_a_corrupt_database_is_reported_and_left_untouched(tf: Tfrun) -> None:
    tf.home.mkdir()
    db = tf.home / "tfrun.db"
    db.write_bytes(b"this is not sqlite" * 100)
    before = hashlib.sha256(db.read_bytes()).hexdigest()
    result = tf.run("ps")
    assert result.returncode == 125
    assert (
        result.stderr.startswith("tfrun: error: tfrund cannot start: ")
        and "not a usable tfrun database" in result.stderr
    )
    assert len(result.stderr.strip().splitlines()) == 1
    assert hashlib.sha256(db.read_bytes()).hexdigest() == before


def test_a_foreign_sqlite_database_is_not_taken_over(tf: Tfrun) -> None:
    tf.home.mkdir()
    with sqlite3.connect(tf.home / "tfrun.db") as db:
        db.execute("CREATE TABLE precious (x)")
    result = tf.run("ps")
    assert result.returncode == 125 and "not tfrun's" in result.stderr
    with sqlite3.connect(tf.home / "tfrun.db") as db:
        assert db.execute("SELECT name FROM sqlite_master").fetchall() == [("precious",)]


def test_a_bad_config_file_is_named_in_the_error(tf: Tfrun) -> None:
    tf.home.mkdir()
    (tf.home / "config.toml").write_text("checkpoint_root = [unclosed\n")
    result = tf.run("ps")
    assert result.returncode == 125 and "config.toml" in result.stderr


def test_foreign_and_corrupt_files_in_job_folders_do_not_stop_the_daemon(tf: Tfrun, project: Path, gate: Path) -> None:
    write_script(project, "gated.py", f"import os, time\nwhile not os.path.exists({str(gate)!r}): time.sleep(0.05)\n")
    write_script(project, "fine.py", "print('fine')\n")
    victim = tf.submit(str(project / "gated.py"))
    tf.shim_pid(victim)
    tf.kill_daemon()
    jobs_dir = tf.home / "jobs"
    (jobs_dir / "notes.txt").write_text("mine")
    (jobs_dir / "2").mkdir()  # a stray folder where the next job's would go
    (jobs_dir / "2" / "keep.txt").write_text("precious")
    gate.touch()
    wait_for(lambda: (tf.job_dir(victim) / "exit.json").exists(), what="the job to end")
    (tf.job_dir(victim) / "exit.json").write_text("{not json")
    record = tf.job(victim)
    assert record["state"] == "lost" and "unreadable" in record["reason"]
    fine = tf.submit(str(project / "fine.py"))
    assert fine == 3, "an id whose folder already exists is skipped, never written into"
    assert tf.run("wait", str(fine)).returncode == 0 and tf.log(fine) == b"fine\n"
    assert (jobs_dir / "2" / "keep.txt").read_text() == "precious"
    assert (jobs_dir / "notes.txt").read_text() == "mine"


def test_a_long_home_path_still_gets_a_socket(tmp_path: Path, project: Path) -> None:
    home = tmp_path / ("h" * 60) / ("o" * 60) / "home"
    tf = Tfrun(home)
    try:
        write_script(project, "ok.py", "print('ok')\n")
        job_id = tf.submit(str(project / "ok.py"))
        assert tf.run("wait", str(job_id)).returncode == 0
        socket_path = json.loads(tf.daemon("status", "--json").stdout)["socket"]
        assert len(socket_path) < 108 and (Path(socket_path).parent.stat().st_mode & 0o777) == 0o700
    finally:
        tf.cleanup()


def test_a_database_of_the_first_schema_is_upgraded_and_keeps_its_jobs(tf: Tfrun, project: Path) -> None:
    write_script(project, "x.py", "print('kept')\n")
    job = tf.submit(str(project / "x.py"))
    tf.ok("wait", str(job))
    tf.daemon("stop")
    db = sqlite3.connect(tf.home / "tfrun.db")
    with db:  # what a tfrund of schema 1 left behind: no later columns (nor their index), no alert tables
        db.execute("DROP INDEX jobs_submission")
        db.execute("DROP INDEX jobs_array")
        columns = ("restarted_as", "prepared", "gpus", "waiting", "submission_id", "array_id", "array_index", "cause")
        for column in columns:
            db.execute(f"ALTER TABLE jobs DROP COLUMN {column}")
        for trigger in ("job_updated", "job_deleted", "alerts_added", "alerts_updated", "alerts_deleted"):
            db.execute(f"DROP TRIGGER job_texts_{trigger}")
        for table in ("job_alerts", "watches", "deliveries", "alerts", "daemon", "job_texts", "uploads"):
            db.execute(f"DROP TABLE {table}")
        db.execute("PRAGMA user_version=1")
    db.close()
    assert tf.job(job)["state"] == "succeeded" and tf.log(job) == b"kept\n"
    assert tf.job(job)["restarted_as"] is None and tf.job(job)["cause"] is None
    db = sqlite3.connect(tf.home / "tfrun.db")
    assert db.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION == 10
    db.close()


def test_followers_and_waiters_that_hang_up_are_let_go_at_once(tf: Tfrun, project: Path, gate: Path) -> None:
    """A client that goes away takes its socket, its handle on the log and its polling loop with it, even
    while its job runs on and prints nothing that a write to the dead connection could fail on."""
    write_script(project, "quiet.py", gated_job(1, 1, 0, gate))
    job_id = tf.submit(str(project / "quiet.py"))
    idle = own_sockets(tf.home)
    pid = wait_for(lambda: serving_daemon(tf.home))
    before = len(open_fds(pid))
    followers = [subprocess.Popen([*TFRUN, "logs", "-f", str(job_id)], env=tf.env, stdout=-1) for _ in range(25)]
    waiters = [subprocess.Popen([*TFRUN, "wait", str(job_id)], env=tf.env, stdout=-1) for _ in range(5)]
    wait_for(lambda: sockets(pid) >= idle + 30, timeout=60, what="every client to connect")
    log = str(tf.job_dir(job_id) / "output.log")
    # each follower reads the log through a handle of its own, opened once its request is read (a loaded machine
    # may accept a connection well before that: one CI run counted 24 at the moment all 30 were connected)
    wait_for(lambda: open_fds(pid).count(log) >= 25, timeout=30, what="each follower's own handle on the log")
    for client in [*followers, *waiters]:
        client.kill()
        client.wait()
    wait_for(lambda: len(open_fds(pid)) <= before, timeout=5, what=f"the daemon's {before} descriptors of before")
    assert open_fds(pid).count(log) == 0
    assert tf.job(job_id)["state"] == "running"
    gate.touch()
    assert tf.run("wait", str(job_id)).returncode == 0


def test_one_submit_sent_on_two_connections_at_once_makes_one_job(tf: Tfrun) -> None:
    """What a client whose SSH link dropped mid-submit does: it sends the submit again on a new connection
    while the daemon may still be building the job from the first. Both are answered with the one job."""
    tf.daemon("start")
    contents = {f"data/{i}.txt": f"{i}\n".encode() for i in range(300)}  # a work dir that takes a while
    contents["run.py"] = b"print('once')\n"
    digests = {path: hashlib.sha256(data).hexdigest() for path, data in contents.items()}
    files = [FileEntry("data", "dir", mode=0o755)]
    files += [FileEntry(path, "file", size=len(data), digest=digests[path]) for path, data in contents.items()]
    submit = Submit(files=files, script="run.py", submission_id="f" * 32)

    async def twice() -> list[int]:
        socket_path = str(Layout(tf.home).socket)
        first, second = await Channel.connect_unix(socket_path), await Channel.connect_unix(socket_path)
        blobs = list(contents.values())
        await first.request(PutBlobs(list(digests.values()), [len(b) for b in blobs], b"".join(blobs)))
        await write_message(first.writer, submit)
        await write_message(second.writer, submit)
        replies = [await first.receive(), await second.receive()]
        first.close()
        second.close()
        return [reply.job.id for reply in replies if isinstance(reply, JobReply)]

    ids = asyncio.run(twice())
    assert len(ids) == 2 and ids[0] == ids[1]
    assert [job["id"] for job in tf.jobs()] == ids[:1]
    assert tf.run("wait", str(ids[0])).returncode == 0
    assert tf.log(ids[0]) == b"once\n"


def test_a_daemon_stopped_with_a_client_connected_logs_no_error(tf: Tfrun) -> None:
    """`tfrund stop` is itself a client still connected as the daemon ends: its log says it stopped, with no
    ERROR and no traceback of a cancelled connection (asyncio before Python 3.12 logged one at every stop)."""
    tf.ok("ps")  # starts the daemon
    pid = tf.daemon_pid()
    assert tf.daemon("stop").returncode == 0
    wait_for(lambda: not alive(pid), timeout=30, what="tfrund gone")
    text = (tf.home / "tfrund.log").read_text()
    assert " ERROR " not in text and "Traceback" not in text, text
