"""A box behind a jump host (issue 18): reachable only through the bastion, the way `ssh box` reaches it.

Three network namespaces of the test's own (tests/harness/netns.py): the client's, the bastion's and the box's, a veth
pair between client and bastion and one between bastion and box, no routes beyond them and no forwarding. A
real sshd runs in the bastion's namespace and another in the box's; tfrund is started on the box through SSH,
so it and its jobs run in the box's namespace too. Every tfrun and ssh command runs in the client's namespace,
where the box's address is unreachable: only the bastion's sshd (ProxyJump's direct-tcpip) gets there.
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

import pytest
from harness import Sshd, Tfrun, box_sshd, keeper_socket, keepers_of, wait_for, write_script
from harness.netns import Namespace, Network, Unavailable

pytestmark = [pytest.mark.ssh, pytest.mark.root]


@dataclass
class Bastion:
    """The client (`tf`, whose commands run in `client`), the jump host's sshd and the box's, and the
    box's namespace. known_hosts holds both host keys; each sshd lets in its own `user_key` only."""

    tf: Tfrun
    client: Namespace
    jump: Sshd
    box: Sshd
    box_ns: Namespace

    def authorize(self, sshd: Sshd, *keys: Path) -> None:
        """Let `keys` (private key paths) in on `sshd`, and no other key."""
        text = "".join(Path(f"{key}.pub").read_text() for key in keys)
        (sshd.folder / "authorized_keys").write_text(text)


@pytest.fixture
def bastion(tmp_path: Path) -> Iterator[Bastion]:
    if not Path("/usr/sbin/sshd").exists():
        pytest.skip("openssh-server is not installed (.ci/run installs it)")
    with Network("bastion") as net, contextlib.ExitStack() as stop:  # leaving: processes first, then the net
        try:
            client, jump_ns, box_ns = net.namespace("client"), net.namespace("jump"), net.namespace("box")
        except Unavailable as exc:
            pytest.skip(str(exc))
        _, jump_address = net.link(client, jump_ns)
        _, box_address = net.link(jump_ns, box_ns)
        home = tmp_path / "home"
        jump = Sshd(tmp_path / "jump-sshd", address=jump_address, netns=jump_ns.name)
        stop.callback(jump.stop)
        box = box_sshd(tmp_path, home, box_address, box_ns.name)
        stop.callback(box.stop)
        tf = Tfrun(home, prefix=client.exec)
        stop.callback(tf.cleanup)
        ssh_dir = tf.client_home / ".ssh"
        ssh_dir.mkdir(mode=0o700)
        (ssh_dir / "known_hosts").write_text(jump.known_hosts_line + box.known_hosts_line)
        yield Bastion(tf, client, jump, box, box_ns)


def one_line(stderr: str) -> str:
    lines = stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in stderr, stderr
    return lines[0]


def sessions(sshd: Sshd) -> set[int]:
    """The sshd's per-connection processes (its children): one for each SSH connection it holds."""
    found = set()
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            with contextlib.suppress(OSError):
                stat = Path(f"/proc/{entry}/stat").read_text()
                if int(stat[stat.rfind(")") + 2 :].split()[1]) == sshd.proc.pid:
                    found.add(int(entry))
    return found


def test_hosts_add_jump_reaches_a_box_that_only_the_bastion_can_reach(bastion: Bastion, project: Path) -> None:
    tf, jump, box = bastion.tf, bastion.jump, bastion.box
    key = box.user_key
    bastion.authorize(jump, key)  # `--identity-file` is offered on every hop: one key for the whole way
    destination = f"root@{box.address}:{box.port}"

    tf.ok("hosts", "add", "direct", destination, "--identity-file", str(key))
    direct = tf.run("ps", "--host", "direct", timeout=30)
    assert direct.returncode == 125, direct.stderr
    assert f"cannot connect to {destination}: Network is unreachable" in one_line(direct.stderr)

    tf.ok("hosts", "add", "box", destination, "--jump", f"root@{jump.address}:{jump.port}", "--identity-file", str(key))
    write_script(project, "where.py", "import os\nprint('on', os.readlink('/proc/self/ns/net'))\nprint('done')\n")
    job = tf.submit("--host", "box", str(project / "where.py"))
    logs = tf.run("logs", "-f", "--host", "box", str(job))
    assert logs.returncode == 0, logs.stderr
    assert logs.stdout == f"on net:[{bastion.box_ns.inode}]\ndone\n", "the job ran in the box's namespace"
    jobs = json.loads(tf.ok("ps", "--host", "box", "--all", "--json"))
    assert [(j["id"], j["state"], j["exit_code"]) for j in jobs] == [(job, "succeeded", 0)]


def test_proxyjump_in_ssh_config_reaches_the_box_as_ssh_does(bastion: Bastion) -> None:
    """The box named only in ~/.ssh/config, the bastion by a Host of its own, each with its own key: what
    plain `ssh box` does, `tfrun ps --host box` does."""
    tf, jump, box = bastion.tf, bastion.jump, bastion.box
    ssh_dir = tf.client_home / ".ssh"
    # Absolute paths: OpenSSH takes ~ from the passwd entry, not from $HOME, and must not read the real one.
    config = ssh_dir / "config"
    config.write_text(
        f"""Host box
    Hostname {box.address}
    Port {box.port}
    User root
    IdentityFile {box.user_key}
    ProxyJump bastion
Host bastion
    Hostname {jump.address}
    Port {jump.port}
    User root
    IdentityFile {jump.user_key}
Host *
    UserKnownHostsFile {ssh_dir / "known_hosts"}
    IdentitiesOnly yes
    StrictHostKeyChecking yes
    BatchMode yes
"""
    )
    ssh = [*bastion.client.exec, "ssh", "-F", str(config)]
    baseline = subprocess.run([*ssh, "box", "true"], capture_output=True, text=True, timeout=60)
    assert baseline.returncode == 0, baseline.stderr
    direct = subprocess.run([*ssh, "-o", "ProxyJump=none", "box", "true"], capture_output=True, text=True, timeout=60)
    assert direct.returncode == 255 and "Network is unreachable" in direct.stderr, direct.stderr

    result = tf.run("ps", "--host", "box", "--all", "--json")
    assert result.returncode == 0 and json.loads(result.stdout) == [], result.stderr
    assert tf.run("hosts", "list", "--json").stdout.count(box.address) == 0, "~/.ssh/config alone named it"

    (ssh_dir / "known_hosts").write_text(box.known_hosts_line)  # the bastion's key forgotten: both refuse
    refused = subprocess.run([*ssh, "box", "true"], capture_output=True, text=True, timeout=60)
    assert refused.returncode == 255 and "Host key verification failed" in refused.stderr, refused.stderr
    result = tf.run("ps", "--host", "box")
    assert result.returncode == 125, result.stderr
    assert "the host key of a jump host on the way to box (ProxyJump" in one_line(result.stderr)


def test_the_keeper_holds_one_connection_through_the_bastion(bastion: Bastion) -> None:
    tf, jump, box = bastion.tf, bastion.jump, bastion.box
    tf.env.pop("TFRUN_SSH_PERSIST", None)  # the keeper is on by default
    bastion.authorize(jump, box.user_key)
    tf.ok("hosts", "add", "box", f"root@{box.address}:{box.port}", "--jump", f"root@{jump.address}:{jump.port}",
          "--identity-file", str(box.user_key))  # fmt: skip
    assert json.loads(tf.ok("ps", "--host", "box", "--json")) == []
    [keeper] = keepers_of(tf)
    socket = keeper_socket(keeper)
    assert socket.is_socket()

    def one_connection() -> Optional[set[int]]:
        held = sessions(jump)
        return held if len(held) == 1 else None  # the keeper's (a first direct one, if any, has gone)

    held = wait_for(one_connection, what="one connection through the bastion")
    assert json.loads(tf.ok("ps", "--host", "box", "--json")) == []
    assert keepers_of(tf) == [keeper] and sessions(jump) == held, "the second command rode the same connection"
