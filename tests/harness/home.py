"""A tfrun of the test's own: `Tfrun`, a daemon's home and a client's home in temporary folders, driven
through the real commands (`TFRUN`, `TFRUND`), and the job scripts tests write."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any, Optional

from .processes import alive, processes_of, wait_for

BIN = Path(sys.executable).parent
TFRUN = [str(BIN / "tfrun")] if (BIN / "tfrun").exists() else [sys.executable, "-m", "tfrun.client"]
TFRUND = [str(BIN / "tfrund")] if (BIN / "tfrund").exists() else [sys.executable, "-m", "tfrun.runner"]


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


def keepers_of(tf: Tfrun) -> list[int]:
    """Pids of the connection keepers that the client of `tf` started."""
    found = []
    for pid in processes_of(tf.home):
        try:
            if b"tfrun.client.link.keeper" in Path(f"/proc/{pid}/cmdline").read_bytes():
                found.append(pid)
        except OSError:
            continue
    return found


def write_script(folder: Path, name: str, text: str, executable: bool = False) -> Path:
    path = folder / name
    path.write_text(text)
    if executable:
        path.chmod(0o755)
    return path


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
