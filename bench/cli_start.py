#!/usr/bin/env python3
"""How fast the CLI answers the verbs users type all day, side by side with `python3 -c pass`. Run by hand.

    .venv/bin/python -m bench.cli_start [--runs 20]

Measures, in one run on one machine (the SSH rows need openssh-server and root for the test sshd):
  - `python3 -c pass` with the same interpreter: the floor any Python CLI pays;
  - `tfrun --help`, and beside it the `--help` of a click CLI that does nothing: what click alone costs;
  - `tfrun ps` and `tfrun status J` against the local daemon (started once before, as any first use does);
  - `tfrun ps --host box` over a loopback sshd, warm: through the connection keeper, which holds the SSH
    connection between commands (like OpenSSH's ControlPersist), against `ssh box true` on a fresh connection.
Prints a Markdown table of medians (p50) and p90, and each as a multiple of the floor (or of ssh's time).

Python runs as an installed tfrun runs: from compiled bytecode (pip compiles on install), so the source is
compiled once here and PYTHONDONTWRITEBYTECODE is dropped from the commands' environment. It times the tfrun
of the interpreter it runs with: `VENV/bin/python -m bench.cli_start` (from the repository) times the tfrun
installed in VENV (from the wheel: no editable-install hook slowing the floor down).
"""

from __future__ import annotations

import argparse
import compileall
import os
import sys
import tempfile
from pathlib import Path

from bench.timing import stats, timed
from tests.harness import TFRUN, Sshd, Tfrun, remote_client

# The least a click CLI does: a group and one command, asked for its --help.
CLICK_ALONE = '''
import click

@click.group()
def cli():
    """A click CLI that does nothing."""

@cli.command()
def ps():
    """List nothing."""

cli()
'''


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=20)
    parser.add_argument("--no-ssh", action="store_true", help="Skip the rows over SSH (no sshd needed).")
    args = parser.parse_args()
    os.environ.pop("PYTHONDONTWRITEBYTECODE", None)
    repo = Path(__file__).resolve().parent.parent
    for folder in ("tfrun", "client", "runner"):
        compileall.compile_dir(repo / folder, quiet=1)
    work = Path(tempfile.mkdtemp(prefix="tfrun-bench-"))
    local = Tfrun(work / "home")
    project = work / "project"
    project.mkdir()
    (project / "job.py").write_text("print('done')\n")
    job = str(local.submit(str(project / "job.py")))  # starts the daemon; `status` then has a job to show
    local.ok("wait", job)
    (work / "click_alone.py").write_text(CLICK_ALONE)
    commands = {
        "tfrun --help": [*TFRUN, "--help"],
        "click alone: --help of a CLI that does nothing": [sys.executable, str(work / "click_alone.py"), "--help"],
        "tfrun ps (local)": [*TFRUN, "ps"],
        "tfrun status J": [*TFRUN, "status", job],
    }
    floor: list[float] = []
    samples: dict[str, list[float]] = {what: [] for what in commands}
    for _ in range(args.runs):  # each round times the floor too: a machine whose load changes skews both alike
        floor.append(timed([sys.executable, "-c", "pass"], local.env))
        for what, command in commands.items():
            samples[what].append(timed(command, local.env))
    rows = [(what, samples[what], "python3 -c pass", floor) for what in commands]
    local.cleanup()
    if not args.no_ssh:
        sshd = Sshd(work / "sshd")
        try:
            remote = remote_client(Tfrun(work / "remote"), sshd)
            remote.ok("ps")  # the first use: the daemon starts, the keeper connects
            ssh = sshd.ssh_command(remote.client_home / ".ssh" / "known_hosts")
            warm = [timed([*TFRUN, "ps"], remote.env) for _ in range(args.runs)]
            fresh = [timed([*ssh, "true"], remote.env) for _ in range(args.runs)]
            rows.append(("tfrun ps --host box (warm keeper)", warm, "ssh box true", fresh))
            remote.cleanup()
        finally:
            sshd.stop()

    print(f"\n{args.runs} runs each, {os.cpu_count()} CPUs; seconds, p50 (p90)\n")
    print("| what | p50 (p90) | baseline | ratio (p50) |")
    print("| --- | --- | --- | --- |")
    for what, ours, name, theirs in rows:
        (o50, o90), (t50, t90) = stats(ours), stats(theirs)
        print(f"| {what} | {o50:.3f} ({o90:.3f}) | {name}: {t50:.3f} ({t90:.3f}) | {o50 / t50:.1f}x |")


if __name__ == "__main__":
    main()
