"""A box shared by a team (issue 27): tfrund's state, a job's work files and its checkpoints are its user's alone.

Each attack is tried by a second real user, `mallory` (tests/harness/otheruser.py), where it would really reach: the
victim's TFRUN_HOME lies in a folder anyone may enter (as TFRUN_HOME=/data/tfrun would, or a volume made 0755),
and a checkpoint root shared by all is mode 1777 under /tmp. pytest's own tmp_path (0700) is used only for
what the attacker need not reach: the client's home and the work dir sent.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import sqlite3
import stat
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from harness import Tfrun, otheruser, wait_for, write_script
from harness.otheruser import OtherUser
from test_install import start_bare_box, trust

mallory = otheruser.mallory  # the fixture: another user of the box, who tries each attack

OPEN = "import sys\ntry:\n    open(sys.argv[1], sys.argv[2]).close()\nexcept OSError as exc:\n    print(exc.errno)\n"


def refused(user: OtherUser, path: Path, how: str = "r") -> bool:
    """Whether `user` is refused opening `path` (`how`: "r" to read, "a" to append), as the kernel decides."""
    result = user.python(OPEN, str(path), how)
    assert result.returncode == 0, result.stderr
    return result.stdout.strip() == "13"  # EACCES


@pytest.fixture
def open_folder() -> Iterator[Path]:
    """A folder under /tmp that every user may enter (0755), removed afterwards."""
    folder = Path("/tmp") / f"tfshared-{uuid.uuid4().hex[:8]}"
    folder.mkdir()
    folder.chmod(0o755)
    yield folder
    shutil.rmtree(folder, ignore_errors=True)


@pytest.fixture
def loose(open_folder: Path, tmp_path: Path) -> Iterator[Tfrun]:
    """A tfrun whose TFRUN_HOME existed before, mode 0755, in a folder anyone may enter."""
    home = open_folder / "home"
    home.mkdir()
    home.chmod(0o755)
    tf = Tfrun(home, client_home=tmp_path / "client-home")
    yield tf
    tf.cleanup()


@pytest.fixture
def shared_root() -> Iterator[Path]:
    """A checkpoint root for every user of the box (mode 1777, like /tmp), removed afterwards."""
    root = Path("/tmp") / f"tfckpt-{uuid.uuid4().hex[:8]}"
    root.mkdir()
    root.chmod(0o1777)
    yield root
    shutil.rmtree(root, ignore_errors=True)


def daemon_made(home: Path) -> list[Path]:
    """Everything under `home` that tfrund made, not the snapshot of the user's work dir (`work/`, the
    spares' `tree/`), whose modes come from the user's files, nor the copies of tfrun.jobs and of the shim
    (`pythonpath/`, `shimpath/`: public code, with its install's modes)."""
    found = []
    for folder, dirs, files in os.walk(home):
        dirs[:] = [name for name in dirs if name not in ("work", "tree", "pythonpath", "shimpath")]
        found += [Path(folder) / name for name in [*dirs, *files]]
    return found


@pytest.mark.root
def test_state_in_a_home_others_could_enter_is_closed_to_them(loose: Tfrun, mallory: OtherUser, project: Path) -> None:
    tf = loose
    script = write_script(project, "train.py", "open('out.txt', 'w').write('mine')\nprint('secret-step')\n")
    job = tf.submit("--env", "WANDB_API_KEY=s3cret", str(script))
    assert tf.run("wait", str(job)).returncode == 0
    home, job_dir = tf.home, tf.job_dir(job)
    assert stat.S_IMODE(home.stat().st_mode) == 0o700
    said = [line for line in (home / "tfrund.log").read_text().splitlines() if "could open them" in line]
    assert len(said) == 1 and f"yours alone (other users of this machine could open them): {home} 755 -> 700" \
        in said[0], said  # fmt: skip
    blob = next(path for path in (home / "blobs").rglob("*") if path.is_file())
    secrets = [home / "tfrun.db", home / "tfrun.db-wal", job_dir / "spec.json", job_dir / "output.log",
               home / "tfrund.log", job_dir / "work" / "train.py", blob]  # fmt: skip
    for path in secrets:
        assert path.exists() and refused(mallory, path), path
    loose_modes = {str(p): oct(stat.S_IMODE(p.lstat().st_mode)) for p in daemon_made(home) if p.lstat().st_mode & 0o077}
    assert not loose_modes, "tfrund made these open to others"
    # The job's own outputs follow the umask the daemon was started with (this test's), in private folders.
    umask = os.umask(0o022)
    os.umask(umask)
    assert stat.S_IMODE((job_dir / "work" / "out.txt").stat().st_mode) == 0o666 & ~umask
    assert stat.S_IMODE((job_dir / "spec.json").stat().st_mode) == 0o600


@pytest.mark.root
def test_no_other_user_can_change_a_work_file_or_the_spare_copy_the_next_job_is_built_from(
    loose: Tfrun, mallory: OtherUser, project: Path
) -> None:
    tf = loose
    helper = write_script(project, "helper.py", "print('the real helper')\n")
    helper.chmod(0o777)  # sent as writable by all: the copies must not be
    script = write_script(project, "train.py", "import helper\n")
    first = tf.submit(str(script))
    assert tf.run("wait", str(first)).returncode == 0
    (spare,) = wait_for(lambda: list((tf.home / "spares").glob("*/tree/helper.py")), what="the spare copy")
    copy = tf.job_dir(first) / "work" / "helper.py"
    for path in (copy, spare):
        assert stat.S_IMODE(path.stat().st_mode) == 0o755, f"{path}: the execute bit kept, no write for others"
        assert refused(mallory, path, "a"), path
    tf.home.chmod(0o755)  # even were the home opened again by hand, the files refuse other writers
    for path in (copy, spare):
        assert refused(mallory, path, "a"), path
    tf.home.chmod(0o700)
    second = tf.submit(str(script))
    assert tf.run("wait", str(second)).returncode == 0
    assert tf.log(second) == b"the real helper\n"


CHECKPOINT = "import os, sys\nckpt = os.environ['TFRUN_CHECKPOINT_DIR']\nprint(sorted(os.listdir(ckpt)))\n" \
    "open(os.path.join(ckpt, sys.argv[1]), 'w').write('x')\n"  # fmt: skip


def test_two_homes_on_one_checkpoint_root_never_share_or_delete_each_others_folders(
    tmp_path: Path, project: Path
) -> None:
    root = tmp_path / "checkpoints"
    homes = [Tfrun(tmp_path / name, client_home=tmp_path / f"client-{name}") for name in ("a", "b")]
    try:
        for tf in homes:
            tf.env["TFRUN_CHECKPOINT_ROOT"] = str(root)
        script = write_script(project, "ckpt.py", CHECKPOINT)
        a, b = homes
        first_a, first_b = a.submit(str(script), "from-a"), b.submit(str(script), "from-b")
        assert first_a == first_b == 1
        for tf in homes:
            assert tf.run("wait", "1").returncode == 0
        assert a.log(1) == b.log(1) == b"[]\n", "each job 1 starts with a folder of its own, empty"
        folder_a, folder_b = (Path(tf.job(1)["checkpoint_dir"]) for tf in homes)
        assert folder_a != folder_b and folder_a.parent == folder_b.parent == root
        assert stat.S_IMODE(folder_a.stat().st_mode) == 0o700
        b.ok("rm", "--checkpoints", "1")
        assert not folder_b.exists()
        assert (folder_a / "from-a").exists(), "b's rm left a's folder alone"
    finally:
        for tf in homes:
            tf.cleanup()


@pytest.mark.root
def test_a_checkpoint_folder_another_user_made_first_on_a_shared_root_is_never_taken(
    tf: Tfrun, mallory: OtherUser, shared_root: Path, project: Path
) -> None:
    tf.env["TFRUN_CHECKPOINT_ROOT"] = str(shared_root)
    script = write_script(project, "ckpt.py", CHECKPOINT)
    first = tf.submit(str(script), "mine")
    assert tf.run("wait", str(first)).returncode == 0
    folder = Path(tf.job(first)["checkpoint_dir"])
    assert folder.parent == shared_root and folder.name.startswith(f"{first}")
    assert refused(mallory, folder / "mine")
    # The next job's folder is easy to guess from this one's name: mallory makes it first, with a file in it.
    guessed = shared_root / f"{first + 1}{folder.name[len(str(first)) :]}"
    planted = mallory.python("import os, sys\nos.mkdir(sys.argv[1], 0o777)\nopen(sys.argv[1] + '/ckpt-9', 'w')\n",
                             str(guessed))  # fmt: skip
    assert planted.returncode == 0, planted.stderr
    taken = tf.run("submit", str(script), "theirs")
    assert taken.returncode != 0
    (line,) = taken.stderr.splitlines()
    assert f"checkpoint folder {guessed} already exists and is not this job's (it belongs to {mallory.name})" in line
    assert "set checkpoint_root to a folder of your own" in line
    assert sorted(os.listdir(guessed)) == ["ckpt-9"], "the victim's job never ran in it"
    tf.ok("prune", "--older-than", "0s", "--checkpoints")
    assert guessed.exists() and not folder.exists()


def test_hosts_install_refuses_a_venv_folder_that_holds_other_files(tf: Tfrun, tmp_path: Path) -> None:
    server, box_home = start_bare_box(tmp_path)
    try:
        tf.ok("hosts", "add", "box", trust(tf, server), "--env", f"TFRUN_HOME={tf.home}")
        data = box_home / "data"
        data.mkdir()
        (data / "train.csv").write_text("a,b\n")
        result = tf.run("hosts", "install", "box", "--venv", "~/data")
        assert result.returncode == 1
        (line,) = result.stderr.splitlines()
        assert line == (f"tfrun: error: {data} on box has files in it and is not a tfrun install: installing there "
                        "would delete them; name an empty or new folder with --venv")  # fmt: skip
        assert sorted(os.listdir(data)) == ["train.csv"]
    finally:
        server.stop()


def test_rm_checkpoints_leaves_a_folder_an_older_tfrun_named_by_the_job_id_alone(
    tf: Tfrun, tmp_path: Path, project: Path
) -> None:
    # An older tfrun named job 1's folder ROOT/1 in every home on a root: one home's rm emptied the other's.
    root = tmp_path / "checkpoints"
    tf.env["TFRUN_CHECKPOINT_ROOT"] = str(root)
    job = tf.submit(str(write_script(project, "x.py", "pass\n")))
    assert tf.run("wait", str(job)).returncode == 0
    tf.daemon("stop")
    (root / str(job)).mkdir()
    (root / str(job) / "ckpt-1").write_text("another home's")
    with contextlib.closing(sqlite3.connect(tf.home / "tfrun.db")) as db, db:
        db.execute("UPDATE jobs SET checkpoint_dir=? WHERE id=?", (str(root / str(job)), job))
    removed = tf.run("rm", "--checkpoints", str(job))
    assert removed.returncode == 0, removed.stderr
    assert f"{root / str(job)} stays: tfrun did not make it for this job" in removed.stdout
    assert (root / str(job) / "ckpt-1").read_text() == "another home's"
