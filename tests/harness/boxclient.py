"""The user's side of a box (the chroot one of harness/container.py, the Podman one of harness/podman.py): a home
with a key pair, ~/.ssh/config from `tfrun ssh-config`, plain ssh and tfrun."""

from __future__ import annotations

import os
import shlex
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from .home import TFRUN


class Reachable(Protocol):
    """What a `Client` logs in to: its address as this side reaches it."""

    address: str


@dataclass
class Client:
    """The user's side: a home with a key pair, ~/.ssh/config from `tfrun ssh-config`, and tfrun."""

    home: Path
    key: Path
    box: Reachable

    @property
    def env(self) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith(("TFRUN_", "SSH_AUTH_SOCK", "XDG_"))}
        env["HOME"] = str(self.home)
        return env

    def ssh_args(self, strict: str = "yes") -> list[str]:
        return ["ssh", "-F", str(self.home / ".ssh" / "config"), "-o", "BatchMode=yes",
                "-o", f"UserKnownHostsFile={self.home / '.ssh' / 'known_hosts'}",
                "-o", f"StrictHostKeyChecking={strict}"]  # fmt: skip

    def ssh(self, *command: str, strict: str = "yes", check: bool = True) -> subprocess.CompletedProcess[str]:
        result = subprocess.run(
            [*self.ssh_args(strict), "box", *command], env=self.env, capture_output=True, text=True, timeout=120
        )
        if check:
            assert result.returncode == 0, f"ssh box {command} -> {result.returncode}\n{result.stderr}"
        return result

    def tfrun(self, *args: str, timeout: float = 180) -> subprocess.CompletedProcess[str]:
        return subprocess.run([*TFRUN, *args], env=self.env, capture_output=True, text=True, timeout=timeout)

    def ok(self, *args: str) -> str:
        result = self.tfrun(*args)
        assert result.returncode == 0, f"tfrun {shlex.join(args)} -> {result.returncode}\n{result.stderr}"
        return result.stdout
