"""`tfrun top` and `tfrun attach`, driven in a real terminal (tmux: send-keys, capture-pane), locally and
over SSH."""

from __future__ import annotations

import shlex
import subprocess
import sys
from pathlib import Path

from harness import TFRUN, Tfrun, local_and_ssh, wait_for, write_script

LOSSES = """\
import time
for i in range(1, 10000):
    print(f"step {i} loss={1 / i:.5f}", flush=True)
    time.sleep(0.02)
"""


def screen(server: str) -> str:
    return subprocess.run(["tmux", "-L", server, "capture-pane", "-p"], capture_output=True, text=True).stdout


@local_and_ssh
def test_top_shows_the_running_jobs_and_quits_on_q(tf: Tfrun, project: Path, tmux: str, tmp_path: Path) -> None:
    tf.home.mkdir(mode=0o700, parents=True)
    (tf.home / "config.toml").write_text('gpus = ["0", "1"]\n')  # the box's daemon reads it, also over SSH
    job = tf.submit("--name", "bert", "--gpus", "1", str(write_script(project, "train.py", LOSSES)))
    waiting = tf.submit("--gpus", "2", "--python", sys.executable, str(project / "train.py"))
    wait_for(lambda: b"step 30 " in tf.log(job), what="some losses")
    exit_file = tmp_path / "exit"
    _in_tmux(tf, tmux, "top --interval 0.3", exit_file, width=160)
    try:
        shown = wait_for(lambda: _frame_with(screen(tmux), "bert", "q: quit", "waiting for"), what="a frame")
    except AssertionError:
        raise AssertionError(screen(tmux)) from None
    jobs_part = shown.split("GPU  NAME")[0]  # the GPU table's rows start with a number too
    lines = {line.split()[0]: line for line in jobs_part.splitlines() if line.strip() and line.split()[0].isdigit()}
    assert "running" in lines[str(job)] and "bert" in lines[str(job)]
    assert "queued" in lines[str(waiting)] and "waiting for 2 GPU(s); 1 free" in lines[str(waiting)], shown
    assert any(char in lines[str(job)] for char in "▁▂▃▄▅▆▇█")  # the loss trend
    assert "GPU" in shown and "MEMORY" in shown
    first = shown
    wait_for(lambda: screen(tmux) != first, what="a redraw")  # the clock and runtimes move
    subprocess.run(["tmux", "-L", tmux, "send-keys", "q"], check=True)
    assert wait_for(lambda: exit_file.exists() and exit_file.read_text().strip(), what="top to quit") == "0"
    assert "q: quit" not in screen(tmux)  # the alternate screen is gone: the terminal is as it was
    tf.ok("cancel", str(job), str(waiting))


def _frame_with(text: str, *parts: str) -> str:
    return text if all(part in text for part in parts) else ""


def test_top_once_prints_one_frame(tf: Tfrun, project: Path) -> None:
    job = tf.submit(str(write_script(project, "train.py", LOSSES)))
    wait_for(lambda: b"step 30 " in tf.log(job), what="some losses")
    out = tf.ok("top", "--once")
    row = next(line.split() for line in out.splitlines() if line.split()[:1] == [str(job)])
    assert row[2] == "running" and row[-1] == "train.py" and "q: quit" not in out, out  # a printed frame takes no keys
    tf.ok("cancel", str(job))


def _in_tmux(tf: Tfrun, server: str, args: str, exit_file: Path, width: int = 120) -> None:
    """Run `tfrun ARGS` in a fresh tmux terminal, its exit code into `exit_file` once it ends."""
    env = " ".join(f"{k}={shlex.quote(v)}" for k, v in tf.env.items() if k.startswith(("TFRUN_", "HOME", "PATH")))
    # COLUMNS and LINES, which the test process may have, would fix the size rather than the terminal's.
    command = f"env -u COLUMNS -u LINES {env} {shlex.join(TFRUN)} {args}; echo $? > {exit_file}; sleep 30"
    subprocess.run(["tmux", "-L", server, "new-session", "-d", "-x", str(width), "-y", "30", command], check=True)


ASKS = "name = input('your name? ')\nprint(f'hello {name}')\n"


@local_and_ssh
def test_a_tty_job_waiting_at_input_is_answered_through_attach(
    tf: Tfrun, project: Path, tmux: str, tmp_path: Path
) -> None:
    job = tf.submit("--tty", str(write_script(project, "ask.py", ASKS)))
    wait_for(lambda: b"your name? " in tf.log(job), what="the prompt in the log")
    assert tf.job(job)["state"] == "running" and tf.job(job)["tty"] is True
    exit_file = tmp_path / "exit"
    _in_tmux(tf, tmux, f"attach {job}", exit_file)
    wait_for(lambda: "your name?" in screen(tmux), what="the prompt on the attached terminal")
    subprocess.run(["tmux", "-L", tmux, "send-keys", "world", "Enter"], check=True)
    assert tf.run("wait", str(job)).returncode == 0
    assert tf.log(job) == b"your name? hello world\n"
    assert wait_for(lambda: exit_file.exists() and exit_file.read_text().strip(), what="attach to end") == "0"


@local_and_ssh
def test_detaching_leaves_a_tty_job_running(tf: Tfrun, project: Path, tmux: str, tmp_path: Path) -> None:
    job = tf.submit("--tty", str(write_script(project, "ask.py", ASKS)))
    wait_for(lambda: b"your name? " in tf.log(job), what="the prompt")
    exit_file = tmp_path / "exit"
    _in_tmux(tf, tmux, f"attach {job}", exit_file)
    wait_for(lambda: "your name?" in screen(tmux), what="the prompt on the attached terminal")
    subprocess.run(["tmux", "-L", tmux, "send-keys", "C-b", "d"], check=True)  # tmux's own detach
    assert wait_for(lambda: exit_file.exists() and exit_file.read_text().strip(), what="attach to end") == "0"
    assert tf.job(job)["state"] == "running"
    tf.ok("cancel", "--grace", "1", str(job))
    assert tf.job(job)["state"] == "cancelled"


def test_attach_refuses_a_job_without_a_session(tf: Tfrun, project: Path) -> None:
    job = tf.submit(str(write_script(project, "plain.py", "print('done')\n")))
    result = tf.run("attach", str(job))
    assert result.returncode == 2 and "was not submitted with --tty" in result.stderr


def test_ps_on_a_narrow_terminal_cuts_long_rows_and_never_wraps_them(
    tf: Tfrun, project: Path, tmux: str, tmp_path: Path
) -> None:
    script = str(write_script(project, "argv.py", "print('hi')\n"))
    jobs = [tf.submit("--name", f"run-{i}", script, "--comment", "x" * 150, "--tag", "the-end") for i in range(3)]
    for job in jobs:
        tf.ok("wait", str(job))
    for server, args in ((tmux, "ps -a"), (f"{tmux}-plain", "--color never ps -a")):
        exit_file = tmp_path / f"exit-{server}"
        try:
            _in_tmux(tf, server, args, exit_file, width=60)
            wait_for(lambda: exit_file.exists() and exit_file.read_text().strip(), what="ps to end")  # noqa: B023
            shown = [line for line in screen(server).splitlines() if line.strip()]
            coloured = subprocess.run(["tmux", "-L", server, "capture-pane", "-p", "-e"], capture_output=True,
                                      text=True).stdout  # fmt: skip
        finally:
            if server != tmux:
                subprocess.run(["tmux", "-L", server, "kill-server"], capture_output=True)
        assert len(shown) == 2 + len(jobs) and shown[0] == "jobs on this machine", shown  # one line per row
        assert shown[1].split()[:3] == ["ID", "NAME", "STATE"]
        for job, row in zip(jobs, shown[2:]):
            assert row.split()[:3] == [str(job), f"run-{jobs.index(job)}", "succeeded"], row
            assert len(row) <= 60 and "the-end" not in row and row.endswith(("…", "...")), row
        assert ("\x1b[" in coloured) == (server == tmux), coloured  # colour on a terminal, unless --color never


def test_top_on_a_narrow_terminal_keeps_each_jobs_id_and_cuts_its_row(
    tf: Tfrun, project: Path, tmux: str, tmp_path: Path
) -> None:
    """At 70 columns, live and --once: each job's row starts with its id and its name (cut to 24 cells), and
    ends with … at the edge. The live view gave the columns what the command left, down to nothing: the ID
    column vanished below about 100 columns."""
    script = str(write_script(project, "train.py", LOSSES))
    jobs = [tf.submit("--name", f"run-{i}-{'n' * 40}", script, "--comment", "x" * 150) for i in range(2)]
    for job in jobs:
        wait_for(lambda: b"step 30 " in tf.log(job), what="some losses")  # noqa: B023
    for server, args in ((tmux, "top --interval 0.3"), (f"{tmux}-once", "top --once")):
        exit_file = tmp_path / f"exit-{server}"
        try:
            _in_tmux(tf, server, args, exit_file, width=70)
            shown = wait_for(lambda: _frame_with(screen(server), "run-1", "TREND"), what="a frame")  # noqa: B023
        finally:
            subprocess.run(["tmux", "-L", server, "kill-server"], capture_output=True)
        rows = [line for line in shown.splitlines() if line.startswith(tuple(str(job) for job in jobs))]
        assert [row.split()[:3] for row in rows] == [[str(job), f"run-{i}-{'n' * 17}…", "running"]
                                                     for i, job in enumerate(jobs)], shown  # fmt: skip
        assert all(len(row) <= 70 and row.endswith("…") for row in rows), shown
    tf.ok("cancel", *map(str, jobs))
