"""Fixtures that boot real daemons in temporary homes and drive them through the real commands."""

from __future__ import annotations

import contextlib
import functools
import getpass
import json
import os
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Callable, Optional

import pytest

BIN = Path(sys.executable).parent
TFRUN = [str(BIN / "tfrun")] if (BIN / "tfrun").exists() else [sys.executable, "-m", "tfrun.client"]
TFRUND = [str(BIN / "tfrund")] if (BIN / "tfrund").exists() else [sys.executable, "-m", "tfrun.runner"]


def processes_of(home: Path) -> list[int]:
    """Pids of every process that carries TFRUN_HOME=home: the daemon, its shims and their jobs."""
    marker = f"TFRUN_HOME={home}".encode()
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == os.getpid():
            continue
        try:
            environ = Path(f"/proc/{entry}/environ").read_bytes()
        except OSError:
            continue
        if marker in environ.split(b"\0"):
            found.append(int(entry))
    return found


def keepers_of(tf: Tfrun) -> list[int]:
    """Pids of the connection keepers that the client of `tf` started."""
    found = []
    for pid in processes_of(tf.home):
        try:
            if b"tfrun.client.keeper" in Path(f"/proc/{pid}/cmdline").read_bytes():
                found.append(pid)
        except OSError:
            continue
    return found


def keeper_socket(pid: int) -> Path:
    """The protocol socket the keeper `pid` listens on, found as `ss` finds it (its command line names none:
    client/keeper.py reads its parameters on stdin); the forward socket beside it is this with `.fwd`."""
    inodes = set()
    for fd in Path(f"/proc/{pid}/fd").iterdir():
        with contextlib.suppress(OSError):
            target = os.readlink(fd)
            if target.startswith("socket:["):
                inodes.add(target[len("socket:[") : -1])
    rows = (line.split() for line in Path(f"/proc/{pid}/net/unix").read_text().splitlines()[1:])  # its netns
    [path] = {Path(row[7]) for row in rows if len(row) > 7 and row[6] in inodes and row[7].endswith(".sock")}
    return path


def alive(pid: int) -> bool:
    """True while `pid` exists and is not a zombie."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_bytes()
    except OSError:
        return False
    return stat[stat.rfind(b")") + 2 :].split()[0] != b"Z"


def wait_for(predicate: Callable[[], Any], timeout: float = 30.0, what: str = "condition") -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.05)
    raise AssertionError(f"timed out after {timeout}s waiting for {what}")


class Tfrun:
    """One isolated tfrun installation: its own TFRUN_HOME, driven through the real commands.

    `client_home` is the client's $HOME (its ~/.ssh, ~/.config/tfrun): tests never touch the real one.
    """

    def __init__(self, home: Path, prefix: Optional[list[str]] = None, client_home: Optional[Path] = None) -> None:
        self.home = home
        self.prefix = prefix or []
        self.env = dict(os.environ)
        self.env["TFRUN_HOME"] = str(home)
        for name in ("TFRUN_CHECKPOINT_ROOT", "TFRUN_JOB_PYTHON", "TFRUN_HOST", "TFRUN_CONFIG", "XDG_CONFIG_HOME"):
            self.env.pop(name, None)
        self.client_home = client_home or home.parent / "client-home"
        self.client_home.mkdir(parents=True, exist_ok=True)
        self.env["HOME"] = str(self.client_home)
        self.env["XDG_CACHE_HOME"] = str(self.client_home / ".cache")
        self.env.pop("SSH_AUTH_SOCK", None)
        self.remote = False

    def run(self, *args: str, timeout: float = 120, **kw: Any) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [*self.prefix, *TFRUN, *args], env=self.env, capture_output=True, text=True, timeout=timeout, **kw
        )

    def daemon(self, *args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [*self.prefix, *TFRUND, *args], env=self.env, capture_output=True, text=True, timeout=timeout
        )

    def ok(self, *args: str) -> str:
        result = self.run(*args)
        assert result.returncode == 0, f"tfrun {' '.join(args)} -> {result.returncode}\n{result.stderr}"
        return result.stdout

    def submit(self, *args: str) -> int:
        return int(self.ok("submit", *args).strip())

    def job(self, ref: int | str) -> dict[str, Any]:
        return json.loads(self.ok("status", "--json", str(ref)))  # type: ignore[no-any-return]

    def jobs(self) -> list[dict[str, Any]]:
        return json.loads(self.ok("ps", "--all", "--json"))  # type: ignore[no-any-return]

    def log(self, ref: int | str) -> bytes:
        result = subprocess.run([*TFRUN, "logs", str(ref)], env=self.env, capture_output=True, timeout=60)
        assert result.returncode == 0, result.stderr
        return result.stdout

    def daemon_pid(self) -> int:
        result = self.daemon("status", "--json")
        assert result.returncode == 0, result.stdout + result.stderr
        return int(json.loads(result.stdout)["pid"])

    def job_dir(self, job_id: int) -> Path:
        return self.home / "jobs" / str(job_id)

    def shim_pid(self, job_id: int) -> int:
        shim = wait_for(lambda: _read_json(self.job_dir(job_id) / "shim.json"), what="shim.json")
        return int(shim["shim_pid"])

    def kill_daemon(self) -> None:
        """SIGKILL the daemon, as a crash or the OOM killer would, and wait until it is gone."""
        pid = self.daemon_pid()
        os.kill(pid, signal.SIGKILL)
        wait_for(lambda: not alive(pid), what="daemon to die")

    def cleanup(self) -> None:
        self.daemon("stop", timeout=30)
        for pid in processes_of(self.home):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)


def _read_json(path: Path) -> Optional[dict[str, Any]]:
    try:
        return json.loads(path.read_text())  # type: ignore[no-any-return]
    except (OSError, ValueError):
        return None


class Sshd:
    """A real OpenSSH sshd on 127.0.0.1 (or `address` in a network namespace) with its own host key, letting in
    one test key (as this user)."""

    def __init__(
        self,
        folder: Path,
        forwarding: bool = True,
        env: Optional[dict[str, str]] = None,
        address: str = "127.0.0.1",
        netns: Optional[str] = None,
    ) -> None:
        """`env`: variables every session gets over sshd's own (its SetEnv), e.g. a HOME of the box's own.
        `netns`: run it (and so every session) inside that network namespace (tests/netns.py), listening on
        `address` there."""
        self.folder = folder
        self.address = address
        self.netns = netns
        folder.mkdir(parents=True, exist_ok=True)
        self.host_key = folder / "host_ed25519"
        self.user_key = folder / "user_ed25519"
        for key in (self.host_key, self.user_key):
            if not key.exists():
                subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(key)], check=True)
        shutil.copy(f"{self.user_key}.pub", folder / "authorized_keys")
        self.port = free_port()
        setenv = f"SetEnv {' '.join(f'{name}={value}' for name, value in env.items())}\n" if env else ""
        config = folder / "sshd_config"
        config.write_text(
            f"""Port {self.port}
ListenAddress {address}
HostKey {self.host_key}
PidFile {folder / "sshd.pid"}
AuthorizedKeysFile {folder / "authorized_keys"}
PasswordAuthentication no
KbdInteractiveAuthentication no
PubkeyAuthentication yes
PermitRootLogin prohibit-password
StrictModes no
UsePAM no
AllowStreamLocalForwarding {"yes" if forwarding else "no"}
LogLevel ERROR
{setenv}"""
        )
        self.config = config
        self.start()

    def start(self) -> None:
        """Start sshd: at first, and again after `stop`, on the same address, port, keys and config."""
        Path("/run/sshd").mkdir(exist_ok=True)  # privilege separation needs it; the service would make it
        inside = ["ip", "netns", "exec", self.netns] if self.netns else []  # execs sshd: proc.pid is sshd's
        command = [*inside, "/usr/sbin/sshd", "-D", "-e", "-f", str(self.config)]
        self.proc: subprocess.Popen[bytes] = subprocess.Popen(command, stderr=subprocess.PIPE)
        wait_for(self._listening, timeout=20, what="sshd to listen")

    def _listening(self) -> bool:
        if self.proc.poll() is not None:
            raise AssertionError(f"sshd exited: {self.proc.stderr.read().decode() if self.proc.stderr else ''}")
        if self.netns:  # not reachable from here: read its namespace's listening sockets (state 0A)
            if os.readlink(f"/proc/{self.proc.pid}/ns/net") != f"net:[{os.stat(f'/run/netns/{self.netns}').st_ino}]":
                return False  # `ip netns exec` has not entered the namespace yet
            table = Path(f"/proc/{self.proc.pid}/net/tcp").read_text().splitlines()[1:]
            return any(f[1].endswith(f":{self.port:04X}") and f[3] == "0A" for f in map(str.split, table))
        with socket.socket() as sock:
            return sock.connect_ex((self.address, self.port)) == 0

    @property
    def known_hosts_line(self) -> str:
        return f"[{self.address}]:{self.port} {Path(f'{self.host_key}.pub').read_text().strip()}\n"

    def ssh_command(self, known_hosts: Path) -> list[str]:
        """Plain OpenSSH to this sshd as the test user: the baseline the benchmarks compare tfrun with."""
        return ["ssh", "-p", str(self.port), "-i", str(self.user_key), "-o", "BatchMode=yes",
                "-o", f"UserKnownHostsFile={known_hosts}", f"root@{self.address}"]  # fmt: skip

    def sessions(self) -> set[int]:
        """The sshd's live per-connection processes (its children, zombies left out): one for each SSH
        connection it holds."""
        found = set()
        for entry in os.listdir("/proc"):
            if entry.isdigit():
                with contextlib.suppress(OSError, ValueError, IndexError):
                    stat = Path(f"/proc/{entry}/stat").read_text()
                    if int(stat[stat.rfind(")") + 2 :].split()[1]) == self.proc.pid and alive(int(entry)):
                        found.add(int(entry))
        return found

    def stop(self, sessions: bool = False) -> None:
        """Stop listening. A connection already made lives on in its own process, as it does when an sshd
        service is stopped; `sessions`: end those too (SIGKILL), as when the box itself goes down."""
        held: set[int] = set()
        if sessions and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGSTOP)  # no new connection while its children are found and ended
            held = self.sessions()
            for pid in held:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
            self.proc.terminate()
            self.proc.send_signal(signal.SIGCONT)  # not reaped yet (no wait since the poll): still sshd's pid
        self.proc.terminate()
        self.proc.wait(timeout=20)
        for pid in held:
            wait_for(functools.partial(_gone, pid), what=f"sshd session {pid} to end")


def _gone(pid: int) -> bool:
    return not alive(pid)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def box_sshd(folder: Path, home: Path, address: str, netns: str) -> Sshd:
    """A box's sshd in network namespace `netns`: its sessions get TFRUN_HOME=`home` and `tfrund` on their PATH,
    as an installed box has them (~/.ssh/config alone can name the box then). Stop it when done."""
    box_bin = folder / "box-bin"
    box_bin.mkdir(parents=True)
    write_script(box_bin, "tfrund", f'#!/bin/sh\nexec {shlex.quote(sys.executable)} -m tfrun.runner "$@"\n', True)
    env = {"PATH": f"{box_bin}:/usr/bin:/bin", "TFRUN_HOME": str(home)}
    return Sshd(folder / "box-sshd", address=address, netns=netns, env=env)


def remote_client(tf: Tfrun, sshd: Sshd, trust: bool = True) -> Tfrun:
    """Point `tf`'s client at its own daemon through `sshd`: host "box" in its config, TFRUN_HOST=box."""
    ssh_dir = tf.client_home / ".ssh"
    ssh_dir.mkdir(mode=0o700, exist_ok=True)
    shutil.copy(sshd.user_key, ssh_dir / "id_ed25519")
    (ssh_dir / "id_ed25519").chmod(0o600)
    if trust:
        (ssh_dir / "known_hosts").write_text(sshd.known_hosts_line)
    tfrund = shlex.join([sys.executable, "-m", "tfrun.runner"])
    config = tf.client_home / ".config" / "tfrun" / "config.toml"
    config.parent.mkdir(parents=True, exist_ok=True)
    config.write_text(
        f'[hosts.box]\ndestination = "{getpass.getuser()}@127.0.0.1:{sshd.port}"\n'
        f"tfrund = {json.dumps(tfrund)}\nenv = {{ TFRUN_HOME = {json.dumps(str(tf.home))} }}\n"
    )
    tf.env["TFRUN_HOST"] = "box"
    tf.remote = True
    return tf


@pytest.fixture
def tmux() -> Iterator[str]:
    """The name of a tmux server of the test's own (tmux -L NAME), and NAME-2 for a second one; killed after."""
    if shutil.which("tmux") is None:
        pytest.skip("tmux is not installed (.ci/run installs it)")
    server = f"tfrun-test-{uuid.uuid4().hex[:8]}"
    yield server
    for name in (server, f"{server}-2"):
        subprocess.run(["tmux", "-L", name, "kill-server"], capture_output=True)


@pytest.fixture(scope="session")
def sshd(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Sshd]:
    if not Path("/usr/sbin/sshd").exists():
        pytest.skip("openssh-server is not installed (.ci/run installs it)")
    server = Sshd(tmp_path_factory.mktemp("sshd"))
    yield server
    server.stop()


@pytest.fixture
def tf(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Tfrun]:
    """A tfrun client and daemon; parametrize with "ssh" (indirect) to reach the daemon through sshd."""
    instance = Tfrun(tmp_path / "home")
    if getattr(request, "param", "local") == "ssh":
        remote_client(instance, request.getfixturevalue("sshd"))
    yield instance
    instance.cleanup()


@pytest.fixture
def project(tmp_path: Path) -> Path:
    """A work dir for jobs."""
    folder = tmp_path / "project"
    folder.mkdir()
    return folder


def write_script(folder: Path, name: str, text: str, executable: bool = False) -> Path:
    path = folder / name
    path.write_text(text)
    if executable:
        path.chmod(0o755)
    return path


@pytest.fixture
def gate(tmp_path: Path) -> Path:
    """A file whose appearance releases jobs written with `gated_job`."""
    return tmp_path / "gate"


def gated_job(lines_before: int, lines_after: int, code: int, gate: Path) -> str:
    """Python source of a job that prints numbered lines, waits for `gate` to exist, prints more, exits."""
    return f"""\
import os, sys, time
for i in range({lines_before}):
    print("before", i, "x" * 50)
while not os.path.exists({str(gate)!r}):
    time.sleep(0.05)
for i in range({lines_after}):
    print("after", i, "y" * 50)
sys.exit({code})
"""


class Mailbox:
    """A real SMTP server (aiosmtpd) on 127.0.0.1 that keeps what it receives; it can be stopped and started
    again on the same port, as a mail server that goes down and comes back."""

    def __init__(self, port: Optional[int] = None) -> None:
        self.port = port or free_port()
        self.messages: list[Any] = []  # email.message.EmailMessage, in arrival order
        self.arrived: list[float] = []  # when each one's data was in (time.time())
        self.controller: Optional[Any] = None

    @property
    def url(self) -> str:
        return f"mailto://127.0.0.1:{self.port}?from=tfrund@example.com&to=ml-team@example.com"

    def start(self) -> None:
        import email
        import email.policy

        from aiosmtpd.controller import Controller

        box = self

        class Handler:
            async def handle_DATA(self, server: Any, session: Any, envelope: Any) -> str:
                box.arrived.append(time.time())
                box.messages.append(email.message_from_bytes(envelope.content, policy=email.policy.default))
                return "250 OK"

        self.controller = Controller(Handler(), hostname="127.0.0.1", port=self.port)
        self.controller.start()

    def stop(self) -> None:
        if self.controller is not None:
            self.controller.stop()
            self.controller = None

    def texts(self) -> list[tuple[str, str]]:
        """(subject, plain-text body) of each message received."""
        out = []
        for message in self.messages:
            body = message.get_body(preferencelist=("plain",))
            out.append((str(message["Subject"]), body.get_content() if body is not None else ""))
        return out


class Receiver:
    """A real HTTP server on 127.0.0.1 that keeps the JSON bodies POSTed to it: what apprise's json:// sends."""

    def __init__(self) -> None:
        import http.server
        import threading

        receiver = self
        self.posts: list[dict[str, Any]] = []

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                length = int(self.headers.get("Content-Length", 0))
                receiver.posts.append(json.loads(self.rfile.read(length) or b"{}"))
                self.send_response(200)
                self.end_headers()

            def log_message(self, format: str, *args: Any) -> None:
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.port = self.server.server_address[1]
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    @property
    def url(self) -> str:
        return f"json://127.0.0.1:{self.port}/alerts"

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def mailbox() -> Iterator[Mailbox]:
    box = Mailbox()
    box.start()
    yield box
    box.stop()


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    server = Receiver()
    yield server
    server.stop()


def no_internet(env: dict[str, str]) -> None:
    """Send any web request a daemon started with `env` makes to a dead port on loopback, so a test that
    names a real service (Slack) never reaches beyond this machine; loopback itself stays direct."""
    dead = f"http://127.0.0.1:{free_port()}"
    env.update(HTTP_PROXY=dead, HTTPS_PROXY=dead, http_proxy=dead, https_proxy=dead)
    env.update(NO_PROXY="127.0.0.1,localhost", no_proxy="127.0.0.1,localhost")


def serving_daemon(home: Path) -> Optional[int]:
    """The pid of the live daemon holding `home`'s lock, read from the lock file: asking it (`tfrund status`)
    would make one more client, which tests that count the daemon's connections must not."""
    try:
        text = (home / "run" / "tfrund.lock").read_text().strip()
    except OSError:
        return None
    return int(text) if text.isdigit() and alive(int(text)) else None


def open_fds(pid: int) -> list[str]:
    """What each of the process's file descriptors points at (`socket:[N]`, a path, ...), as /proc shows it."""
    targets = []
    for fd in os.listdir(f"/proc/{pid}/fd"):
        with contextlib.suppress(OSError):  # closed between the listing and the look
            targets.append(os.readlink(f"/proc/{pid}/fd/{fd}"))
    return targets


def sockets(pid: int) -> int:
    return sum(target.startswith("socket:") for target in open_fds(pid))


def own_sockets(home: Path) -> int:
    """How many sockets the daemon of `home` holds with no client: its listener and its event loop's own.
    Measured once the clients before (such as `tfrund start`'s status request) have had time to go."""
    pid = wait_for(lambda: serving_daemon(home), what="a daemon")
    time.sleep(0.5)
    return sockets(pid)


def kill_and_await_successor(home: Path, clients: Callable[[], int], idle_sockets: int) -> int:
    """SIGKILL the daemon of `home`; return the pid of the next one once `clients()` connections reach it
    (the clients that lost the first start it on demand and reconnect). `idle_sockets`: a daemon's own."""
    first = wait_for(lambda: serving_daemon(home), what="a daemon")
    os.kill(first, signal.SIGKILL)
    wait_for(lambda: not alive(first), what="the daemon to die")

    def successor() -> Optional[int]:
        pid = serving_daemon(home)
        return pid if pid != first else None

    pid: int = wait_for(successor, what="a new daemon")
    wait_for(lambda: connected(pid, idle_sockets + clients()), what="the clients to reconnect")
    return pid


def connected(pid: int, count: int) -> bool:
    """Whether the daemon `pid` holds at least `count` sockets, now and a moment later: a starter's status
    request (`tfrund start` asking the daemon it started) comes and goes, a client's connection stays."""
    return sockets(pid) >= count and not time.sleep(0.3) and sockets(pid) >= count
