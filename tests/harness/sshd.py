"""A real OpenSSH sshd on 127.0.0.1 (or in a network namespace of the test's own), and a `Tfrun` whose client
reaches its daemon through it (`remote_client`)."""

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
from pathlib import Path
from typing import Optional

import pytest

from .home import Tfrun, write_script
from .processes import alive, free_port, wait_for


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
        `netns`: run it (and so every session) inside that network namespace (tests/harness/netns.py), listening on
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


# A test run on a local daemon and on one reached through a real sshd (the tf fixture's two kinds); the ssh case
# carries the ssh marker.
local_and_ssh = pytest.mark.parametrize("tf", ["local", pytest.param("ssh", marks=pytest.mark.ssh)], indirect=True)


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
