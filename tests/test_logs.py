"""`tfrun logs` with filters: terminal lines, grep's options, hostile output and patterns, on the box and resumable
after a daemon's crash; a follower's exit code. Times (`--since`, `--timestamps`) and heavy output are in
test_logs_live.py, the two ways a filter reads (blocks, lines) in test_log_filters.py.
"""

from __future__ import annotations

import signal
import subprocess
from pathlib import Path

import pytest
from harness import TFRUN, Tfrun, local_and_ssh, wait_for, write_script

from tfrun.runner.logs.lines import MAX_LINE_BYTES, TerminalLines

pytestmark = [pytest.mark.slow]

# What Keras 2 (tf.keras 2.x) writes without a TTY for two epochs of 3 steps: the bar redrawn in place
# with \b, the epoch line finished by \n (reproduced from keras/utils/generic_utils.py Progbar).
KERAS2 = (
    b"Epoch 1/2\n"
    b"1/3 [=========>....................] - ETA: 0s - loss: 2.3026 - accuracy: 0.1000"
    + b"\b" * 81
    + b"\r2/3 [===================>..........] - ETA: 0s - loss: 2.1000 - accuracy: 0.2500"
    + b"\b" * 81
    + b"\r3/3 [==============================] - 0s 5ms/step - loss: 1.9000 - accuracy: 0.3333\n"
    b"Epoch 2/2\n"
    b"1/3 [=========>....................] - ETA: 0s - loss: 1.5000 - accuracy: 0.5000"
    + b"\b" * 81
    + b"\r3/3 [==============================] - 0s 4ms/step - loss: 1.2000 - accuracy: 0.6667\n"
)

# Keras 3 redraws with \r and colours the bar with ANSI sequences.
KERAS3 = (
    b"Epoch 1/1\n"
    b"\r\x1b[1m1/3\x1b[0m \x1b[32m\xe2\x94\x81\xe2\x94\x81\x1b[0m\x1b[37m\xe2\x94\x81\x1b[0m \x1b[1m0s\x1b[0m 5ms/step"
    b" - accuracy: 0.1000 - loss: 2.3026"
    b"\r\x1b[1m3/3\x1b[0m \x1b[32m\xe2\x94\x81\xe2\x94\x81\xe2\x94\x81\x1b[0m\x1b[37m\x1b[0m \x1b[1m0s\x1b[0m 4ms/step"
    b" - accuracy: 0.3333 - loss: 1.9000\n"
)


def job_printing(project: Path, data: bytes, name: str = "out.py", code: int = 0) -> Path:
    (project / "payload.bin").write_bytes(data)
    return write_script(
        project, name, f"import sys\nsys.stdout.buffer.write(open('payload.bin', 'rb').read())\nsys.exit({code})\n"
    )


def test_terminal_lines_render_redraws_like_a_terminal() -> None:
    lines = TerminalLines()
    assert lines.feed(b"abc\rX\n") == [b"Xbc"]
    assert lines.feed(b"12345\b\b\bab") == []
    assert lines.feed(b"\n") == [b"12ab5"]
    assert lines.feed(b"partial") == [] and lines.pending() == b"partial"
    finished = TerminalLines().feed(KERAS2)
    assert finished[1].decode().endswith("loss: 1.9000 - accuracy: 0.3333") and finished[1].startswith(b"3/3")
    assert len(finished) == 4


def test_a_huge_line_keeps_its_start_and_says_what_was_cut() -> None:
    lines = TerminalLines()
    for _ in range(30):
        assert lines.feed(b"x" * (1 << 20)) == []
    (line,) = lines.feed(b"\n")
    assert line.startswith(b"x" * MAX_LINE_BYTES)
    assert line.endswith(f"[tfrun: line cut here, {29 << 20} more bytes in the log]".encode())


@local_and_ssh
def test_grep_loss_on_keras_output_gives_each_epoch_in_its_final_state(tf: Tfrun, project: Path) -> None:
    job = tf.submit(str(job_printing(project, KERAS2 + KERAS3)))
    tf.ok("wait", str(job))
    result = tf.run("logs", str(job), "--grep", "loss")
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines() == [
        "3/3 [==============================] - 0s 5ms/step - loss: 1.9000 - accuracy: 0.3333",
        "3/3 [==============================] - 0s 4ms/step - loss: 1.2000 - accuracy: 0.6667",
        "\x1b[1m3/3\x1b[0m \x1b[32m━━━\x1b[0m\x1b[37m\x1b[0m \x1b[1m0s\x1b[0m 4ms/step"
        " - accuracy: 0.3333 - loss: 1.9000",
    ]
    # ANSI codes are not matched against: "3/3 " is there although the bytes are "3/3\x1b[0m ".
    assert len(tf.run("logs", str(job), "-e", "^3/3 ").stdout.splitlines()) == 3


@local_and_ssh
def test_grep_options_combine_as_in_grep(tf: Tfrun, project: Path) -> None:
    text = b"step 1 loss=0.5\nSTEP 2 LOSS=0.4\nevaluating\nnan detected (a.b)\nacc 0.9\n"
    job = tf.submit(str(job_printing(project, text)))
    tf.ok("wait", str(job))

    def lines(*args: str) -> list[str]:
        result = tf.run("logs", str(job), *args)
        assert result.returncode == 0, result.stderr
        return result.stdout.splitlines()

    assert lines("-e", "loss|acc") == ["step 1 loss=0.5", "acc 0.9"]
    assert lines("-i", "-e", "loss") == ["step 1 loss=0.5", "STEP 2 LOSS=0.4"]
    assert lines("-e", "nan", "--grep", "eval") == ["evaluating", "nan detected (a.b)"]
    assert lines("-v", "-i", "-e", "loss") == ["evaluating", "nan detected (a.b)", "acc 0.9"]
    assert lines("-F", "-e", "(a.b)") == ["nan detected (a.b)"]
    assert lines("-e", "a.b") == ["nan detected (a.b)"]
    assert lines("--tail", "2") == ["nan detected (a.b)", "acc 0.9"]
    assert lines("--tail", "1", "-i", "-e", "loss") == ["STEP 2 LOSS=0.4"]


@local_and_ssh
def test_invalid_utf8_is_shown_escaped_never_dropped(tf: Tfrun, project: Path) -> None:
    job = tf.submit(str(job_printing(project, b"loss \xff\xfe ok\nlast line without newline loss \xc3")))
    tf.ok("wait", str(job))
    result = tf.run("logs", str(job), "-e", "loss")
    assert result.stdout == "loss \\xff\\xfe ok\nlast line without newline loss \\xc3\n"
    assert tf.log(job) == b"loss \xff\xfe ok\nlast line without newline loss \xc3", "unfiltered: bytes as written"


def test_a_job_of_one_task_has_task_0_only(tf: Tfrun, project: Path) -> None:
    """`--task 0` is the job's log (multi-node jobs: tests/test_slurm_multinode.py); another task is one line."""
    job = tf.submit(str(job_printing(project, b"only line\n")))
    tf.ok("wait", str(job))
    assert tf.ok("logs", "--task", "0", "-t", str(job)).endswith("Z only line\n")
    result = tf.run("logs", "--task", "1", str(job))
    assert result.returncode != 0 and result.stdout == ""
    assert result.stderr.strip().splitlines() == [f"tfrun: error: job {job} has task 0 only; no task 1"]


def test_an_invalid_pattern_is_refused_before_anything_runs(tf: Tfrun, project: Path) -> None:
    job = tf.submit(str(job_printing(project, b"x\n")))
    result = tf.run("logs", "-f", str(job), "-e", "loss(")
    assert result.returncode == 2
    assert result.stderr.strip().splitlines() == ["tfrun: error: invalid pattern 'loss(': missing ): loss("]
    assert result.stdout == ""
    assert tf.run("logs", str(job), "-v").returncode == 2, "-v alone is a usage error"


def test_a_pathological_pattern_does_not_stall_the_daemon(tf: Tfrun, project: Path) -> None:
    job = tf.submit(str(job_printing(project, (b"a" * 5000 + b"b\n") * 200)))
    tf.ok("wait", str(job))
    # With a backtracking engine this search would outlast the test's timeout by ages; with RE2 it ends,
    # and the daemon answers another client meanwhile.
    slow = subprocess.Popen([*TFRUN, "logs", str(job), "-e", "(a+)+$"], env=tf.env, stdout=-1, stderr=-1)
    assert tf.run("ps", "-a").returncode == 0
    out, _ = slow.communicate(timeout=120)
    assert slow.returncode == 0 and out == b""


def test_a_huge_line_is_delivered_cut_and_the_file_keeps_it_whole(tf: Tfrun, project: Path) -> None:
    write_script(
        project,
        "big.py",
        "import sys\nsys.stdout.write('loss ' + 'x' * (20 << 20) + '\\n')\nprint('loss done')\n",
    )
    job = tf.submit(str(project / "big.py"))
    result = tf.run("logs", "-f", str(job), "-e", "loss")
    assert result.returncode == 0
    first, second = result.stdout.splitlines()
    assert first.startswith("loss xxx") and first.endswith("more bytes in the log]")
    assert len(first) < MAX_LINE_BYTES + 100 and second == "loss done"
    assert (tf.job_dir(job) / "output.log").stat().st_size == 5 + (20 << 20) + 1 + 10


@local_and_ssh
def test_a_filtered_follower_resumes_after_a_daemon_crash_without_gap_or_duplicate(
    tf: Tfrun, project: Path, gate: Path
) -> None:
    write_script(
        project,
        "steps.py",
        "import os, time\n"
        "i = 0\n"
        f"while not os.path.exists({str(gate)!r}) or i < 2000:\n"
        "    print(f'step {i} loss={1 / (i + 1):.4f}' if i % 2 == 0 else f'noise {i}', flush=True)\n"
        "    i += 1\n"
        "    time.sleep(0.001)\n"
        "raise SystemExit(7)\n",
    )
    job = tf.submit(str(project / "steps.py"))
    follower = subprocess.Popen([*TFRUN, "logs", "-f", str(job), "--grep", "loss"], env=tf.env, stdout=-1, stderr=-1)
    wait_for(lambda: tf.log(job).count(b"\n") > 400, what="output")
    tf.kill_daemon()
    gate.touch()
    out, err = follower.communicate(timeout=120)
    assert follower.returncode == 7, err
    steps = [int(line.split()[1]) for line in out.decode().splitlines()]
    assert steps == list(range(0, steps[-1] + 1, 2)) and steps[-1] >= 1998
    assert all("noise" not in line for line in out.decode().splitlines())


@pytest.mark.parametrize("context", [["-A", "1"], ["-B", "2"], ["-C", "1"], ["-A", "2", "-B", "1"], ["-v", "-A", "1"]])
def test_context_lines_are_what_grep_prints(tf: Tfrun, project: Path, tmp_path: Path, context: list[str]) -> None:
    """The same log through `tfrun logs` and through GNU grep -E, with the same options: the same output."""
    text = "".join(f"step {i} loss={i}\n" if i % 7 in (0, 1) or i == 30 else f"noise {i}\n" for i in range(40))
    job = tf.submit(str(job_printing(project, text.encode())))
    tf.ok("wait", str(job))
    ours = tf.run("logs", str(job), "-e", "loss", *context)
    assert ours.returncode == 0, ours.stderr
    (tmp_path / "log.txt").write_text(text)
    theirs = subprocess.run(["grep", "-E", "loss", *context, str(tmp_path / "log.txt")], capture_output=True, text=True)
    assert ours.stdout == theirs.stdout


@local_and_ssh
def test_follow_exits_with_the_job_code_or_128_plus_its_signal(tf: Tfrun, project: Path) -> None:
    write_script(project, "seven.py", "print('loss 1')\nraise SystemExit(7)\n")
    write_script(project, "term.py", "import os\nprint('loss 2', flush=True)\nos.kill(os.getpid(), 15)\n")
    for script, code in (("seven.py", 7), ("term.py", 128 + signal.SIGTERM)):
        job = tf.submit(str(project / script))
        for options in ([], ["--grep", "loss"], ["-t"]):
            followed = tf.run("logs", "-f", str(job), *options)
            assert followed.returncode == code, (script, options, followed.stderr)
            assert "loss" in followed.stdout
