"""A link that dies without closing (issue 26): a laptop that sleeps, a Wi-Fi change, a NAT that forgets.

Between tfrun and the test's sshd stands a relay of the test's own (tests/harness/relay.py) that freezes the connections
it holds (nothing passes, nothing closes) or everything, then resumes. A `logs -f` that follows a job printing
twice a second must print again within 30 s of a freeze, with no line lost or repeated; a new verb must answer
within 30 s; while everything is frozen a verb must end within 60 s with one line (exit 125); and 40 s later,
with the link back, the follower must be back within 30 s and end with the job's exit code. The same through
the connection keeper, with TFRUN_SSH_PERSIST=0, and through a jump host (the relay on the first hop).
"""

from __future__ import annotations

import getpass
import json
import os
import shlex
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional

import pytest
from harness import TFRUN, Sshd, Tfrun, free_port, remote_client, wait_for, write_script
from harness.relay import Relay

pytestmark = [pytest.mark.slow]

TICKS = """import os, sys, time
i = 0
while not os.path.exists(sys.argv[1]):
    print("tick", i, flush=True)
    i += 1
    time.sleep(0.5)
print("done", flush=True)
sys.exit(3)
"""


@dataclass
class Follower:
    """A `tfrun logs -f` in the background: each line it prints, with when it came."""

    proc: subprocess.Popen[str]
    lines: list[tuple[float, str]] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)

    def start(self) -> None:
        def read(stream: object, into: list[tuple[float, str]] | list[str], timed: bool) -> None:
            for line in stream:  # type: ignore[attr-defined]
                into.append((time.monotonic(), line.rstrip("\n")) if timed else line.rstrip("\n"))  # type: ignore[arg-type]

        threading.Thread(target=read, args=(self.proc.stdout, self.lines, True), daemon=True).start()
        threading.Thread(target=read, args=(self.proc.stderr, self.errors, False), daemon=True).start()

    def prints_again(self, within: float) -> float:
        """Seconds until the next line after now; fails the test after `within`."""
        start, count = time.monotonic(), len(self.lines)
        wait_for(lambda: len(self.lines) > count, timeout=within, what="the follower to print again")
        return self.lines[count][0] - start

    def ticks(self) -> list[int]:
        return [int(text.split()[1]) for _, text in self.lines if text.startswith("tick ")]


def _point_at(tf: Tfrun, sshd: Sshd, relay: Relay, jump: bool) -> None:
    """The client's host "box" through the relay: its destination, or (`jump`) the jump host in front of it."""
    remote_client(tf, sshd)
    key = sshd.known_hosts_line.split(" ", 1)[1]
    (tf.client_home / ".ssh" / "known_hosts").write_text(f"[127.0.0.1]:{relay.port} {key}[127.0.0.1]:{sshd.port} {key}")
    user = getpass.getuser()
    tfrund = shlex.join([sys.executable, "-m", "tfrun.runner"])
    hop = f'jump = "{user}@127.0.0.1:{relay.port}"\n' if jump else ""
    destination = f"{user}@127.0.0.1:{sshd.port if jump else relay.port}"
    (tf.client_home / ".config" / "tfrun" / "config.toml").write_text(
        f'[hosts.box]\ndestination = "{destination}"\n{hop}'
        f"tfrund = {json.dumps(tfrund)}\nenv = {{ TFRUN_HOME = {json.dumps(str(tf.home))} }}\n"
    )


@pytest.fixture
def relay(sshd: Sshd) -> Iterator[Relay]:
    link = Relay(sshd.port)
    yield link
    link.close()


def _timed(tf: Tfrun, *args: str) -> tuple[subprocess.CompletedProcess[str], float]:
    start = time.monotonic()
    result = tf.run(*args, timeout=120)
    return result, time.monotonic() - start


@pytest.mark.ssh
@pytest.mark.parametrize("way", ["keeper", "direct", "jump"])
def test_a_frozen_link_heals_by_itself_and_no_verb_hangs(
    tf: Tfrun, sshd: Sshd, relay: Relay, project: Path, tmp_path: Path, way: str
) -> None:
    _point_at(tf, sshd, relay, jump=way == "jump")
    if way == "direct":
        tf.env["TFRUN_SSH_PERSIST"] = "0"
    gate = tmp_path / "gate"
    job = tf.submit(str(write_script(project, "ticks.py", TICKS)), str(gate))
    proc = subprocess.Popen([*TFRUN, "logs", "-f", str(job)], env=tf.env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)  # fmt: skip
    follower = Follower(proc)
    follower.start()
    try:
        wait_for(lambda: len(follower.lines) >= 4, what="the follower to print")

        assert relay.freeze_held() >= 1
        assert follower.prints_again(within=30) < 30
        listed, took = _timed(tf, "ps")
        assert listed.returncode == 0, listed.stderr
        assert took < 30

        relay.freeze_all()
        frozen_at = time.monotonic()
        refused, took = _timed(tf, "ps")
        assert refused.returncode == 125, refused.stdout + refused.stderr
        assert took < 60
        lines = refused.stderr.splitlines()
        assert len(lines) == 1 and lines[0].startswith("tfrun: error: cannot connect to "), refused.stderr
        time.sleep(max(0.0, 40 - (time.monotonic() - frozen_at)))
        relay.resume()
        assert follower.prints_again(within=30) < 30

        gate.touch()
        assert proc.wait(timeout=60) == 3, follower.errors
    finally:
        proc.kill()
        gate.touch()
    ticks = follower.ticks()
    assert ticks == list(range(len(ticks))), "a line lost or repeated"
    assert follower.lines[-1][1] == "done"
    # The 40 s outage is told once, and its end; a freeze healed by a fresh connection within 5 s is not.
    down = [line for line in follower.errors if line.startswith("tfrun: lost the connection to box")]
    back = [line for line in follower.errors if line.startswith("tfrun: connected to box again, after ")]
    assert 1 <= len(down) == len(back) <= 2 and len(follower.errors) == len(down) + len(back), follower.errors


@pytest.mark.ssh
def test_the_users_ssh_config_sets_the_connect_deadline(tf: Tfrun, sshd: Sshd, relay: Relay) -> None:
    """ConnectTimeout in ~/.ssh/config wins over tfrun's 15 s, as it does for ssh."""
    _point_at(tf, sshd, relay, jump=False)
    tf.env["TFRUN_SSH_PERSIST"] = "0"
    (tf.client_home / ".ssh" / "config").write_text("Host 127.0.0.1\n  ConnectTimeout 2\n")
    relay.freeze_all()
    refused, took = _timed(tf, "ps")
    assert refused.returncode == 125
    assert refused.stderr.strip().endswith("no answer within 2s"), refused.stderr
    assert took < 10


def _link_options(home: Path, config: Optional[str]) -> dict[str, object]:
    """What client/link/ssh.py sets for a connection to 127.0.0.1, with `config` as ~/.ssh/config."""
    (home / ".ssh").mkdir(parents=True, exist_ok=True)
    if config is not None:
        (home / ".ssh" / "config").write_text(config)
    code = "from tfrun.client.link import ssh; print(repr(ssh._link_options('127.0.0.1', {'port': 2222})))"
    env = {"HOME": str(home), "PATH": "/usr/bin:/bin"}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True).stdout
    return eval(out)  # type: ignore[no-any-return]


def test_keepalives_are_on_unless_the_users_ssh_config_says_otherwise(tmp_path: Path) -> None:
    assert _link_options(tmp_path / "a", None) == {
        "keepalive_interval": 5.0,
        "keepalive_count_max": 2,
        "connect_timeout": 15.0,
    }
    said = "Host 127.0.0.1\n  ServerAliveInterval 30\n  ServerAliveCountMax 4\n"
    assert _link_options(tmp_path / "b", said) == {
        "keepalive_interval": 30,
        "keepalive_count_max": 4,
        "connect_timeout": 15.0,
    }
    # Another host's settings are not this one's.
    assert _link_options(tmp_path / "c", "Host elsewhere\n  ServerAliveInterval 0\n")["keepalive_interval"] == 5.0


def test_the_keepalives_of_tfruns_own_ssh_config_block_are_not_the_links(tmp_path: Path) -> None:
    """`tfrun ssh-config 127.0.0.1 --write` writes 30 s x 4 for VS Code and ssh: a frozen link was noticed by
    tfrun after 150 s through such a block, and after 15 s without. A value edited into the block is the user's."""
    (tmp_path / "d").mkdir()
    env = {**os.environ, "HOME": str(tmp_path / "d")}
    subprocess.run([sys.executable, "-m", "tfrun.client", "ssh-config", "127.0.0.1", "gpu:2222", "--write"], env=env,
                   check=True, capture_output=True)  # fmt: skip
    block = (tmp_path / "d" / ".ssh" / "config").read_text()
    assert "ServerAliveInterval 30" in block
    ours = {"keepalive_interval": 5.0, "keepalive_count_max": 2, "connect_timeout": 15.0}
    assert _link_options(tmp_path / "d", None) == ours
    edited = block.replace("ServerAliveInterval 30", "ServerAliveInterval 60")
    assert _link_options(tmp_path / "d", edited)["keepalive_interval"] == 60


def _fetch(url: str) -> Optional[bytes]:
    try:
        with urllib.request.urlopen(url, timeout=5) as answer:
            return answer.read()  # type: ignore[no-any-return]
    except OSError:
        return None


@pytest.mark.ssh
@pytest.mark.parametrize("way", ["keeper", "direct"])
def test_a_forward_outlives_a_frozen_link(tf: Tfrun, sshd: Sshd, relay: Relay, tmp_path: Path, way: str) -> None:
    """`tfrun forward` keeps serving: once the frozen connection is declared dead, the next browser connection
    gets a tunnel on a new one (the keeper started again, or the forward's own connection opened again)."""
    _point_at(tf, sshd, relay, jump=False)
    if way == "direct":
        tf.env["TFRUN_SSH_PERSIST"] = "0"
    (tmp_path / "web").mkdir()
    (tmp_path / "web" / "page.txt").write_text("hello through the tunnel\n")
    web_port, local = free_port(), free_port()
    web = subprocess.Popen([sys.executable, "-m", "http.server", "-b", "127.0.0.1", "-d", str(tmp_path / "web"),
                            str(web_port)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)  # fmt: skip
    proc = subprocess.Popen([*TFRUN, "forward", str(web_port), str(local)], env=tf.env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)  # fmt: skip
    try:
        url = f"http://127.0.0.1:{local}/page.txt"
        wait_for(lambda: _fetch(url) == b"hello through the tunnel\n", what="the forward to serve")
        assert relay.freeze_held() >= 1
        frozen_at = time.monotonic()
        wait_for(lambda: _fetch(url) == b"hello through the tunnel\n", timeout=45, what="the forward to heal")
        assert time.monotonic() - frozen_at < 45
        assert proc.poll() is None
    finally:
        proc.kill()
        web.kill()
