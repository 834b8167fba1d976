"""What a pull writes and where checkpoints live, against a hostile daemon and a hostile co-user (issue 44).

A pull writes only under what was asked, in the folder the user gave: a daemon that answers at the user's socket
(another user's listener, issue 44's finding 1) is played by `Hostile`, a real server on the Unix socket speaking
the protocol, whose listing names `.git/hooks/pre-commit`, `../x`, absolute paths and a setuid mode. A real tfrund
covers what a job can make itself (a setuid mode, a FIFO), a link already in the destination, and `mallory`, a
second real user, who owns folders and files in a shared destination and renames a job's checkpoint folder on a
root without the sticky bit.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import stat
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Optional

import pytest
from harness import Tfrun, otheruser, write_script
from harness.otheruser import OtherUser

from tfrun.paths import Layout
from tfrun.protocol.channel import Channel, RemoteError, daemon_hello
from tfrun.protocol.fields import JobState
from tfrun.protocol.files import FileChunk, FileList, ListFiles, ReadFile
from tfrun.protocol.jobs import Job
from tfrun.protocol.services import ServiceReply, StartService
from tfrun.protocol.submit import FileEntry
from tfrun.protocol.wire import Error, read_message, write_message

mallory = otheruser.mallory

WEIGHTS = bytes(range(256)) * 64
HOOK = b"#!/bin/sh\nid\n"


def umasked(mode: int) -> int:
    """The mode a new file of `mode`'s permission bits gets under this process's umask."""
    umask = os.umask(0o022)
    os.umask(umask)
    return mode & 0o777 & ~umask


class Hostile:
    """A daemon at `tf`'s socket that lists `listing` for any path and serves each file's bytes from `contents`."""

    def __init__(
        self, tf: Tfrun, listing: list[FileEntry], contents: dict[str, bytes], service: Optional[ServiceReply] = None
    ) -> None:
        self.listing, self.contents, self.service = listing, contents, service
        self.asked: list[str] = []
        socket = Layout(tf.home).socket
        socket.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        self.loop = asyncio.new_event_loop()
        self.server = self.loop.run_until_complete(asyncio.start_unix_server(self.serve, str(socket)))
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()

    async def serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_message(reader)
        await write_message(writer, daemon_hello())
        while (request := await read_message(reader)) is not None:
            if isinstance(request, ListFiles):
                await write_message(writer, FileList(self.listing))
            elif isinstance(request, StartService) and self.service is not None:
                await write_message(writer, self.service)
            elif isinstance(request, ReadFile):
                self.asked.append(request.path)
                await write_message(writer, FileChunk(offset=0, last=True, data=self.contents.get(request.path, b"")))
            else:
                await write_message(writer, Error("invalid", f"{type(request).__name__} is not played here"))
        writer.close()

    def stop(self) -> None:
        self.server.close()
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(timeout=10)


@pytest.fixture
def outside(tmp_path: Path) -> Path:
    """A folder of the user's beside the destination, with a file, that no pull may touch."""
    folder = tmp_path / "outside"
    folder.mkdir()
    (folder / "notes.txt").write_text("mine")
    return folder


def untouched(folder: Path) -> bool:
    return sorted(os.listdir(folder)) == ["notes.txt"] and (folder / "notes.txt").read_text() == "mine"


def test_a_hostile_daemon_gets_nothing_written_outside_what_was_asked(tf: Tfrun, tmp_path: Path, outside: Path) -> None:
    dest = tmp_path / "repo"
    (dest / ".git" / "hooks").mkdir(parents=True)
    (dest / "checkpoints").mkdir()
    (dest / "checkpoints" / "linked").symlink_to(outside)
    (dest / "checkpoints" / "notes.txt").symlink_to(outside / "notes.txt")
    listing = [
        FileEntry("checkpoints", "dir", mode=0o700),
        FileEntry("checkpoints/step-1/weights.bin", "file", mode=0o4777, size=len(WEIGHTS)),
        FileEntry(".git/hooks/pre-commit", "file", mode=0o777, size=9),
        FileEntry("../x", "file", size=9),
        FileEntry(f"{tmp_path}/abs", "file", size=9),
        FileEntry("checkpoints/linked/planted", "file", size=9),
        FileEntry("checkpoints/notes.txt", "file", size=9),
    ]
    asked, result = pull_from(tf, listing, {e.path: HOOK for e in listing} | {listing[1].path: WEIGHTS}, dest)
    assert asked == [listing[1].path], "only the file under checkpoints/ was fetched"
    weights = dest / "checkpoints" / "step-1" / "weights.bin"
    assert weights.read_bytes() == WEIGHTS
    assert stat.S_IMODE(weights.stat().st_mode) == umasked(0o777) | 0o600, "no setuid bit, the umask applied"
    assert os.listdir(dest / ".git" / "hooks") == []
    assert not (tmp_path / "x").exists() and not (tmp_path / "abs").exists()
    assert untouched(outside) and (dest / "checkpoints" / "linked").is_symlink()
    assert result.returncode == 1
    (line,) = result.stderr.splitlines()
    assert line.startswith(f"tfrun: error: pulled 1 file(s), 16.4 kB, into {dest}/checkpoints, and refused 5 ")
    for why in (
        "'.git/hooks/pre-commit' (not under checkpoints)",
        "'../x' (not a plain relative path)",
        f"'{tmp_path}/abs' (not a plain relative path)",
        f"'checkpoints/linked/planted' ({dest}/checkpoints/linked is a symbolic link)",
        f"'checkpoints/notes.txt' ({dest}/checkpoints/notes.txt is a symbolic link)",
    ):
        assert why in line, why
    # The listing of issue 44's finding, alone: a hook, in folders the pull would make.
    alone = [FileEntry(".git", "dir"), FileEntry(".git/hooks", "dir"), FileEntry(".git/hooks/pre-commit", "file")]
    asked, result = pull_from(tf, alone, {alone[2].path: HOOK}, dest)
    assert asked == [] and os.listdir(dest / ".git" / "hooks") == []
    assert result.returncode == 1 and result.stderr.endswith(
        "refused 3 of what the daemon listed: '.git' (not under checkpoints), '.git/hooks' (not under checkpoints), "
        "'.git/hooks/pre-commit' (not under checkpoints)\n"
    ), result.stderr


def pull_from(
    tf: Tfrun, listing: list[FileEntry], contents: dict[str, bytes], dest: Path
) -> tuple[list[str], subprocess.CompletedProcess[str]]:
    """(the files it read, the result) of `tfrun pull 1 --to DEST` from a `Hostile` daemon."""
    daemon = Hostile(tf, listing, contents)
    try:
        return daemon.asked, tf.run("pull", "1", "--to", str(dest))
    finally:
        daemon.stop()


def test_pull_says_where_the_files_went(tf: Tfrun, project: Path, tmp_path: Path) -> None:
    script = write_script(project, "save.py", "import os\nopen(os.environ['TFRUN_CHECKPOINT_DIR'] + '/w', 'w')\n")
    job = tf.submit(str(script))
    assert tf.run("wait", str(job)).returncode == 0
    pulled = tf.run("pull", str(job), cwd=tmp_path)
    assert pulled.returncode == 0, pulled.stderr
    assert pulled.stderr == "pulled 1 file(s), 0 B, into ./checkpoints\n"
    assert (tmp_path / "checkpoints" / "w").exists()
    both = tf.run("pull", str(job), "checkpoints", "output.log", "--to", "back", cwd=tmp_path)
    assert both.stderr == "pulled 2 file(s), 0 B, into back/checkpoints, back/output.log\n", both.stderr


SAVER = """import os
ckpt = os.environ['TFRUN_CHECKPOINT_DIR']
open(os.path.join(ckpt, 'weights.bin'), 'wb').write(bytes(range(256)) * 64)
os.chmod(os.path.join(ckpt, 'weights.bin'), 0o4777)
os.makedirs(os.path.join(ckpt, 'step-2'))
open(os.path.join(ckpt, 'step-2', 'weights.bin'), 'w').write('two')
os.mkfifo(os.path.join(ckpt, 'pipe'))
"""


async def read_file(tf: Tfrun, job: int, path: str) -> str:
    """What the daemon answers a ReadFile of `path` with, within 10 s: the refusal's message, or "read"."""
    channel = await Channel.connect_unix(str(Layout(tf.home).socket))
    try:
        await asyncio.wait_for(channel.ask(ReadFile(job=str(job), path=path)), 10)
    except RemoteError as exc:
        return exc.message
    finally:
        channel.close()
    return "read"


@pytest.fixture
def shared_dest() -> Iterator[Path]:
    """A folder anyone may write in (1777, like /tmp), removed afterwards."""
    folder = Path("/tmp") / f"tfdest-{uuid.uuid4().hex[:8]}"
    folder.mkdir()
    folder.chmod(0o1777)
    yield folder
    shutil.rmtree(folder, ignore_errors=True)


@pytest.mark.root
def test_a_pull_never_writes_through_a_link_or_into_another_users_folder(
    tf: Tfrun, project: Path, tmp_path: Path, outside: Path, mallory: OtherUser, shared_dest: Path
) -> None:
    job = tf.submit(str(write_script(project, "save.py", SAVER)))
    assert tf.run("wait", str(job)).returncode == 0
    dest = tmp_path / "back"
    (dest / "checkpoints").mkdir(parents=True)
    (dest / "checkpoints" / "step-2").symlink_to(outside)
    started = time.monotonic()
    pulled = tf.run("pull", str(job), "--to", str(dest), timeout=30)
    assert pulled.returncode == 1
    assert f"'checkpoints/step-2/weights.bin' ({dest}/checkpoints/step-2 is a symbolic link)" in pulled.stderr
    assert untouched(outside)
    weights = dest / "checkpoints" / "weights.bin"
    assert weights.read_bytes() == WEIGHTS and stat.S_IMODE(weights.stat().st_mode) == umasked(0o777) | 0o600
    assert asyncio.run(read_file(tf, job, "checkpoints/pipe")) == "checkpoints/pipe is not a file"
    long = "9" * 300  # longer than a file name may be: refused in words, never an internal error (found by the fuzz)
    assert asyncio.run(read_file(tf, job, long)) == f"cannot read {long}: File name too long"
    assert (
        asyncio.run(read_file(tf, job, f"checkpoints/{long}/x"))
        == f"cannot read checkpoints/{long}/x: File name too long"
    )
    assert time.monotonic() - started < 20, "a FIFO in the folder never holds the daemon"
    # In a folder anyone may write in, mallory made `checkpoints` and `output.log` first.
    made = mallory.python("import os, sys\nos.mkdir(sys.argv[1] + '/checkpoints', 0o777)\n"
                          "open(sys.argv[1] + '/output.log', 'w').write('hers')\n", str(shared_dest))  # fmt: skip
    assert made.returncode == 0, made.stderr
    theirs = tf.run("pull", str(job), "checkpoints", "output.log", "--to", str(shared_dest))
    assert theirs.returncode == 1
    (line,) = theirs.stderr.splitlines()
    assert f"'checkpoints' ({shared_dest}/checkpoints belongs to {mallory.name})" in line
    assert f"'output.log' ({shared_dest}/output.log belongs to {mallory.name})" in line
    assert os.listdir(shared_dest / "checkpoints") == [] and (shared_dest / "output.log").read_text() == "hers"


@pytest.fixture
def team_root() -> Iterator[Path]:
    """A team's checkpoint folder, under /tmp, removed afterwards."""
    root = Path("/tmp") / f"tfteam-{uuid.uuid4().hex[:8]}"
    root.mkdir()
    yield root
    shutil.rmtree(root, ignore_errors=True)


SWAP = """import os, sys
folder, evil = sys.argv[1], sys.argv[2]
os.mkdir(evil, 0o777)
open(os.path.join(evil, 'weights.bin'), 'w').write('hers')
os.mkfifo(os.path.join(evil, 'pipe'), 0o666)
os.rename(folder, folder + '.moved')
os.symlink(evil, folder)
"""


@pytest.mark.root
def test_a_checkpoint_root_others_may_rename_in_is_refused_and_a_swapped_folder_never_read(
    tf: Tfrun, project: Path, tmp_path: Path, mallory: OtherUser, team_root: Path
) -> None:
    team_root.chmod(0o1777)
    tf.env["TFRUN_CHECKPOINT_ROOT"] = str(team_root)
    job = tf.submit(str(write_script(project, "save.py", SAVER)))
    assert tf.run("wait", str(job)).returncode == 0
    folder = Path(tf.job(job)["checkpoint_dir"])
    # The folder is opened to the team without the sticky bit: mallory moves the job's folder aside and leaves a
    # link to a folder of hers, with a file and a FIFO in it, in its place.
    team_root.chmod(0o777)
    swapped = mallory.python(SWAP, str(folder), str(team_root / "evil"))
    assert swapped.returncode == 0, swapped.stderr
    for verb in (["checkpoints", str(job)], ["pull", str(job), "--to", str(tmp_path / "back")],
                 ["pull", str(job), "checkpoints/weights.bin", "--to", str(tmp_path / "back")]):  # fmt: skip
        refused = tf.run(*verb, timeout=30)
        assert refused.returncode == 2, (verb, refused.stderr)
        (line,) = refused.stderr.splitlines()
        assert f"job {job}'s checkpoint folder {folder} is not read: a symbolic link is in its place" in line
    assert not (tmp_path / "back" / "checkpoints").exists()
    # The next job does not start on such a root, and says why and what to do.
    guessed = team_root / f"{job + 1}{folder.name[len(str(job)) :]}"
    assert mallory.python("import os, sys\nos.mkdir(sys.argv[1], 0o777)\n", str(guessed)).returncode == 0
    refused = tf.run("submit", str(project / "save.py"))
    assert refused.returncode == 2
    (line,) = refused.stderr.splitlines()
    assert line.endswith(
        f"checkpoint root {team_root}: other users may write in {team_root} (mode 0777) and it has no sticky bit, "
        "so they could put a link or a folder of theirs in place of a job's checkpoint folder; make it sticky "
        f"(chmod +t {team_root}, as its owner) or set checkpoint_root to a folder only you can write"
    ), line
    assert os.listdir(guessed) == [], "the job never ran in mallory's folder"
    doctor = tf.run("doctor", "--python", sys.executable, timeout=300).stdout.splitlines()
    assert f"FAIL  checkpoint root: {line.split(f'checkpoint root {team_root}: ', 1)[1]}" in doctor, doctor
    tf.ok("rm", "--checkpoints", str(job))
    assert (team_root / "evil" / "weights.bin").read_text() == "hers" and folder.is_symlink(), "hers left alone"
    team_root.chmod(0o1777)
    assert tf.run("wait", str(tf.submit(str(project / "save.py")))).returncode == 0


@pytest.mark.parametrize("path", ['/"><script>alert(1)</script>', "/lab?token=x\x1b]2;pwned\x07", "http://evil/"])
def test_a_service_path_a_daemon_names_is_opened_only_if_it_is_a_plain_url_path(tf: Tfrun, path: str) -> None:
    """What a daemon names as a service's path goes into the page the browser opens and onto the terminal: markup
    or a terminal's control sequence there is refused in one line, and nothing is opened or printed."""
    job = Job(
        id=7, state=JobState.RUNNING, script="", args=[], command=["tensorboard"], workdir="/w", job_dir="/j",
        log_path="/j/log", checkpoint_dir="/c", created_at=0.0, name="tensorboard", service="tensorboard",
    )  # fmt: skip
    daemon = Hostile(tf, [], {}, ServiceReply(job=job, port=6006, path=path))
    try:
        result = tf.run("tensorboard", "--detach", "--open")
    finally:
        daemon.stop()
    assert (result.returncode, result.stdout) == (125, "")
    assert result.stderr == f"tfrun: error: tfrund answered with a service path tfrun does not open: {path!r}\n"
