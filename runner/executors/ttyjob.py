"""A `submit --tty` job: its command runs in a tmux session that `tfrun attach` opens, for scripts that stop
at `breakpoint()` or ask for input.

    python -S ttyjob.py SOCKET LOG -- COMMAND [ARG]...

The shim runs this in the job's place (it stays the job's parent and subreaper, so cancel, exit codes and
the process tree work as for any job). It starts a tmux server on SOCKET with one session whose pane runs
COMMAND with the pane as its terminal for input, its output going both to the pane and, through `tee`,
to the job's LOG, so `tfrun logs`, metrics and alerts see it as they see any job's output. It waits for
the command to end and exits with its exit status. Detaching from the session leaves the job running.

Standard library only: it runs under the daemon's Python with no site packages, by file path.
"""

from __future__ import annotations

import os
import shlex
import subprocess
import sys
import time

SESSION = "job"
POLL_S = 0.2


def main(argv: list[str]) -> int:
    socket, log = argv[0], argv[1]
    command = argv[3:] if argv[2:3] == ["--"] else argv[2:]
    status = f"{socket}.status"
    pane = f"{{ {shlex.join(command)}; echo $? > {shlex.quote(status)}; }} 2>&1 | tee -a {shlex.quote(log)}"
    tmux = ["tmux", "-S", socket]
    started = subprocess.run(
        [*tmux, "new-session", "-d", "-s", SESSION, "-x", "200", "-y", "50", "sh", "-c", pane],
        stdin=subprocess.DEVNULL,
    )
    if started.returncode != 0:
        print(f"tfrun: tmux could not start the job's session (exit code {started.returncode})", flush=True)
        return 127
    while _alive(tmux):
        time.sleep(POLL_S)
    try:
        with open(status) as f:
            return int(f.read().strip() or 1)
    except (OSError, ValueError):
        return 1  # the session ended without the command's status: killed with its tmux server


def _alive(tmux: list[str]) -> bool:
    return subprocess.run([*tmux, "has-session", "-t", SESSION], capture_output=True).returncode == 0


if __name__ == "__main__":
    os.umask(0o077)  # the session's socket: only its owner may attach
    sys.exit(main(sys.argv[1:]))
