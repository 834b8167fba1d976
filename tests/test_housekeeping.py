"""Housekeeping: `tfrun rm`, `prune` and `df`, the collection of uploaded contents no job needs, the cap on
them, and the question before a large upload. Real daemons, real folders, sizes checked against `du`."""

from __future__ import annotations

import asyncio
import hashlib
import json
import os
import re
import shlex
import sqlite3
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest
from harness import TFRUN, Mailbox, Tfrun, gated_job, local_and_ssh, wait_for, write_script

from tfrun.client.cli.diskspace import should_ask
from tfrun.paths import Layout
from tfrun.protocol.channel import Channel
from tfrun.protocol.jobs import JobReply
from tfrun.protocol.submit import FileEntry, HaveBlobs, MissingBlobs, Submit
from tfrun.sizes import parse_size

pytestmark = [pytest.mark.slow]


def daemon_config(tf: Tfrun, text: str) -> None:
    """The box's config.toml, before its daemon starts (over SSH too: the box's daemon reads it)."""
    tf.home.mkdir(mode=0o700, parents=True, exist_ok=True)
    (tf.home / "config.toml").write_text(text)


def sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def blob(tf: Tfrun, digest: str) -> Path:
    return tf.home / "blobs" / digest[:2] / digest


def du(path: Path) -> int:
    """Bytes on disk under `path`, as `du` counts them."""
    return int(subprocess.run(["du", "-sB1", str(path)], capture_output=True, text=True, check=True).stdout.split()[0])


def spare_names(tf: Tfrun, digest: str) -> bool:
    return any(digest in path.read_text() for path in tf.home.glob("spares/*/files.json"))


def alerts(tf: Tfrun) -> list[dict[str, Any]]:
    return json.loads(tf.ok("alerts", "--json"))  # type: ignore[no-any-return]


def run_job(tf: Tfrun, *args: str) -> int:
    job = tf.submit(*args)
    tf.run("wait", str(job))
    return job


@local_and_ssh
def test_rm_removes_an_ended_job_its_records_and_the_contents_only_it_needed(tf: Tfrun, project: Path) -> None:
    daemon_config(tf, 'blob_grace = "0s"\n')
    train = write_script(project, "train.py", "import sys\nsys.exit(1)\n")  # fails: a `failed` alert
    data = project / "a.dat"
    data.write_bytes(os.urandom(50_000))
    only_first = sha(data)
    first = run_job(tf, str(train))
    data.unlink()
    (project / "b.dat").write_bytes(os.urandom(50_000))
    second = run_job(tf, str(train))
    wait_for(lambda: spare_names(tf, sha(project / "b.dat")), what="the spare of the second snapshot")
    wait_for(lambda: len(alerts(tf)) == 2, what="both jobs' alerts")

    result = tf.run("rm", str(first))
    assert result.returncode == 0, result.stderr
    assert f"removed job {first}" in result.stdout
    assert "1 uploaded content(s) no job needs" in result.stderr
    assert not tf.job_dir(first).exists() and tf.job_dir(second).exists()
    assert tf.run("status", str(first)).returncode == 3
    assert not blob(tf, only_first).exists()
    assert blob(tf, sha(project / "b.dat")).exists() and blob(tf, sha(train)).exists()
    assert [a["job_id"] for a in alerts(tf)] == [second]
    db = sqlite3.connect(tf.home / "tfrun.db")
    for table in ("events", "job_alerts", "watches", "alerts"):
        assert db.execute(f"SELECT count(*) FROM {table} WHERE job_id=?", (first,)).fetchone() == (0,), table
    db.close()
    assert tf.run("restart", str(second)).returncode == 0  # what the kept job needs is all there


def test_rm_refuses_a_job_that_has_not_ended_and_one_that_does_not_exist(tf: Tfrun, project: Path, gate: Path) -> None:
    """Each refusal is an error line as any verb's (`no job '77'` followed by `freed 0 B: ...` was all rm said,
    without the prefix), and nothing is counted as freed after refusals alone; cancel's refusals likewise."""
    job = tf.submit(str(write_script(project, "wait.py", gated_job(1, 0, 0, gate))))
    result = tf.run("rm", str(job))
    assert result.returncode == 1 and result.stdout == "", result.stdout
    assert re.fullmatch(f"tfrun: error: job {job} is (queued|running): cancel it first\n", result.stderr), result.stderr
    assert tf.job_dir(job).exists()
    both = tf.run("rm", "77", str(job))
    assert both.returncode == 3 and both.stderr.splitlines()[0] == "tfrun: error: no job '77' on this machine"
    assert len(both.stderr.splitlines()) == 2 and both.stderr.splitlines()[1].startswith("tfrun: error: "), both.stderr
    gate.touch()
    tf.run("wait", str(job))
    ended = tf.run("cancel", str(job), "77")
    assert ended.returncode == 3 and ended.stdout == "", ended.stdout
    assert ended.stderr.splitlines() == [f"tfrun: error: job {job} already ended (succeeded)",
                                         "tfrun: error: no job '77' on this machine"]  # fmt: skip
    removed = tf.run("rm", str(job))
    assert removed.returncode == 0 and removed.stdout.startswith(f"removed job {job} (")
    assert removed.stderr.startswith("freed "), removed.stderr
    assert not tf.job_dir(job).exists()


RESTARTED = """\
import os, sys, time
marker = os.path.join(os.environ["TFRUN_CHECKPOINT_DIR"], "ckpt-1")
if not os.path.exists(marker):
    with open(marker, "w") as f:
        f.write("x" * 10000)
    sys.exit(1)
while not os.path.exists(GATE):
    time.sleep(0.05)
"""


def test_a_restart_chain_keeps_what_it_shares(tf: Tfrun, project: Path, gate: Path) -> None:
    script = write_script(project, "resume.py", RESTARTED.replace("GATE", repr(str(gate))))
    first = tf.submit("--max-restarts", "1", "--restart-on", "error", str(script))
    second = wait_for(lambda: tf.job(first)["restarted_as"], what="the restart")
    checkpoints = Path(tf.job(first)["checkpoint_dir"])
    refused = tf.run("rm", "--checkpoints", str(first))
    assert refused.returncode == 1 and f"job {second}" in refused.stderr and "runs it again" in refused.stderr
    gate.touch()
    assert tf.run("wait", str(second)).returncode == 0
    removed = tf.run("rm", "--checkpoints", str(first))
    assert removed.returncode == 0, removed.stderr
    assert "which a kept job shares" in removed.stdout
    assert (checkpoints / "ckpt-1").exists()
    tf.ok("rm", "--checkpoints", str(second))
    assert not checkpoints.exists()


def test_prune_picks_by_age_and_rank_and_a_dry_run_removes_nothing(tf: Tfrun, project: Path) -> None:
    script = write_script(
        project, "ckpt.py", "import os\nopen(os.path.join(os.environ['TFRUN_CHECKPOINT_DIR'], 'c'), 'w').write('x')\n"
    )
    old = [run_job(tf, str(script)), run_job(tf, str(script))]
    time.sleep(6)
    new = [run_job(tf, str(script)), run_job(tf, str(script))]
    checkpoints = [Path(tf.job(job)["checkpoint_dir"]) for job in old]

    dry = tf.run("prune", "--older-than", "5s", "--dry-run")
    assert dry.returncode == 0, dry.stderr
    assert [line.split()[3] for line in dry.stdout.splitlines()] == [str(job) for job in old]
    assert all(tf.job_dir(job).exists() for job in old + new)

    tf.ok("prune", "--keep-last", "3")
    assert not tf.job_dir(old[0]).exists() and tf.job_dir(old[1]).exists()
    assert (checkpoints[0] / "c").exists()  # not asked to remove checkpoints

    tf.ok("prune", "--older-than", "5s", "--checkpoints")
    assert not checkpoints[1].exists()
    assert [job["id"] for job in tf.jobs()] == new


@local_and_ssh
def test_df_figures_match_du(tf: Tfrun, project: Path) -> None:
    checkpoint = "import os\nopen(os.path.join(os.environ['TFRUN_CHECKPOINT_DIR'], 'c'), 'w').write('x' * 30000)\n"
    script = write_script(project, "ckpt.py", checkpoint)
    (project / "data.bin").write_bytes(os.urandom(200_000))
    run_job(tf, str(script))
    wait_for(lambda: spare_names(tf, sha(project / "data.bin")), what="the spare")
    wait_for(lambda: alerts(tf), what="its `done` alert, the daemon's last write for it")
    report = json.loads(tf.ok("df", "--json"))
    sizes = {folder["name"]: folder["bytes"] for folder in report["folders"]}
    home = tf.home
    assert sizes["jobs"] + sizes["logs"] == du(home / "jobs")
    assert sizes["logs"] == sum(du(path) for path in home.glob("jobs/*/output.*"))
    for name in ("blobs", "spares", "checkpoints"):
        assert sizes[name] == du(home / name), name
    assert sizes["blobs"] >= 200_000 and report["unneeded"] == 0
    assert sum(sizes.values()) == du(home)
    text = tf.ok("df")
    assert "blobs" in text and "checkpoints" in text and "total" in text


def test_the_blob_cap_collects_the_oldest_contents_no_job_needs(tf: Tfrun, project: Path) -> None:
    daemon_config(tf, 'max_blob_bytes = "250kB"\nblob_grace = "0s"\n')
    train = write_script(project, "train.py", "print('ok')\n")
    data = project / "data.bin"
    unneeded = []
    for _ in range(3):  # each refused after its contents arrived: no job needs them
        data.write_bytes(os.urandom(100 << 10))
        unneeded.append(sha(data))
        assert tf.run("submit", "--after", "999", str(train)).returncode == 3
    assert all(blob(tf, digest).exists() for digest in unneeded)  # nothing collected without a submit
    data.write_bytes(os.urandom(100 << 10))
    tf.submit(str(train))
    wait_for(lambda: not blob(tf, unneeded[1]).exists(), what="the cap to collect")
    assert not blob(tf, unneeded[0]).exists()
    assert blob(tf, unneeded[2]).exists() and blob(tf, sha(data)).exists() and blob(tf, sha(train)).exists()


def test_a_content_that_a_submit_in_flight_was_told_of_is_not_collected(tf: Tfrun, project: Path) -> None:
    daemon_config(tf, 'blob_grace = "0s"\n')
    train = write_script(project, "train.py", "print(open('data.txt').read())\n")
    (project / "data.txt").write_text("hello")
    assert tf.run("submit", "--after", "999", str(train)).returncode == 3  # its contents stay, needed by none
    files = [
        FileEntry(name, "file", 0o644, (project / name).stat().st_size, sha(project / name))
        for name in ("data.txt", "train.py")
    ]

    async def in_flight() -> int:
        channel = await Channel.connect_unix(str(Layout(tf.home).socket))
        try:
            answer = await channel.request(HaveBlobs([entry.digest or "" for entry in files]))
            assert isinstance(answer, MissingBlobs) and answer.digests == []
            pruned = await asyncio.get_running_loop().run_in_executor(None, tf.run, "prune")
            assert pruned.returncode == 0 and "0 uploaded content(s)" in pruned.stderr
            reply = await channel.request(Submit(files=files, script="train.py"))
            assert isinstance(reply, JobReply)
            return reply.job.id
        finally:
            channel.close()

    job = asyncio.run(in_flight())
    assert tf.run("wait", str(job)).returncode == 0
    assert tf.log(job) == b"hello\n"
    tf.ok("rm", str(job))
    assert not any(blob(tf, entry.digest or "").exists() for entry in files)


def test_the_alerts_of_a_removed_job_are_never_sent(tf: Tfrun, project: Path) -> None:
    mailbox = Mailbox()  # not started yet: the mail server is down
    fails = write_script(project, "fails.py", "raise SystemExit(3)\n")
    job = run_job(tf, "--notify", mailbox.url, "--no-alert", "all", "--alert", "failed", str(fails))
    wait_for(lambda: [a for a in alerts(tf) if a["deliveries"] and a["deliveries"][0]["attempts"]], what="a try")
    tf.ok("rm", str(job))
    mailbox.start()
    try:
        started = time.monotonic()
        control = run_job(tf, "--notify", mailbox.url, "--no-alert", "all", "--alert", "failed", str(fails))
        wait_for(lambda: mailbox.messages, what="the control job's mail")
        time.sleep(max(0.0, 7 - (time.monotonic() - started)))  # the first job's retries were due at 2 s, 4 s
        subjects = [subject for subject, _ in mailbox.texts()]
        assert len(subjects) == 1 and f"job {control} on " in subjects[0], subjects
    finally:
        mailbox.stop()


def test_the_upload_question_is_asked_only_where_someone_can_answer() -> None:
    assert should_ask(2_000, 1_000, yes=False, interactive=True)
    assert not should_ask(2_000, 1_000, yes=True, interactive=True)
    assert not should_ask(2_000, 1_000, yes=False, interactive=False)
    assert not should_ask(1_000, 1_000, yes=False, interactive=True)
    assert not should_ask(2_000, 0, yes=False, interactive=True)
    assert [parse_size(text) for text in ("1GB", "500 MB", "2GiB", "100kB", 7, "x", "-1", True)] == [
        10**9, 500 * 10**6, 2 << 30, 100_000, 7, None, None, None,
    ]  # fmt: skip


def in_tmux(tf: Tfrun, server: str, args: str, exit_file: Path) -> None:
    """Run `tfrun ARGS` in a fresh tmux terminal, its exit code into `exit_file` once it ends."""
    env = " ".join(f"{k}={shlex.quote(v)}" for k, v in tf.env.items() if k.startswith(("TFRUN_", "HOME", "PATH")))
    command = f"env {env} {shlex.join(TFRUN)} {args}; echo $? > {exit_file}; sleep 30"
    subprocess.run(["tmux", "-L", server, "new-session", "-d", "-x", "150", "-y", "20", command], check=True)


def screen(server: str) -> str:
    return subprocess.run(["tmux", "-L", server, "capture-pane", "-pJ"], capture_output=True, text=True).stdout


def test_a_large_upload_is_asked_about_on_a_terminal(tf: Tfrun, project: Path, tmux: str, tmp_path: Path) -> None:
    config = tf.client_home / ".config" / "tfrun" / "config.toml"
    config.parent.mkdir(parents=True, exist_ok=True)
    config.write_text('confirm_upload_bytes = "50kB"\n')
    train = write_script(project, "train.py", "print('ok')\n")
    (project / "data.bin").write_bytes(os.urandom(100_000))
    answered = tmp_path / "answered"
    in_tmux(tf, tmux, f"submit {train}", answered)
    wait_for(lambda: "send 100.0 kB in 2 file(s) to" in screen(tmux), what="the question")
    subprocess.run(["tmux", "-L", tmux, "send-keys", "n", "Enter"], check=True)
    assert wait_for(lambda: answered.exists() and answered.read_text().strip(), what="the answer") == "1"
    assert "not sent" in screen(tmux) and "nothing was submitted" in screen(tmux)
    assert tf.jobs() == []

    skipped = tmp_path / "skipped"
    in_tmux(tf, f"{tmux}-2", f"submit --yes {train}", skipped)
    assert wait_for(lambda: skipped.exists() and skipped.read_text().strip(), what="the submit") == "0"
    assert "send " not in screen(f"{tmux}-2")
    (project / "data.bin").write_bytes(os.urandom(100_000))
    piped = tf.run("submit", str(train))  # no terminal: nobody to ask
    assert piped.returncode == 0 and "send " not in piped.stderr
    assert len(tf.jobs()) == 2


def test_a_size_that_is_none_is_a_one_line_error_in_either_config(tf: Tfrun, project: Path) -> None:
    daemon_config(tf, 'max_blob_bytes = "lots"\n')
    refused = tf.run("df")
    assert refused.returncode == 125 and "max_blob_bytes must be a size such as 20GB" in refused.stderr
    config = tf.client_home / ".config" / "tfrun" / "config.toml"
    config.parent.mkdir(parents=True, exist_ok=True)
    config.write_text('confirm_upload_bytes = "a lot"\n')
    result = tf.run("submit", str(write_script(project, "train.py", "print('ok')\n")))
    assert result.returncode == 2 and "confirm_upload_bytes must be a size" in result.stderr
