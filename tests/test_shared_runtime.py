"""A box shared by a team (issue 27), the client's sockets: another real user of the machine (`mallory`) tries to
take the places where tfrun connects, and never hears a byte (tfrun/private.py).

Without XDG_RUNTIME_DIR the keepers' sockets, and a local daemon's when its TFRUN_HOME is too long for one, live
under /tmp/tfrun-UID, a name anyone can make first. The victim is a second user, `alice`, so that her
/tmp/tfrun-UID is this test's alone (the root tests beside it use /tmp/tfrun-0); she reaches a real sshd box as
the tests' user does. Each attacker's listener reports every byte it was sent: it must be none.
"""

from __future__ import annotations

import asyncio
import contextlib
import getpass
import hashlib
import json
import os
import shlex
import shutil
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from harness import TFRUN, TFRUND, Sshd, Tfrun, keeper_socket, keepers_of, otheruser, remote_client, wait_for
from harness.otheruser import OtherUser, other_user

from tfrun.client.link.syncchannel import SyncChannel
from tfrun.constants import SAFE_PATH
from tfrun.private import NotPrivate
from tfrun.protocol.channel import Channel, client_hello
from tfrun.protocol.wire import encode

pytestmark = [pytest.mark.root]

# Binds a Unix socket at argv[1] (making the folders above it, open to all, as a squatter would), says
# "listening", then takes every connection and what is sent first on it until its stdin closes, and prints that.
LISTENER = """
import os, select, socket, sys
path = sys.argv[1]
for folder in sys.argv[2:]:
    os.makedirs(folder, exist_ok=True)
    os.chmod(folder, 0o777)
server = socket.socket(socket.AF_UNIX)
server.bind(path)
os.chmod(path, 0o777)
server.listen(16)
print("listening", flush=True)
heard, connections = b"", []
while True:
    ready = select.select([server, sys.stdin, *connections], [], [])[0]
    if sys.stdin in ready:
        break
    for sock in ready:
        if sock is server:
            connections.append(server.accept()[0])
        else:
            heard += sock.recv(65536)  # what was sent first, then a hang-up: a caller never waits on us
            connections.remove(sock)
            sock.close()
print(repr(heard), flush=True)
"""


mallory = otheruser.mallory  # the attacker (a fixture), as a name the tests' arguments may take without shadowing


class Listener:
    """Another user's socket at a path tfrun may connect to, and what it was told."""

    def __init__(self, user: OtherUser, path: Path, *folders: Path) -> None:
        argv = [sys.executable, "-c", LISTENER, str(path), *map(str, folders)]
        self.proc = user.popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE)
        assert self.proc.stdout is not None
        assert self.proc.stdout.readline() == "listening\n", "the attacker's socket is bound"

    def heard(self) -> str:
        """Everything sent to the socket, as Python's repr of the bytes: "b''" when nothing."""
        out, _ = self.proc.communicate(input="", timeout=30)
        return out.strip()


@pytest.fixture
def alice() -> Iterator[OtherUser]:
    """The victim: a user of the box whose /tmp/tfrun-UID nobody else's tests touch; it is removed after."""
    with other_user("tfa") as user:
        try:
            yield user
        finally:
            shutil.rmtree(f"/tmp/tfrun-{user.uid}", ignore_errors=True)


def as_owner(user: OtherUser, *paths: Path) -> None:
    """Hand `paths`, made by the test, to `user`."""
    for path in paths:
        os.chown(path, user.uid, user.gid)


def give_box(user: OtherUser, sshd: Sshd, home: Path, env: dict[str, str]) -> None:
    """Host "box" in `user`'s config: the tests' sshd, logged in as the tests' user, its daemon's state in
    `home`, and `env` for it (as any host's env, e.g. a secret token); `user`'s own key and known_hosts."""
    ssh_dir = user.home / ".ssh"
    ssh_dir.mkdir(mode=0o700)
    shutil.copy(sshd.user_key, ssh_dir / "id_ed25519")
    (ssh_dir / "id_ed25519").chmod(0o600)
    (ssh_dir / "known_hosts").write_text(sshd.known_hosts_line)
    config = user.home / ".config" / "tfrun" / "config.toml"
    config.parent.mkdir(parents=True)
    tfrund = json.dumps(shlex.join([sys.executable, "-m", "tfrun.runner"]))
    values = ", ".join(f"{name} = {json.dumps(value)}" for name, value in {"TFRUN_HOME": str(home), **env}.items())
    config.write_text(
        f'[hosts.box]\ndestination = "{getpass.getuser()}@127.0.0.1:{sshd.port}"\ntfrund = {tfrund}\n'
        f"env = {{ {values} }}\n"
    )
    as_owner(user, ssh_dir, *ssh_dir.iterdir(), config.parent.parent, config.parent, config)


def tfrun_as(user: OtherUser, *args: str, **env: str) -> subprocess.CompletedProcess[str]:
    """`tfrun ARGS` run by `user`, in a clean environment of theirs (no XDG_RUNTIME_DIR: su, cron, ssh)."""
    return user.run([*TFRUN, *args], env=user.env(**env), timeout=90)


def keepers_of_user(user: OtherUser) -> list[int]:
    """Pids of the connection keepers running as `user`."""
    found = []
    for entry in os.listdir("/proc"):
        with contextlib.suppress(OSError):
            mine = entry.isdigit() and os.stat(f"/proc/{entry}").st_uid == user.uid
            if mine and b"tfrun.client.link.keeper" in Path(f"/proc/{entry}/cmdline").read_bytes():
                found.append(int(entry))
    return found


@pytest.fixture
def box(sshd: Sshd, tmp_path: Path) -> Iterator[Path]:
    """The box daemon's TFRUN_HOME (it runs as the tests' user, behind sshd); stopped after."""
    home = tmp_path / "box-home"
    yield home
    Tfrun(home).cleanup()


@pytest.mark.ssh
def test_a_keeper_socket_another_user_planted_is_never_told_anything(
    alice: OtherUser, mallory: OtherUser, box: Path, sshd: Sshd
) -> None:
    """Mallory learned where alice's keeper listens (from `ps`, or a day before), and after a reboot she makes
    /tmp/tfrun-UID/keepers first and binds a socket there: alice's verbs go elsewhere, and work."""
    give_box(alice, sshd, box, {})
    assert tfrun_as(alice, "ps", "--host", "box").returncode == 0
    [keeper] = keepers_of_user(alice)
    planted = keeper_socket(keeper)
    shared = Path(f"/tmp/tfrun-{alice.uid}")
    assert planted.parent == shared / "keepers"
    subprocess.run(["pkill", "-KILL", "-u", alice.name], check=False)
    wait_for(lambda: not keepers_of_user(alice), what="alice's keeper to end")
    shutil.rmtree(shared)  # a reboot
    listener = Listener(mallory, planted, shared, shared / "keepers")

    result = tfrun_as(alice, "ps", "--host", "box", "--json")
    assert listener.heard() == "b''", "alice's verb sent nothing to mallory's socket"
    assert (result.returncode, result.stdout, result.stderr) == (0, "[]\n", "")
    [keeper] = keepers_of_user(alice)
    assert keeper_socket(keeper) == alice.home / ".cache" / "tfrun" / "run" / "keepers" / planted.name


@pytest.mark.ssh
@pytest.mark.parametrize("taken", ["open folder", "symlink"])
def test_a_taken_runtime_folder_does_not_stop_tfrun(
    alice: OtherUser, mallory: OtherUser, box: Path, sshd: Sshd, taken: str
) -> None:
    """Mallory makes /tmp/tfrun-UID and keepers/ in it first, mode 777 (or links the name to a folder of hers):
    alice's tfrun works all the same, its keeper's sockets in a private folder of hers, none in mallory's."""
    shared = Path(f"/tmp/tfrun-{alice.uid}")
    hers = Path(f"/tmp/tfm-{uuid.uuid4().hex[:8]}")
    make = f"import os\nos.mkdir({str(hers)!r}, 0o777)\nos.chmod({str(hers)!r}, 0o777)\n"
    if taken == "symlink":
        make += f"os.symlink({str(hers)!r}, {str(shared)!r})\nos.mkdir({str(hers / 'keepers')!r}, 0o777)\n"
    else:
        make += f"os.mkdir({str(shared)!r})\nos.mkdir({str(shared / 'keepers')!r})\n"
        make += f"os.chmod({str(shared)!r}, 0o777)\nos.chmod({str(shared / 'keepers')!r}, 0o777)\n"
    try:
        assert mallory.python(make).returncode == 0
        give_box(alice, sshd, box, {})
        result = tfrun_as(alice, "ps", "--host", "box", "--json")
        assert (result.returncode, result.stdout, result.stderr) == (0, "[]\n", "")
        [keeper] = keepers_of_user(alice)
        private = alice.home / ".cache" / "tfrun" / "run"
        assert keeper_socket(keeper).parent == private / "keepers"
        assert (private.stat().st_mode & 0o777, private.stat().st_uid) == (0o700, alice.uid)
        assert os.listdir(shared / "keepers") == [], "nothing of alice's in mallory's folder"
    finally:
        shutil.rmtree(hers, ignore_errors=True)
        with contextlib.suppress(OSError):
            shared.unlink()


@pytest.mark.ssh
def test_an_xdg_runtime_dir_of_another_user_is_not_used(
    alice: OtherUser, mallory: OtherUser, box: Path, sshd: Sshd
) -> None:
    """After `su alice`, XDG_RUNTIME_DIR still names the first user's folder (here mallory's, open to her):
    alice's keeper makes nothing there, and her tfrun works as without the variable."""
    hers = Path(f"/tmp/tfm-{uuid.uuid4().hex[:8]}")
    try:
        assert mallory.python(f"import os\nos.mkdir({str(hers)!r})\nos.chmod({str(hers)!r}, 0o777)\n").returncode == 0
        give_box(alice, sshd, box, {})
        result = tfrun_as(alice, "ps", "--host", "box", "--json", XDG_RUNTIME_DIR=str(hers))
        assert (result.returncode, result.stdout, result.stderr) == (0, "[]\n", "")
        assert os.listdir(hers) == [], "nothing of alice's in mallory's folder"
        [keeper] = keepers_of_user(alice)
        assert keeper_socket(keeper).parent == Path(f"/tmp/tfrun-{alice.uid}") / "keepers"
    finally:
        shutil.rmtree(hers, ignore_errors=True)


def test_a_local_daemon_socket_another_user_planted_is_never_told_anything(
    alice: OtherUser, mallory: OtherUser
) -> None:
    """Alice's TFRUN_HOME is too long for a socket path, so her daemon's socket goes under /tmp/tfrun-UID;
    mallory made that folder first and listens at the name: alice's `tfrun ps` starts and asks her own daemon."""
    home = alice.home / ("state-" + "x" * 100)
    digest = hashlib.sha256(os.fsencode(home)).hexdigest()[:16]
    shared = Path(f"/tmp/tfrun-{alice.uid}")
    listener = Listener(mallory, shared / f"{digest}.sock", shared)

    result = tfrun_as(alice, "ps", "--json", TFRUN_HOME=str(home))
    assert listener.heard() == "b''", "alice's verb sent nothing to mallory's socket"
    assert (result.returncode, result.stdout, result.stderr) == (0, "[]\n", "")
    status = json.loads(alice.run([sys.executable, "-m", "tfrun.runner", "status", "--json"],
                                  env=alice.env(TFRUN_HOME=str(home))).stdout)  # fmt: skip
    assert status["socket"] == str(alice.home / ".cache" / "tfrun" / "run" / f"{digest}.sock")


def test_a_socket_served_by_another_user_is_refused_before_a_byte(mallory: OtherUser, tf: Tfrun) -> None:
    """Whatever the path, a socket whose peer (SO_PEERCRED) runs as another uid is refused in one line, unheard:
    by the plain client channel, by the asyncio one, and by `tfrun ps` finding it at its daemon's place."""
    hers = Path(f"/tmp/tfm-{uuid.uuid4().hex[:8]}")
    try:
        listener = Listener(mallory, hers / "d.sock", hers)
        with pytest.raises(NotPrivate, match=f"^{hers / 'd.sock'} is served by another user \\(uid {mallory.uid}"):
            SyncChannel.connect(str(hers / "d.sock"))
        with pytest.raises(NotPrivate, match="tfrun sent it nothing"):
            asyncio.run(Channel.connect_unix(str(hers / "d.sock")))
        run_dir = tf.home / "run"
        run_dir.mkdir(mode=0o700, parents=True)
        os.rename(hers / "d.sock", run_dir / "tfrund.sock")  # still hers: a socket is its binder's
        result = tf.run("ps")
        assert (result.returncode, result.stdout) == (125, "")
        assert result.stderr == (
            f"tfrun: error: {run_dir / 'tfrund.sock'} is served by another user (uid {mallory.uid}, pid "
            f"{listener.proc.pid}), not by you: tfrun sent it nothing; remove that socket\n"
        )
        for verb in ("status", "dial-stdio"):  # tfrund's own ways in: the box's end of a verb without forwarding
            daemon = subprocess.run([*TFRUND, verb], env=tf.env, input="", capture_output=True, text=True, timeout=60)
            assert (daemon.returncode, daemon.stdout) == (1, ""), verb
            assert daemon.stderr == result.stderr.replace("tfrun:", "tfrund:"), verb
        assert listener.heard() == "b''"
    finally:
        shutil.rmtree(hers, ignore_errors=True)


@pytest.mark.ssh
def test_the_keeper_command_line_names_no_secret_and_no_socket(alice: OtherUser, box: Path, sshd: Sshd) -> None:
    """Every user reads every command line (`ps`): the keeper's holds neither the host's env nor its socket."""
    secret = f"hunter2-{uuid.uuid4().hex}"
    give_box(alice, sshd, box, {"WANDB_API_KEY": secret})
    assert tfrun_as(alice, "ps", "--host", "box").returncode == 0
    [keeper] = keepers_of_user(alice)
    cmdline = Path(f"/proc/{keeper}/cmdline").read_bytes()
    assert cmdline.split(b"\0")[1:] == [*(flag.encode() for flag in SAFE_PATH), b"-m", b"tfrun.client.link.keeper", b""]
    assert secret.encode() not in cmdline and str(keeper_socket(keeper)).encode() not in cmdline


def test_tfrund_hangs_up_on_a_client_of_another_user(mallory: OtherUser, tf: Tfrun) -> None:
    """Defence in depth: a client whose uid is not the daemon's (here through a link to its socket, opened to
    all) gets no answer to its hello, however it got there."""
    tf.ok("ps")  # starts the daemon
    hers = Path(f"/tmp/tfm-{uuid.uuid4().hex[:8]}")
    hers.mkdir(mode=0o755)
    try:
        os.link(tf.home / "run" / "tfrund.sock", hers / "d.sock")
        os.chmod(hers / "d.sock", 0o666)
        knock = "import socket, sys\ns = socket.socket(socket.AF_UNIX)\ns.connect(sys.argv[1])\n"
        knock += "try:\n    s.sendall(bytes.fromhex(sys.argv[2]))\n    print(repr(s.recv(65536)))\n"
        # closed with her hello unread, or before she had sent it all (a broken pipe, seen once under load)
        knock += "except (ConnectionResetError, BrokenPipeError):\n    print('reset')\n"
        result = mallory.python(knock, str(hers / "d.sock"), encode(client_hello()).hex())
        assert result.returncode == 0 and result.stdout in ("b''\n", "reset\n"), result
        assert json.loads(tf.ok("ps", "--json")) == [], "the daemon's own user is served"
    finally:
        os.chmod(hers / "d.sock", 0o600)
        shutil.rmtree(hers, ignore_errors=True)


def _kill_daemons_of(user: OtherUser) -> None:
    """End `user`'s tfrund (and its dial-stdio bridges), as a reboot would, leaving the SSH sessions up."""
    subprocess.run(["pkill", "-KILL", "-u", user.name, "-f", "tfrun.runner"], check=False)
    wait_for(lambda: subprocess.run(["pgrep", "-u", user.name, "-f", "tfrun.runner"]).returncode == 1,
             what=f"{user.name}'s tfrund to end")  # fmt: skip


@pytest.mark.ssh
@pytest.mark.parametrize("persist", ["1", "0"], ids=["through its keeper", "a connection of its own"])
def test_a_remembered_socket_another_user_took_hears_a_hello_and_nothing_more(
    alice: OtherUser, mallory: OtherUser, tmp_path: Path, persist: str
) -> None:
    """Issue 44, finding 1. The box's user is alice, her TFRUN_HOME too long for a socket path, so her daemon
    listens under /tmp/tfrun-UID and the client remembers that path. After a reboot (the daemon and the folder
    gone) mallory listens there first. The client's next submit, its --env secret included, reaches alice's own
    daemon (started anew in her private fallback folder); mallory hears one hello, with a challenge she cannot
    answer; and the client remembers the daemon's new place."""
    subprocess.run(["usermod", "-p", "*", alice.name], check=True)  # not locked ("!"): sshd lets her log in
    sshd = Sshd(alice.home / "sshd")  # where sshd, reading authorized_keys as alice, may read it
    home = alice.home / ("state-" + "x" * 100)
    tf = remote_client(Tfrun(tmp_path / "unused-home"), sshd)
    config = tf.client_home / ".config" / "tfrun" / "config.toml"
    config.write_text(config.read_text().replace(f"{getpass.getuser()}@", f"{alice.name}@")
                      .replace(json.dumps(str(tf.home)), json.dumps(str(home))))  # fmt: skip
    tf.env["TFRUN_SSH_PERSIST"] = persist
    cache = tf.client_home / ".cache" / "tfrun" / "hosts.json"
    digest = hashlib.sha256(os.fsencode(home)).hexdigest()[:16]
    shared = Path(f"/tmp/tfrun-{alice.uid}")
    try:
        assert json.loads(tf.ok("ps", "--json")) == []
        [learnt] = json.loads(cache.read_text()).values()
        assert learnt["socket"] == str(shared / f"{digest}.sock") and len(learnt["socket_key"]) == 64
        _kill_daemons_of(alice)
        shutil.rmtree(shared)  # a reboot, or a /tmp clean-up
        listener = Listener(mallory, shared / f"{digest}.sock", shared)
        secret = f"hunter2-{uuid.uuid4().hex}"
        (tmp_path / "project").mkdir()
        script = tmp_path / "project" / "job.py"
        script.write_text("import os\nprint('token', len(os.environ['TOKEN']))\n")

        job = tf.submit("--env", f"TOKEN={secret}", str(script))
        heard = listener.heard()
        assert secret not in heard and "submit" not in heard and "blob" not in heard, heard
        frame = eval(heard)  # the repr of the bytes mallory read
        assert frame.count(b"\n") == 1 and json.loads(frame)["type"] == "hello" and json.loads(frame)["challenge"]
        assert tf.ok("wait", str(job)) == "" and tf.ok("logs", str(job)) == f"token {len(secret)}\n"
        [healed] = json.loads(cache.read_text()).values()
        assert healed["socket"] == str(alice.home / ".cache" / "tfrun" / "run" / f"{digest}.sock")
    finally:
        for pid in keepers_of(tf):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, 9)
        sshd.stop(sessions=True)
