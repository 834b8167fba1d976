"""A second real Unix user on this machine, for the tests of a box shared by a team (issue 27).

Made with `useradd` (the tests run as root in CI; elsewhere they are skipped, saying why), removed with
`userdel` afterwards. Its commands run with its own uid, gid and HOME (subprocess's `user=`), never through a
shell. The tests' interpreter lives under /root (pyenv), which only root may enter: the user is given the right
to pass through /root and nothing more (an ACL entry `u:NAME:x`, removed afterwards), so it can run this very
Python and tfrun, as a second user of a box would run their own install.
"""

from __future__ import annotations

import ast
import contextlib
import os
import pwd
import shutil
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Optional

import pytest


class OtherUser:
    """One user made for a test: its name, uid, gid and home, and a way to run commands as it."""

    def __init__(self, name: str) -> None:
        entry = pwd.getpwnam(name)
        self.name = name
        self.uid = entry.pw_uid
        self.gid = entry.pw_gid
        self.home = Path(entry.pw_dir)

    def env(self, **extra: str) -> dict[str, str]:
        """A clean environment of the user's own: HOME, USER, a PATH with this Python's folder first."""
        path = f"{Path(sys.executable).parent}:/usr/local/bin:/usr/bin:/bin"
        return {"HOME": str(self.home), "USER": self.name, "LOGNAME": self.name, "PATH": path, **extra}

    def run(
        self, argv: list[str], env: Optional[dict[str, str]] = None, timeout: float = 60, **kw: Any
    ) -> subprocess.CompletedProcess[str]:
        """`argv` as this user (no shell), in its home unless `cwd` says otherwise; output captured as text."""
        kw.setdefault("cwd", str(self.home))
        return subprocess.run(argv, user=self.uid, group=self.gid, extra_groups=[], env=env or self.env(),
                              capture_output=True, text=True, timeout=timeout, **kw)  # fmt: skip

    def popen(self, argv: list[str], env: Optional[dict[str, str]] = None, **kw: Any) -> subprocess.Popen[str]:
        kw.setdefault("cwd", str(self.home))
        return subprocess.Popen(argv, user=self.uid, group=self.gid, extra_groups=[], env=env or self.env(),
                                text=True, **kw)  # fmt: skip

    def python(self, code: str, *args: str, **kw: Any) -> subprocess.CompletedProcess[str]:
        """Python `code` (with `args` in sys.argv[1:]) run as this user, with this test run's interpreter."""
        return self.run([sys.executable, "-c", code, *args], **kw)


def _unavailable() -> Optional[str]:
    """Why no second user can be made here, or None."""
    if os.geteuid() != 0:
        return "needs root to make a second user with useradd (CI runs as root)"
    for tool in ("useradd", "userdel", "setfacl"):
        if shutil.which(tool) is None:
            return f"{tool} is not installed (.ci/run installs it)"
    return None


@contextlib.contextmanager
def other_user(prefix: str = "tfo") -> Iterator[OtherUser]:
    """A fresh user for the block, able to run this Python; gone afterwards, with its home and processes."""
    why = _unavailable()
    if why is not None:
        pytest.skip(why)
    name = f"{prefix}{uuid.uuid4().hex[:8]}"
    subprocess.run(["useradd", "--create-home", "--shell", "/bin/sh", name], check=True, capture_output=True)
    passes = [folder for folder in _folders_above(Path(sys.executable).resolve()) if not _others_may_pass(folder)]
    try:
        for folder in passes:
            subprocess.run(["setfacl", "-m", f"u:{name}:x", str(folder)], check=True, capture_output=True)
        yield OtherUser(name)
    finally:
        subprocess.run(["pkill", "-KILL", "-u", name], capture_output=True)
        for folder in passes:
            subprocess.run(["setfacl", "-x", f"u:{name}", str(folder)], capture_output=True)
        subprocess.run(["userdel", "--remove", "--force", name], capture_output=True)


def _folders_above(path: Path) -> list[Path]:
    return list(reversed(path.parents))


def _others_may_pass(folder: Path) -> bool:
    return bool(folder.stat().st_mode & 0o001)


@pytest.fixture
def mallory() -> Iterator[OtherUser]:
    """Another user of the box: the one who tries each attack."""
    with other_user("tfm") as user:
        yield user


# Reads every process's command line (as `ps` shows them) until its stdin closes, and prints those holding the
# secret it was given in WATCH_FOR. A process is looked at for 2 s after it appears, so its exec is behind it.
_WATCH = r"""
import os, select, sys, time
secret = os.environ.pop("WATCH_FOR").encode()
young, looked, hits = {}, set(), set()
print("watching", flush=True)
while not select.select([sys.stdin], [], [], 0)[0]:
    now = time.monotonic()
    for pid in os.listdir("/proc"):
        if pid.isdigit() and pid not in looked:
            young.setdefault(pid, now)
    for pid, born in list(young.items()):
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                line = f.read()
        except OSError:
            line = b""
        if secret in line:
            hits.add(line.replace(b"\0", b" ").decode(errors="replace"))
        if now - born > 2.0:
            del young[pid]
            looked.add(pid)
print(repr(sorted(hits)), flush=True)
"""


class CommandLineWatch:
    """`user` reading every process's command line for `secret`, from now until `seen`: what any user of the box
    can do with `ps`. `control` puts the secret on a command line of the test's own, so that a watch that saw
    nothing is known to have been able to see it."""

    def __init__(self, user: OtherUser, secret: str) -> None:
        self.secret = secret
        self.proc = user.popen([sys.executable, "-c", _WATCH], env=user.env(WATCH_FOR=secret),
                               stdin=subprocess.PIPE, stdout=subprocess.PIPE)  # fmt: skip
        assert self.proc.stdout is not None and self.proc.stdout.readline() == "watching\n"

    def control(self) -> str:
        """Run a process with the secret on its command line; the line the watch must see for it."""
        argv = [sys.executable, "-c", "import time; time.sleep(1)", f"{self.secret}-on-argv"]
        assert subprocess.run(argv).returncode == 0
        return " ".join(argv) + " "

    def seen(self) -> list[str]:
        """Every command line that held the secret while the watch ran."""
        out, _ = self.proc.communicate(input="", timeout=60)
        found: list[str] = ast.literal_eval(out.strip())
        return found
