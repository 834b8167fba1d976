"""`tfrun forward` (issue 20): a port on the box, reached through tfrun's SSH connection, with the connection
keeper and without it; another user of the client's machine is refused at the local port (issue 44).

Two network namespaces of the test's own (tests/harness/netns.py): the client's and the box's, one veth pair between
them. A real sshd and a plain HTTP server run in the box's namespace, the server on the box's 127.0.0.1 only;
every tfrun command and every HTTP request runs in the client's namespace, where the box's loopback does not
exist: only an SSH channel (direct-tcpip) gets there.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from harness import Sshd, Tfrun, box_sshd, free_port, keeper_socket, keepers_of
from harness.netns import Namespace, Network, Unavailable
from harness.otheruser import OtherUser, mallory  # noqa: F401

pytestmark = [pytest.mark.ssh, pytest.mark.root]

_FETCH = """
import sys, urllib.request
try:
    print(urllib.request.urlopen(sys.argv[1], timeout=20).read().decode(), end="")
except OSError as exc:
    print("failed:", getattr(exc, "reason", exc), end="")
"""


@dataclass
class Box:
    """The client (`tf`, whose commands run in `client`), the box's sshd, and the port of the HTTP server
    that listens on the box's own 127.0.0.1, serving `page` at /page.txt (each request it got is in
    `web_log`)."""

    tf: Tfrun
    client: Namespace
    sshd: Sshd
    web_port: int
    page: str
    web_log: Path

    def fetch(self, url: str, user: OtherUser | None = None) -> str:
        """GET `url` from the client's namespace (as `user`, else as the test's user): the body, or `failed: WHY`."""
        who = [] if user is None else ["setpriv", f"--reuid={user.uid}", f"--regid={user.gid}", "--clear-groups"]
        return subprocess.run([*self.client.exec, *who, sys.executable, "-c", _FETCH, url], capture_output=True,
                              text=True, timeout=60).stdout  # fmt: skip

    def forward(self, *args: str, env: dict[str, str] | None = None) -> tuple[subprocess.Popen[str], str]:
        """Start `tfrun forward ARGS` in the client's namespace; it and the first line it printed."""
        proc = subprocess.Popen(
            [*self.client.exec, sys.executable, "-m", "tfrun.client", "forward", "--host", "box", *args],
            env={**self.tf.env, **(env or {})},
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        assert proc.stdout is not None
        return proc, proc.stdout.readline()


@pytest.fixture
def box(tmp_path: Path) -> Iterator[Box]:
    if not Path("/usr/sbin/sshd").exists():
        pytest.skip("openssh-server is not installed (.ci/run installs it)")
    with Network("forward") as net, contextlib.ExitStack() as stop:  # leaving: processes first, then the net
        try:
            client, box_ns = net.namespace("client"), net.namespace("box")
        except Unavailable as exc:
            pytest.skip(str(exc))
        _, box_address = net.link(client, box_ns)
        home = tmp_path / "home"
        sshd = box_sshd(tmp_path, home, box_address, box_ns.name)
        stop.callback(sshd.stop)
        site = tmp_path / "site"
        site.mkdir()
        page = f"served on the box's loopback, pid {os.getpid()}\n"
        (site / "page.txt").write_text(page)
        web_port = free_port()
        web_log = tmp_path / "web.log"
        with open(web_log, "wb") as log:
            web = subprocess.Popen([*box_ns.exec, sys.executable, "-m", "http.server", "--bind", "127.0.0.1",
                                    "--directory", str(site), str(web_port)],
                                   stdout=subprocess.DEVNULL, stderr=log)  # fmt: skip
        stop.callback(web.wait)
        stop.callback(web.kill)
        tf = Tfrun(home, prefix=client.exec)
        stop.callback(tf.cleanup)
        ssh_dir = tf.client_home / ".ssh"
        ssh_dir.mkdir(mode=0o700)
        (ssh_dir / "known_hosts").write_text(sshd.known_hosts_line)
        tf.ok("hosts", "add", "box", f"root@{box_address}:{sshd.port}", "--identity-file", str(sshd.user_key))
        result = Box(tf, client, sshd, web_port, page, web_log)
        wait = f"import socket, time\nwhile socket.socket().connect_ex(('127.0.0.1', {web_port})): time.sleep(0.1)"
        subprocess.run([*box_ns.exec, sys.executable, "-c", wait], timeout=30, check=True)
        yield result


def _stop(proc: subprocess.Popen[str]) -> tuple[int, str]:
    """Ctrl-C the forward; its exit code and what it said on stderr."""
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=30)
    return proc.returncode, err


@pytest.mark.parametrize("keeper", [True, False], ids=["keeper", "own-connection"])
def test_forward_reaches_a_port_only_the_box_can_reach(box: Box, keeper: bool) -> None:
    local = free_port()
    assert box.fetch(f"http://127.0.0.1:{box.web_port}/page.txt").startswith("failed:"), "not reachable directly"
    env = {} if keeper else {"TFRUN_SSH_PERSIST": "0"}
    proc, line = box.forward(str(box.web_port), str(local), env=env)
    try:
        assert line == f"127.0.0.1:{local} -> box port {box.web_port} (Ctrl-C stops)\n", proc.stderr
        for _ in range(3):  # each connection gets a channel of its own
            assert box.fetch(f"http://127.0.0.1:{local}/page.txt") == box.page
        assert len(keepers_of(box.tf)) == (1 if keeper else 0)
    finally:
        code, err = _stop(proc)
    assert code == 130 and err == "", err
    assert box.fetch(f"http://127.0.0.1:{local}/page.txt").startswith("failed:"), "the port is closed after Ctrl-C"


@pytest.mark.parametrize("keeper", [True, False], ids=["keeper", "own-connection"])
def test_another_local_user_is_refused_at_the_port(box: Box, mallory: OtherUser, keeper: bool) -> None:  # noqa: F811
    """127.0.0.1 is every local user's: mallory connecting to the forward's port is closed unheard, nothing of
    hers reaches the box, and the refusal is told once; the user's own connections go through."""
    local = free_port()
    proc, line = box.forward(str(box.web_port), str(local), env={} if keeper else {"TFRUN_SSH_PERSIST": "0"})
    try:
        assert line.startswith(f"127.0.0.1:{local} -> "), proc.stderr
        for _ in range(2):
            got = box.fetch(f"http://127.0.0.1:{local}/page.txt?from=mallory", user=mallory)
            assert got.startswith("failed:"), got
        assert box.fetch(f"http://127.0.0.1:{local}/page.txt") == box.page, "the user's own connection works"
    finally:
        code, err = _stop(proc)
    assert code == 130 and err == (
        f"tfrun: refused a connection to 127.0.0.1:{local} from uid {mallory.uid}, not you: only you may use this "
        "forward\n"
    ), err
    served = box.web_log.read_text()
    assert "/page.txt" in served and "mallory" not in served, served


def test_forward_json_and_a_port_where_nothing_listens(box: Box) -> None:
    idle_port = free_port()
    proc, line = box.forward(str(idle_port), "0", "--json")
    try:
        shown = json.loads(line)
        assert shown["box_port"] == idle_port and shown["host"] == "box" and shown["local_port"] > 0
        assert box.fetch(f"http://127.0.0.1:{shown['local_port']}/").startswith("failed:")
    finally:
        code, err = _stop(proc)
    lines = err.splitlines()
    assert code == 130 and "Traceback" not in err, err
    assert lines[0] == (
        f"tfrun: nothing answers on box port {idle_port} yet (Connection refused); forwarding anyway"
    ), err
    assert lines[1] == f"tfrun: a connection to box port {idle_port} failed: Connection refused", err


def test_forward_refused_by_the_box_is_one_line(box: Box) -> None:
    box.sshd.stop()
    with open(box.sshd.config, "a") as config:
        config.write("AllowTcpForwarding no\n")
    box.sshd.start()
    for persist in ("1", "0"):
        box.tf.env["TFRUN_SSH_PERSIST"] = persist
        result = box.tf.run("forward", "--host", "box", str(box.web_port))
        assert result.returncode != 0 and result.stdout == "", result
        assert result.stderr == (
            "tfrun: error: the box's sshd refuses port forwarding (AllowTcpForwarding no, or a restricted key)\n"
        ), result.stderr


def test_forward_needs_a_box_and_a_free_local_port(box: Box) -> None:
    local = box.tf.run("forward", str(box.web_port), "--host", "local")
    assert (local.returncode, local.stderr) == (
        2, "tfrun: error: forward needs a box (--host NAME or TFRUN_HOST): this machine's ports need no forwarding\n"
    )  # fmt: skip
    proc, line = box.forward(str(box.web_port), "0", "--json")
    try:
        taken = json.loads(line)["local_port"]
        busy = box.tf.run("forward", "--host", "box", str(box.web_port), str(taken))
        assert busy.returncode == 2, busy.stderr
        assert busy.stderr == f"tfrun: error: cannot listen on 127.0.0.1:{taken}: Address already in use\n"
    finally:
        _stop(proc)


def test_a_keeper_of_an_older_tfrun_is_named_with_the_way_around(box: Box) -> None:
    """A keeper started by a tfrun before forwards (no forward socket beside its own) is one line saying so."""
    box.tf.ok("ps", "--host", "box")  # starts the keeper
    (keeper,) = keepers_of(box.tf)
    socket_path = keeper_socket(keeper)
    socket_path.with_suffix(".fwd").unlink()
    result = box.tf.run("forward", "--host", "box", str(box.web_port))
    assert (result.returncode, result.stdout) == (125, ""), result.stderr
    assert result.stderr == (
        "tfrun: error: the connection keeper for box is an older tfrun's, which cannot forward: it ends after 10 "
        "idle minutes, or forward without it (TFRUN_SSH_PERSIST=0)\n"
    )
