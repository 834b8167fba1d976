"""A second real Unix user on this machine, for the tests of a box shared by a team (issue 27).

Made with `useradd` (the tests run as root in CI; elsewhere they are skipped, saying why), removed with
`userdel` afterwards. Its commands run with its own uid, gid and HOME (subprocess's `user=`), never through a
shell. The tests' interpreter lives under /root (pyenv), which only root may enter: the user is given the right
to pass through /root and nothing more (an ACL entry `u:NAME:x`, removed afterwards), so it can run this very
Python and tfrun, as a second user of a box would run their own install.
"""

from __future__ import annotations

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
