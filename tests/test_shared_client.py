"""The client's side of a shared machine (issue 44), tried by a second real user, `mallory`: the client's files
(config.toml with a host's --env values, hosts.json) are the user's alone and only the user's are trusted; a
secret given to `submit`, `hosts add`, `config set notify` or `notify-test` can stay off every command line (the
tfrun process's, the keeper's, the box's), which mallory reads as `ps` would; a daemon's home made by an older
tfrund is made private all the way down, once. And `hosts add` of a known host, as `hosts check` advises,
changes only what it is given.

The client's HOME lies in a folder anyone may enter (0755) and the commands run with umask 022, as a login's
do: pytest's own tmp_path (0700) would hide every mistake.
"""

from __future__ import annotations

import json
import os
import shutil
import stat
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from harness import Receiver, Sshd, Tfrun, no_internet, remote_client, wait_for, write_script
from harness.otheruser import CommandLineWatch, OtherUser, mallory  # noqa: F401
from test_shared_state import daemon_made, refused

pytestmark = [pytest.mark.slow]


@pytest.fixture
def open_client() -> Iterator[Tfrun]:
    """A tfrun whose client HOME and daemon home lie in a folder under /tmp that anyone may enter, its
    commands run with umask 022; removed afterwards."""
    folder = Path("/tmp") / f"tfclient-{uuid.uuid4().hex[:8]}"
    folder.mkdir(mode=0o755)
    folder.chmod(0o755)
    umask = os.umask(0o022)
    tf = Tfrun(folder / "home", client_home=folder / "client")
    tf.client_home.chmod(0o755)
    yield tf
    tf.cleanup()
    os.umask(umask)
    shutil.rmtree(folder, ignore_errors=True)


def mode(path: Path) -> int:
    return stat.S_IMODE(path.lstat().st_mode)


@pytest.mark.ssh
@pytest.mark.root
def test_a_hosts_env_in_the_clients_files_is_closed_to_other_users(
    open_client: Tfrun,
    sshd: Sshd,
    mallory: OtherUser,  # noqa: F811
) -> None:
    tf, secret = open_client, f"s3cret-{uuid.uuid4().hex}"
    remote_client(tf, sshd)  # config.toml written 0644 in 0755 folders, as a tfrun before issue 44 left it
    config = tf.client_home / ".config" / "tfrun" / "config.toml"
    config.write_text(config.read_text().replace("env = { ", f'env = {{ HF_TOKEN = "{secret}", '))
    cache = tf.client_home / ".cache" / "tfrun" / "hosts.json"
    cache.parent.mkdir(parents=True)
    older = json.dumps(["x", "tfrund", [["HF_TOKEN", secret]]])  # how an older tfrun filed a host: env and all
    cache.write_text(json.dumps({older: {"socket": "/nowhere"}}))
    assert not refused(mallory, config) and not refused(mallory, cache), "open before, as the issue found them"
    tf.ok("ps")  # reads the config, learns the box's socket: hosts.json written anew
    assert secret not in cache.read_text() and json.loads(cache.read_text()), "filed by digest, the old key gone"
    for path in (config, cache):
        assert (mode(path), mode(path.parent)) == (0o600, 0o700), path
        path.parent.chmod(0o755)  # even with its folder opened again, the file is closed
        assert refused(mallory, path), path
    tf.ok("hosts", "add", "box2", "alice@gpu2", "--env", f"TOKEN={secret}")
    assert (mode(config), mode(config.parent)) == (0o600, 0o700) and refused(mallory, config)

    # A file tfrun did not write is never trusted: a link in the cache, a config of another user's.
    cache.unlink()
    cache.symlink_to(config)
    tf.env["TFRUN_SSH_PERSIST"] = "0"  # straight to the box, reading hosts.json (a keeper has it read already)
    said = tf.run("ps")
    assert said.returncode == 2 and said.stderr == f"tfrun: error: {cache} is a symbolic link, not a file of yours: " \
        "remove it\n", said.stderr  # fmt: skip
    assert secret in config.read_text(), "nothing written through the link"
    shared = tf.client_home.parent / "shared"
    shared.mkdir(mode=0o1777)
    shared.chmod(0o1777)  # like /tmp: she makes names there
    mallory.python(f"open({str(shared / 'config.toml')!r}, 'w').write('[hosts.box]\\ndestination = \"me@evil\"\\n')")
    tf.env["TFRUN_CONFIG"] = str(shared / "config.toml")
    said = tf.run("hosts", "list")
    assert said.returncode == 2 and said.stderr == f"tfrun: error: {shared / 'config.toml'} is not yours (owner uid " \
        f"{mallory.uid}): remove it\n", said.stderr  # fmt: skip


def test_hosts_add_of_a_known_host_changes_only_what_is_given(tf: Tfrun, tmp_path: Path) -> None:
    key = tmp_path / "id_box"
    key.write_text("")
    tf.ok("hosts", "add", "box", "box", "--tfrund", "/opt/venv/bin/tfrund", "--env", "TFRUN_HOME=/data/tfrun",
          "--identity-file", str(key), "--jump", "me@bastion", "--pool", "gpu", "--accept-new-host-key")  # fmt: skip
    recorded = json.loads(tf.ok("hosts", "list", "--json"))["hosts"]["box"]
    said = tf.ok("hosts", "add", "box", "box", "--python", "/usr/bin/python3")  # as hosts check advises
    assert json.loads(tf.ok("hosts", "list", "--json"))["hosts"]["box"] == {**recorded, "python": "/usr/bin/python3"}
    assert said == "updated box (box): set python; kept tfrund, accept_new_host_key, identity_file, jump, pools, " \
        "env TFRUN_HOME\n", said  # fmt: skip
    tf.ok("hosts", "add", "box", "--env", "HF_HOME=/data/hf", "--pool", "cpu", "--no-accept-new-host-key")
    now = json.loads(tf.ok("hosts", "list", "--json"))["hosts"]["box"]
    assert now["env"] == {"TFRUN_HOME": "/data/tfrun", "HF_HOME": "/data/hf"} and now["pools"] == ["gpu", "cpu"]
    assert "accept_new_host_key" not in now and now["tfrund"] == "/opt/venv/bin/tfrund"
    assert tf.ok("hosts", "add", "box", "alice@gpu", "--replace") == "replaced box (alice@gpu)\n"
    assert json.loads(tf.ok("hosts", "list", "--json"))["hosts"]["box"] == {"destination": "alice@gpu"}


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        (["submit", "--env", "TFRUN_UNSET_TOKEN", "x.py"], "Invalid value for --env: TFRUN_UNSET_TOKEN is not set "
         "here (--env TFRUN_UNSET_TOKEN takes its value from your environment; or give --env TFRUN_UNSET_TOKEN=VALUE)"),
        (["hosts", "add", "box", "b", "--env", "TFRUN_UNSET_TOKEN"], "TFRUN_UNSET_TOKEN is not set here"),
        (["submit", "--notify-file", "/nonexistent/urls", "x.py"], "Invalid value for --notify-file: cannot read "
         "/nonexistent/urls: No such file or directory"),
        (["submit", "--notify-file", "-", "x.py"], "Invalid value for --notify-file: stdin holds no value"),
        (["config", "set", "notify", "-"], "Invalid value for VALUE: stdin holds no value"),
    ],
)  # fmt: skip
def test_a_secret_that_is_not_there_is_one_line_saying_so(tf: Tfrun, args: list[str], expected: str) -> None:
    result = tf.run(*args, input="# only a comment\n")
    assert result.returncode == 2 and result.stderr.startswith("tfrun: error: "), result.stderr
    assert expected in result.stderr and len(result.stderr.splitlines()) == 1, result.stderr


PRINT_TOKEN = "import os\nprint('token', os.environ['HF_TOKEN'])\n"


# Every process's command line, as `ps` shows it, read by another user until its stdin ends; then the lines
# holding WATCH_FOR. Each process is read again for 2 s after it appears: an exec comes soon after a fork.
@pytest.mark.ssh
@pytest.mark.root
def test_env_values_and_notify_urls_stay_off_every_command_line(
    tf: Tfrun,
    sshd: Sshd,
    project: Path,
    receiver: Receiver,
    mallory: OtherUser,  # noqa: F811
) -> None:
    marker = f"s3cret{uuid.uuid4().hex}"
    remote_client(tf, sshd)
    no_internet(tf.env)
    watch = CommandLineWatch(mallory, marker)
    tf.env.update(HF_TOKEN=f"{marker}-job", BOX_TOKEN=f"{marker}-box")
    tf.ok("hosts", "add", "box", "--env", "BOX_TOKEN")
    url = f"json://127.0.0.1:{receiver.port}/{marker}"
    assert "set notify in" in tf.run("config", "set", "notify", "-", input=f"{url}/box\n").stdout
    script = str(write_script(project, "token.py", PRINT_TOKEN))
    followed = tf.run("submit", "-f", "--env", "HF_TOKEN", "--notify-file", "-", script, input=f"# alerts\n{url}/job\n")
    assert followed.returncode == 0 and followed.stdout == f"token {marker}-job\n", followed.stderr
    tested = tf.run("notify-test", "-", input=f"{url}/test\n")
    assert tested.returncode == 0, tested.stderr
    wait_for(lambda: len(receiver.posts) >= 3, what="the job's alert to both URLs and the test message")
    assert json.loads(tf.ok("config", "--json", "--show-secrets"))["values"]["notify"] == [f"{url}/box"]
    daemon_env = Path(f"/proc/{tf.daemon_pid()}/environ").read_bytes()
    assert f"BOX_TOKEN={marker}-box".encode() in daemon_env, "the box's daemon got it, over the channel's stdin"
    control = watch.control()
    assert watch.seen() == [control]


@pytest.mark.root
def test_a_home_an_older_tfrund_left_open_is_made_private_all_the_way_down_once(
    open_client: Tfrun,
    project: Path,
    mallory: OtherUser,  # noqa: F811
) -> None:
    tf = open_client
    job = tf.submit(str(write_script(project, "train.py", "print('secret-step')\n")))
    assert tf.run("wait", str(job)).returncode == 0
    tf.daemon("stop")
    home = tf.home
    (home / ".private").unlink(missing_ok=True)  # as an older tfrund left its home: no walk done, everything open
    for path in [home, *daemon_made(home)]:  # run/ aside: a socket folder open to others stops tfrund (issue 27)
        if "run" not in path.relative_to(home).parts:
            path.chmod(mode(path) | (0o055 if path.is_dir() else 0o044))
    theirs = tf.job_dir(job) / "notes.txt"
    theirs.write_text("hers")
    os.chown(theirs, mallory.uid, mallory.gid)
    outside = tf.home.parent / "outside.txt"
    outside.write_text("not the daemon's")
    (home / "jobs" / "link").symlink_to(outside)
    assert not refused(mallory, home / "tfrun.db")
    tf.ok("ps")
    loose = [f"{p} {mode(p):03o}" for p in daemon_made(home) if mode(p) & 0o077 and not p.is_symlink() and p != theirs]
    assert not loose, "left open"
    assert (mode(outside), mode(theirs)) == (0o644, 0o644), "a link is never followed; her file is hers"
    home.chmod(0o755)  # opened again by hand: each file still refuses her
    for path in (home / "tfrun.db", tf.job_dir(job) / "spec.json", tf.job_dir(job) / "output.log"):
        assert refused(mallory, path), path
    home.chmod(0o700)
    log = (home / "tfrund.log").read_text()
    opened = [line for line in log.splitlines() if "other users of this machine could open them" in line]
    assert len(opened) == 1 and f"could open them): {home} 755 -> 700, blobs 755 -> 700" in opened[0], opened
    assert f"jobs/{job}/notes.txt (uid {mallory.uid})" in log
    tf.daemon("stop")
    tf.ok("ps")  # the next start: nothing left to say
    assert (home / "tfrund.log").read_text().count("could open them") == 1
    tf.daemon("stop")  # TFRUN_HOME may be a link the user made (to a volume): that one link is followed
    home.rename(home.with_name("volume"))
    home.symlink_to(home.with_name("volume"))
    (home / ".private").unlink()
    assert [record["id"] for record in tf.jobs()] == [job] and (home / ".private").is_file()
