"""What each verb imports: users type `tfrun ps` all day, so a verb loads only what it needs (bench/cli_start.py
measures the time). Read from `python -X importtime`, which lists every module a run imported."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from conftest import Tfrun, write_script

# Never in a local verb: the SSH stack (0.3-0.5 s to import), the daemon's own code and its dependencies, and
# the job side's frameworks.
NEVER_LOCAL = {"asyncssh", "cryptography", "tfrun.runner", "apprise", "watchdog", "sqlite3", "tensorflow", "numpy"}


def imported(tf: Tfrun, *argv: str) -> set[str]:
    """The top-level and `tfrun.*` modules a run of `tfrun ARGV` imported."""
    run = subprocess.run(
        [sys.executable, "-X", "importtime", "-m", "tfrun.client", *argv],
        env=tf.env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert run.returncode == 0, run.stderr[-2000:]
    names = set()
    for line in run.stderr.splitlines():
        if line.startswith("import time:") and "|" in line:
            name = line.rsplit("|", 1)[1].strip()
            names.add(name if name.startswith("tfrun.") else name.split(".")[0])
            if name.startswith("tfrun.runner"):
                names.add("tfrun.runner")
    return names


@pytest.mark.parametrize("argv", [["--help"], ["ps"], ["ps", "-a", "--json"], ["status"], ["logs"], ["metrics"]])
def test_local_verbs_never_import_ssh_or_the_daemon(tf: Tfrun, project: Path, argv: list[str]) -> None:
    write_script(project, "job.py", "print('loss 0.5')\n")
    job = str(tf.submit(str(project / "job.py")))
    tf.ok("wait", job)
    full = [*argv, job] if argv in (["status"], ["logs"], ["metrics"]) else argv
    found = imported(tf, *full)
    assert "tfrun.client.cli" in found  # the run was read: the CLI itself is listed
    assert not found & NEVER_LOCAL, sorted(found & NEVER_LOCAL)


def test_help_draws_no_table(tf: Tfrun) -> None:
    """`tfrun --help` is click's text: rich, which tables and colour need, is not loaded for it."""
    assert "rich" not in imported(tf, "--help")
