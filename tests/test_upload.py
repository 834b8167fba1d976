"""Snapshots and pulls: what is sent, what is not, what is sent again, and that no name writes outside."""

from __future__ import annotations

import ast
import asyncio
import hashlib
import json
import os
import re
import subprocess
import time
from pathlib import Path

import pytest
from harness import Tfrun, local_and_ssh, wait_for, write_script

from tfrun.paths import Layout
from tfrun.protocol.channel import Channel, RemoteError
from tfrun.protocol.submit import FileEntry, HaveBlobs, PutBlob, PutBlobs, Submit

pytestmark = [pytest.mark.slow]


def uploaded(stderr: str) -> tuple[int, int]:
    """(files sent, files in the snapshot) from submit's report."""
    match = re.search(r"uploaded (\d+) of (\d+) files", stderr)
    assert match, stderr
    return int(match[1]), int(match[2])


@local_and_ssh
def test_a_resubmit_of_an_unchanged_work_dir_sends_no_file_bytes(tf: Tfrun, project: Path) -> None:
    for i in range(1000):
        folder = project / f"pkg{i % 10}"
        folder.mkdir(exist_ok=True)
        (folder / f"mod{i}.py").write_text(f"VALUE = {i}\n")
    write_script(project, "train.py", "import pkg3.mod3\nprint(pkg3.mod3.VALUE)\n")
    first = tf.run("submit", str(project / "train.py"))
    assert uploaded(first.stderr) == (1001, 1001)
    again = tf.run("submit", str(project / "train.py"))
    assert uploaded(again.stderr) == (0, 1001)
    (project / "pkg3" / "mod3.py").write_text("VALUE = 'changed'\n")
    changed = tf.run("submit", "-f", str(project / "train.py"))
    assert uploaded(changed.stderr) == (1, 1001)
    assert changed.stdout == "changed\n"
    assert tf.job(3)["files"] == 1011  # 1001 files and 10 folders


@local_and_ssh
def test_ignore_files_are_honoured_and_git_state_recorded(tf: Tfrun, project: Path) -> None:
    subprocess.run(["git", "init", "-q", str(project)], check=True)
    write_script(project, ".gitignore", "*.ckpt\n/data/\n!keep.ckpt\n")
    write_script(project, ".tfrunignore", "notes/\n")
    for name in ("a.ckpt", "keep.ckpt", "data/big.bin", "notes/todo.txt", "src/data/real.py", "sub/x.ckpt"):
        (project / name).parent.mkdir(parents=True, exist_ok=True)
        (project / name).write_text(name)
    (project / "sub" / ".gitignore").write_text("local.txt\n")
    (project / "sub" / "local.txt").write_text("x")
    write_script(
        project, "list.py", "import os\nprint(sorted(os.path.join(r, f) for r, _, fs in os.walk('.') for f in fs))\n"
    )
    git = ["git", "-C", str(project), "-c", "user.email=t@t", "-c", "user.name=t"]
    subprocess.run([*git, "add", "-A"], check=True)
    subprocess.run([*git, "commit", "-qm", "init"], check=True)
    head = subprocess.run([*git, "rev-parse", "HEAD"], capture_output=True, text=True, check=True).stdout.strip()

    result = tf.run("submit", "-f", str(project / "list.py"))
    assert result.returncode == 0, result.stderr
    seen = ast.literal_eval(result.stdout)
    assert seen == [
        "./.gitignore", "./.tfrunignore", "./keep.ckpt", "./list.py", "./src/data/real.py", "./sub/.gitignore",
    ]  # fmt: skip
    record = tf.job(1)
    assert (record["git_commit"], record["git_dirty"]) == (head, False)
    (project / "list.py").write_text("print('edited')\n")
    tf.ok("submit", str(project / "list.py"))
    assert tf.job(2)["git_dirty"] is True


def test_an_ignored_script_is_refused_before_anything_is_sent(tf: Tfrun, project: Path) -> None:
    write_script(project, ".tfrunignore", "*.py\n")
    write_script(project, "train.py", "pass\n")
    result = tf.run("submit", str(project / "train.py"))
    assert result.returncode == 2
    assert (
        result.stderr == f"tfrun: error: train.py is ignored by {project / '.tfrunignore'}, so it would not be sent\n"
    )


def test_a_large_snapshot_is_announced_with_its_largest_files(tf: Tfrun, project: Path) -> None:
    with open(project / "weights.bin", "wb") as f:
        f.truncate(120 << 20)
    write_script(project, "train.py", "pass\n")
    result = tf.run("submit", str(project / "train.py"))
    assert result.returncode == 0, result.stderr
    assert "warning: the work dir snapshot holds 125.8 MB" in result.stderr
    assert "weights.bin (125.8 MB)" in result.stderr and ".tfrunignore" in result.stderr


@local_and_ssh
def test_names_that_are_not_utf8_arrive_as_the_same_bytes(tf: Tfrun, project: Path) -> None:
    name = b"caf\xe9 \xff.txt"
    fd = os.open(os.fsencode(project) + b"/" + name, os.O_WRONLY | os.O_CREAT)
    os.write(fd, b"latin-1 name")
    os.close(fd)
    write_script(project, "ls.py", "import os\nprint(sorted(n for n in os.listdir(b'.') if n.endswith(b'.txt')))\n")
    result = tf.run("submit", "-f", str(project / "ls.py"))
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == repr([name])


async def _raw_submit(layout: Layout, files: list[FileEntry], blobs: dict[str, bytes]) -> str:
    """Send a hand-made manifest straight to the daemon, as a hostile client could; return its answer."""
    channel = await Channel.connect_unix(str(layout.socket))
    try:
        await channel.request(HaveBlobs(list(blobs)))
        for digest, data in blobs.items():
            await channel.request(PutBlob(digest, 0, True, data))
        await channel.request(Submit(files=files, script="run.py"))
        return "accepted"
    except RemoteError as exc:
        return exc.message
    finally:
        channel.close()


@pytest.mark.parametrize(
    "files, complaint",
    [
        ([FileEntry("../escape.py", "file")], "not a plain relative path"),
        ([FileEntry("/etc/cron.d/x", "file")], "not a plain relative path"),
        ([FileEntry("a/../../x", "file")], "not a plain relative path"),
        ([FileEntry("./run.py", "file")], "not a plain relative path"),
        ([FileEntry("out", "symlink", target="/tmp"), FileEntry("out/run.py", "file")], "is not a listed folder"),
        ([FileEntry("deep/run.py", "file")], "is not a listed folder"),
        ([FileEntry("run.py", "file"), FileEntry("run.py", "file")], "listed twice"),
        ([FileEntry("run.py", "file", digest="0" * 64)], "never uploaded"),
        ([FileEntry("run.py", "dir")], "not among the files sent"),
    ],
)
def test_hostile_manifests_never_write_outside_the_job(
    tf: Tfrun, files: list[FileEntry], complaint: str, tmp_path: Path
) -> None:
    tf.daemon("start")
    data = b"print('owned')\n"
    digest = hashlib.sha256(data).hexdigest()
    for entry in files:
        if entry.kind == "file" and entry.digest is None:
            entry.digest = digest
    before = sorted(p.name for p in tmp_path.iterdir())
    answer = asyncio.run(_raw_submit(Layout(tf.home), files, {digest: data}))
    assert complaint in answer
    assert sorted(p.name for p in tmp_path.iterdir()) == before
    assert not Path("/tmp/run.py").exists() and not Path("/escape.py").exists()
    assert json.loads(tf.ok("ps", "-a", "--json")) == []


def test_a_blob_whose_bytes_do_not_match_its_name_is_refused(tf: Tfrun) -> None:
    tf.daemon("start")
    answer = asyncio.run(
        _raw_submit(Layout(tf.home), [FileEntry("run.py", "file", digest="1" * 64)], {"1" * 64: b"other bytes"})
    )
    assert "does not match its digest" in answer


def test_the_same_content_sent_packed_by_many_clients_at_once_is_kept_for_each(tf: Tfrun) -> None:
    """Twenty submits of one script upload its bytes at once (CI saw one of them told `tfrund internal error`):
    each connection's packed contents go through partials of its own."""
    tf.daemon("start")
    data = os.urandom(512 * 1024)  # long enough to write that two writes of it overlap
    digest = hashlib.sha256(data).hexdigest()

    async def one_client() -> list[str]:
        channel = await Channel.connect_unix(str(Layout(tf.home).socket))
        answers = []
        try:
            for _ in range(25):
                try:
                    await channel.request(PutBlobs([digest], [len(data)], data))
                    answers.append("ok")
                except RemoteError as exc:
                    answers.append(exc.message)
        finally:
            channel.close()
        return answers

    async def all_clients() -> list[list[str]]:
        return await asyncio.gather(*(one_client() for _ in range(8)))

    answers = [answer for client in asyncio.run(all_clients()) for answer in client]
    assert answers == ["ok"] * 200, sorted(set(answers))
    assert (Layout(tf.home).blobs_dir / digest[:2] / digest).read_bytes() == data
    assert not list((Layout(tf.home).blobs_dir / "incoming").iterdir())


@local_and_ssh
def test_pull_brings_back_checkpoints_and_work_files_and_nothing_else(tf: Tfrun, project: Path, tmp_path: Path) -> None:
    write_script(
        project,
        "save.py",
        "import os\n"
        "ckpt = os.environ['TFRUN_CHECKPOINT_DIR']\n"
        "os.makedirs(os.path.join(ckpt, 'step-100'))\n"
        "open(os.path.join(ckpt, 'step-100', 'weights.bin'), 'wb').write(bytes(range(256)) * 4096)\n"
        "os.symlink('/etc', os.path.join(ckpt, 'sneaky'))\n"
        "os.makedirs('results')\n"
        "open('results/metrics.json', 'w').write('{\"acc\": 0.9}')\n",
    )
    job_id = tf.submit(str(project / "save.py"))
    assert tf.run("wait", str(job_id)).returncode == 0
    dest = tmp_path / "back"
    result = tf.run("pull", str(job_id), "--to", str(dest))
    assert result.returncode == 0, result.stderr
    assert (dest / "checkpoints" / "step-100" / "weights.bin").read_bytes() == bytes(range(256)) * 4096
    assert not (dest / "checkpoints" / "sneaky").exists(), "symlinks are not followed or recreated"
    assert "pulled 1 file(s)" in result.stderr
    tf.ok("pull", str(job_id), "work/results", "output.log", "--to", str(dest))
    assert (dest / "results" / "metrics.json").read_text() == '{"acc": 0.9}'
    assert (dest / "output.log").exists()
    for hostile in ("../..", "/etc/passwd", "checkpoints/sneaky/passwd", "work/../../../etc"):
        refused = tf.run("pull", str(job_id), hostile, "--to", str(dest))
        assert refused.returncode == 2, (hostile, refused.stderr)
        assert "Traceback" not in refused.stderr
    assert not (dest / "passwd").exists()
    missing = tf.run("pull", str(job_id), "work/nothing-here", "--to", str(dest))
    assert missing.returncode == 2 and "has no work/nothing-here" in missing.stderr


def _tree(root: Path) -> dict[str, tuple[str, object]]:
    """Every entry under `root`: its kind and what matters of it (content, exec bit, link target)."""
    found: dict[str, tuple[str, object]] = {}
    for folder, dirs, files in os.walk(root):
        for name in dirs + files:
            path = Path(folder, name)
            key = str(path.relative_to(root))
            if path.is_symlink():
                found[key] = ("symlink", os.readlink(path))
            elif path.is_dir():
                found[key] = ("dir", None)
            else:
                found[key] = ("file", (path.read_bytes(), os.access(path, os.X_OK)))
    return found


def test_a_resubmit_patches_the_spare_copy_and_every_job_still_gets_its_own(tf: Tfrun, project: Path) -> None:
    for i in range(200):
        (project / f"pkg{i % 5}").mkdir(exist_ok=True)
        (project / f"pkg{i % 5}" / f"mod{i}.py").write_text(f"VALUE = {i}\n")
    (project / "gone").mkdir()
    (project / "gone" / "inner.txt").write_text("inner")
    (project / "becomes_dir").write_text("a file for now")
    (project / "link").symlink_to("pkg0")
    write_script(project, "train.py", "open('pkg0/mod0.py', 'a').write('# the job wrote this\\n')\n")
    first = tf.submit(str(project / "train.py"))
    tf.ok("wait", str(first))
    spares = tf.home / "spares"
    wait_for(lambda: list(spares.glob("*/files.json")), what="the spare copy")
    made = time.time()

    (project / "pkg1" / "mod1.py").write_text("VALUE = 'changed'\n")
    (project / "pkg2" / "mod2.py").unlink()
    (project / "pkg3" / "new.py").write_text("NEW = 1\n")
    (project / "pkg4" / "mod4.py").chmod(0o755)
    (project / "gone" / "inner.txt").unlink()
    (project / "gone").rmdir()
    (project / "becomes_dir").unlink()
    (project / "becomes_dir").mkdir()
    (project / "becomes_dir" / "x.txt").write_text("x")
    (project / "link").unlink()
    (project / "link").symlink_to("pkg1")
    second = tf.submit(str(project / "train.py"))
    tf.ok("wait", str(second))
    work = tf.job_dir(second) / "work"
    expected = _tree(project)
    expected["pkg0/mod0.py"] = ("file", (b"VALUE = 0\n# the job wrote this\n", False))
    assert _tree(work) == expected
    unchanged = work / "pkg0" / "mod5.py"
    assert unchanged.stat().st_mtime < made, "the unchanged files came from the spare, not from a fresh copy"
    assert (tf.job_dir(first) / "work" / "pkg0" / "mod0.py").read_text().count("the job wrote this") == 1
    assert (tf.job_dir(first) / "work" / "gone" / "inner.txt").read_text() == "inner", "job 1 kept its own copy"


def test_a_work_dir_that_holds_tfrun_home_does_not_send_it(tmp_path: Path) -> None:
    """Submitting a script from a folder that holds the daemon's own home (`~/train.py` with TFRUN_HOME under
    ~) sent tfrun's database and logs, which the daemon writes while they are read: the submit failed with
    "content of 1e6a34cdd7ff does not match its digest". The snapshot never enters TFRUN_HOME."""
    work = tmp_path / "work"
    work.mkdir()
    tf = Tfrun(work / "tfrun-home", client_home=tmp_path / "client-home")
    try:
        write_script(work, "run.py", "import os; print(sorted(os.listdir('.')))\n")
        (work / "data.txt").write_text("kept\n")
        job = tf.submit(str(work / "run.py"))
        tf.ok("wait", str(job))
        assert tf.log(job).decode().strip() == "['data.txt', 'run.py']"
    finally:
        tf.cleanup()


@pytest.mark.parametrize("size", [100, 600 << 10], ids=["packed", "chunked"])
def test_a_file_that_changes_while_it_is_sent_is_named_in_one_line(tf: Tfrun, project: Path, size: int) -> None:
    """A file written to between the snapshot and its upload (a log in the work dir) is named, with what to
    do, instead of the daemon's refusal of bytes that do not match their digest; nothing is submitted."""
    from tfrun.client.errors import TfrunError
    from tfrun.client.files.snapshot import scan
    from tfrun.client.files.transfer import upload

    tf.daemon("start")
    (project / "grow.log").write_bytes(b"x" * size)
    snapshot = scan(project, local=True)
    snapshot.hash(lambda n: None)
    (project / "grow.log").write_bytes(b"y" * size)  # the same size, other bytes: only the content tells

    async def send() -> str:
        channel = await Channel.connect_unix(str(Layout(tf.home).socket))
        try:
            await upload(channel, snapshot)
        except TfrunError as exc:
            return exc.message
        finally:
            channel.close()
        return "sent"

    message = asyncio.run(send())
    assert message == "grow.log changed while it was being sent; submit again, or leave it out with a .tfrunignore line"
    assert json.loads(tf.ok("ps", "-a", "--json")) == []
