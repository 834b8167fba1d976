"""`tfrun logs` with filters: terminal lines, grep's options, hostile output, on the box and resumable."""

from __future__ import annotations

import datetime
import hashlib
import os
import random
import signal
import subprocess
import tempfile
import time
from pathlib import Path

import pytest
from harness import TFRUN, Tfrun, wait_for, write_script

from tfrun.client.timespec import Since, parse_since
from tfrun.duration import parse_duration
from tfrun.runner.logs import logindex
from tfrun.runner.logs.lines import MAX_LINE_BYTES, BlockMatcher, LineFilter, Selector, TerminalLines, display, plain
from tfrun.runner.logs.logindex import LogIndex

pytestmark = [pytest.mark.slow]

both = pytest.mark.parametrize("tf", ["local", pytest.param("ssh", marks=pytest.mark.ssh)], indirect=True)

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


@both
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


@both
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


@both
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


@both
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


def test_the_index_places_lines_in_time() -> None:
    index_file = Path(tempfile.mkdtemp()) / "output.idx"
    fd = os.open(index_file, os.O_WRONLY | os.O_CREAT | os.O_APPEND)
    for offset, when in [(10, 100.0), (25, 100.1), (25, 100.2), (40, 105.0)]:
        logindex.append(fd, offset, when)
    index = LogIndex(index_file)
    assert [index.time_at(end) for end in (1, 10, 11, 25, 40, 41)] == [100.0, 100.0, 100.1, 100.1, 105.0, None]
    assert [index.offset_since(when) for when in (50.0, 100.0, 100.05, 104.0, 105.0, 200.0)] == [0, 0, 10, 25, 25, 40]
    logindex.append(fd, 50, 106.0)  # the shim appends while the daemon reads: picked up when needed
    assert index.time_at(41) == 106.0
    os.write(fd, b"\x01\x02\x03")  # a torn record, as a shim killed in the middle of a write would leave
    assert index.time_at(51) is None and index.time_at(50) == 106.0
    os.close(fd)


def test_since_accepts_durations_and_dates() -> None:
    assert [parse_duration(text) for text in ("90s", "10m", "1h30m", "2d", "500ms", "1.5h")] == [
        90.0, 600.0, 5400.0, 172800.0, 0.5, 5400.0,
    ]  # fmt: skip
    assert [parse_duration(text) for text in ("", "5", "m", "10 m", "1h-5m", "h1")] == [None] * 6
    assert parse_since("2026-11-30T08:00:00Z") == Since(at=1796025600.0)
    assert parse_since("2026-11-30T09:00:00+01:00") == Since(at=1796025600.0)
    assert parse_since("15m") == Since(ago=900.0)
    with pytest.raises(ValueError, match="neither a duration"):
        parse_since("yesterday")


@both
def test_since_and_timestamps_place_lines_in_time(tf: Tfrun, project: Path, gate: Path) -> None:
    write_script(
        project,
        "phases.py",
        "import os, time\n"
        "for i in range(3):\n"
        "    print(f'early {i} loss=1', flush=True)\n"
        f"while not os.path.exists({str(gate)!r}):\n"
        "    time.sleep(0.01)\n"
        "for i in range(3):\n"
        "    print(f'late {i} loss=2', flush=True)\n"
        "print('no newline', end='')\n",
    )
    job = tf.submit(str(project / "phases.py"))
    wait_for(lambda: tf.log(job).count(b"\n") == 3, what="the early lines")
    time.sleep(0.5)  # more than the index's 0.1 s between the two phases
    middle = time.time()
    time.sleep(0.5)
    gate.touch()
    tf.ok("wait", str(job))
    iso = datetime.datetime.fromtimestamp(middle, datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
    assert tf.ok("logs", str(job), "--since", iso).splitlines() == ["late 0 loss=2", "late 1 loss=2", "late 2 loss=2",
                                                                   "no newline"]  # fmt: skip
    assert tf.ok("logs", str(job), "--since", iso, "-e", "loss", "--tail", "1").splitlines() == ["late 2 loss=2"]
    assert tf.ok("logs", str(job), "--since", "1h").count("\n") == 7
    assert tf.ok("logs", str(job), "--since", "2030-01-01T00:00") == ""
    stamped = tf.ok("logs", str(job), "-t").splitlines()
    assert [line.split(" ", 1)[1] for line in stamped] == tf.ok("logs", str(job), "--since", "1d").splitlines()
    times = [
        datetime.datetime.strptime(line.split(" ", 1)[0], "%Y-%m-%dT%H:%M:%S.%fZ")
        .replace(tzinfo=datetime.timezone.utc)
        .timestamp()
        for line in stamped
    ]
    assert times == sorted(times)
    assert max(times[:3]) < middle < min(times[3:]), (times, middle)
    matched = tf.ok("logs", str(job), "-t", "-e", "^late 1")
    assert matched.split(" ", 1)[1] == "late 1 loss=2\n", "a pattern is matched against the line, not its stamp"
    followed = tf.run("logs", "-f", str(job), "-t", "--since", iso)
    assert followed.returncode == 0 and followed.stdout.splitlines() == stamped[3:]


DATA = Path(__file__).resolve().parent / "data"
# What a person sees of the captured runs (tests/data/keras_fit.py) once each line is finished.
KERAS2_LOSS_LINES = [
    "9/9 [==============================] - 2s 126ms/step - loss: 0.7408 - accuracy: 0.4028 - val_loss: 0.6803 - val_accuracy: 0.5833",  # noqa: E501
    "9/9 [==============================] - 1s 81ms/step - loss: 0.7290 - accuracy: 0.4306 - val_loss: 0.6806 - val_accuracy: 0.5833",  # noqa: E501
    "9/9 [==============================] - 1s 79ms/step - loss: 0.7206 - accuracy: 0.4583 - val_loss: 0.6809 - val_accuracy: 0.5417",  # noqa: E501
    "12/12 [==============================] - 0s 3ms/step - loss: 0.7080 - accuracy: 0.4479",
]
KERAS3_LOSS_LINES = [
    "9/9 ━━━━━━━━━━━━━━━━━━━━ 2s 111ms/step - accuracy: 0.4028 - loss: 0.7408 - val_accuracy: 0.5833 - val_loss: 0.6803",  # noqa: E501
    "9/9 ━━━━━━━━━━━━━━━━━━━━ 1s 80ms/step - accuracy: 0.4028 - loss: 0.7278 - val_accuracy: 0.5833 - val_loss: 0.6805",
    "9/9 ━━━━━━━━━━━━━━━━━━━━ 1s 84ms/step - accuracy: 0.4028 - loss: 0.7180 - val_accuracy: 0.5833 - val_loss: 0.6814",
    "12/12 ━━━━━━━━━━━━━━━━━━━━ 0s 13ms/step - accuracy: 0.4479 - loss: 0.7055",
]


@both
@pytest.mark.parametrize(
    ("capture", "expected"), [("keras2_fit.log", KERAS2_LOSS_LINES), ("keras3_fit.log", KERAS3_LOSS_LINES)]
)
def test_captured_keras_output_followed_live_gives_each_epoch_once(
    tf: Tfrun, project: Path, capture: str, expected: list[str]
) -> None:
    """Real model.fit output (Keras 2.15 and Keras 3), replayed in small pieces while a filtered follower reads."""
    (project / "capture.log").write_bytes((DATA / capture).read_bytes())
    write_script(
        project,
        "replay.py",
        "import sys, time\n"
        "data = open('capture.log', 'rb').read()\n"
        "for i in range(0, len(data), 97):\n"
        "    sys.stdout.buffer.write(data[i:i + 97])\n"
        "    sys.stdout.flush()\n"
        "    time.sleep(0.003)\n",
    )
    job = tf.submit(str(project / "replay.py"))
    followed = tf.run("logs", "-f", str(job), "-e", "loss")
    assert followed.returncode == 0, followed.stderr
    assert [plain(line) for line in followed.stdout.splitlines()] == expected
    assert tf.log(job) == (DATA / capture).read_bytes()
    assert [plain(line) for line in tf.ok("logs", str(job), "-e", "val_loss", "--tail", "1").splitlines()] == [
        expected[2]
    ]


def _memory_kib(pid: int, field: str) -> int:
    """VmRSS (now) or VmHWM (the peak so far) of a process, from /proc."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise AssertionError(f"no {field} for pid {pid}")


def test_following_a_100_mb_line_keeps_the_daemon_small(tf: Tfrun, project: Path, gate: Path, tmp_path: Path) -> None:
    write_script(
        project,
        "huge.py",
        "import os, sys, time\n"
        f"while not os.path.exists({str(gate)!r}):\n"
        "    time.sleep(0.01)\n"
        "sys.stdout.write('loss ')\n"
        "for _ in range(100):\n"
        "    sys.stdout.write('x' * (1 << 20))\n"
        "    sys.stdout.flush()\n"
        "print('\\nloss end')\n",
    )
    job = tf.submit(str(project / "huge.py"))
    pid = tf.daemon_pid()
    before = _memory_kib(pid, "VmRSS")
    with open(tmp_path / "raw", "wb") as raw:
        followers = [
            subprocess.Popen([*TFRUN, "logs", "-f", str(job), "-e", "loss"], env=tf.env, stdout=-1, stderr=-1),
            subprocess.Popen([*TFRUN, "logs", "-f", str(job)], env=tf.env, stdout=raw, stderr=-1),
        ]
        wait_for(lambda: tf.job(job)["state"] == "running", what="the job to run")
        gate.touch()
        filtered, _ = followers[0].communicate(timeout=300)
        followers[1].communicate(timeout=300)
    assert [follower.returncode for follower in followers] == [0, 0]
    first, second = filtered.decode().splitlines()
    cut = 5 + 100 * (1 << 20) - MAX_LINE_BYTES
    assert first.startswith("loss xxx") and first.endswith(f"{cut} more bytes in the log]")
    assert second == "loss end"
    assert (tmp_path / "raw").read_bytes() == (tf.job_dir(job) / "output.log").read_bytes()
    growth_mib = (_memory_kib(pid, "VmHWM") - before) / 1024
    assert growth_mib < 32, f"the daemon grew by {growth_mib:.1f} MiB while two clients followed a 100 MB line"


@both
def test_three_followers_of_a_job_writing_20_mb_per_second_get_every_byte(
    tf: Tfrun, project: Path, gate: Path, tmp_path: Path
) -> None:
    write_script(
        project,
        "firehose.py",
        "import os, sys, time\n"
        f"while not os.path.exists({str(gate)!r}):\n"
        "    time.sleep(0.01)\n"
        "start, n, written = time.monotonic(), 0, 0\n"
        "while written < 60_000_000:\n"  # 3 s at 20 MB/s
        "    due = int((time.monotonic() - start) * 20_000_000)\n"
        "    chunk = []\n"
        "    while written < due:\n"
        "        line = (f'step {n} loss={n % 97}' if n % 10 == 0 else f'noise {n}').ljust(99, '.') + '\\n'\n"
        "        chunk.append(line)\n"
        "        written += len(line)\n"
        "        n += 1\n"
        "    sys.stdout.write(''.join(chunk))\n"
        "    sys.stdout.flush()\n"
        "    time.sleep(0.005)\n",
    )
    job = tf.submit(str(project / "firehose.py"))
    outputs = [tmp_path / f"follower{i}" for i in range(3)]
    commands = [["logs", "-f", str(job)], ["logs", "-f", str(job)], ["logs", "-f", str(job), "--grep", "loss"]]
    followers = []
    for out, command in zip(outputs, commands):
        with open(out, "wb") as sink:
            followers.append(subprocess.Popen([*TFRUN, *command], env=tf.env, stdout=sink, stderr=-1))
    wait_for(lambda: tf.job(job)["state"] == "running", what="the job to run")
    gate.touch()
    for follower in followers:
        _, err = follower.communicate(timeout=300)
        assert follower.returncode == 0, err
    log = (tf.job_dir(job) / "output.log").read_bytes()
    assert len(log) >= 60_000_000
    digest = hashlib.sha256(log).hexdigest()
    assert [hashlib.sha256(out.read_bytes()).hexdigest() for out in outputs[:2]] == [digest, digest]
    wanted = b"".join(line for line in log.splitlines(keepends=True) if b"loss" in line)
    assert outputs[2].read_bytes() == wanted


# Words that trip case folding: the Kelvin sign folds to k, the long s to s; ß is not SS to RE2.
BLOCK_WORDS = ["step", "loss=1.5", "LOSS", "a.b", "axb", "Straße", "STRASSE", "\u212a", "k", "\u017f", "s", "\t", "ß"]
BLOCK_WORDS += ["", "|"]


@pytest.mark.parametrize(
    ("patterns", "ignore_case", "fixed"),
    [
        ((), False, False),
        (("loss",), False, False),
        (("loss|step",), False, False),
        (("LOSS", "axb"), True, False),
        (("a.b",), False, True),
        (("a.b",), False, False),
        (("^step", "ß$"), False, False),
        (("k",), True, False),
        (("ß",), True, False),
        (("x|",), False, False),
        (("[^z]*ß",), True, False),
        (("|",), False, True),
    ],
)
def test_the_block_path_finds_exactly_the_lines_the_line_path_finds(
    patterns: tuple[str, ...], ignore_case: bool, fixed: bool
) -> None:
    """The fast path over whole blocks must agree with the per-line path, Unicode case folding included."""
    rng = random.Random(len(patterns) * 7 + ignore_case * 3 + fixed)
    for ascii_only in (True, False):
        words = [w for w in BLOCK_WORDS if w.isascii() or not ascii_only]
        lines = [" ".join(rng.choice(words) for _ in range(rng.randint(0, 4))) for _ in range(3000)]
        block = ("\n".join(lines) + "\n").encode()
        line_filter = LineFilter(patterns, ignore_case=ignore_case, fixed=fixed)
        texts = [display(x) for x in TerminalLines().feed(block)]
        per_line = Selector(line_filter.compile(), invert=False).select(texts)
        fast = BlockMatcher(line_filter).lines(block)
        if fast is None:  # allowed only where the literal search would fold case differently from RE2
            assert ignore_case and not ascii_only
            continue
        assert fast == [text.encode() for text in per_line]


def test_the_block_path_leaves_terminal_effects_and_bad_utf8_to_the_line_path() -> None:
    matcher = BlockMatcher(LineFilter(("loss",)))
    for block in (b"loss 1\rloss 2\n", b"loss\b\bx\n", b"\x1b[1mloss\x1b[0m\n", b"loss \xff\n"):
        assert matcher.lines(block) is None
    assert matcher.lines(b"loss 1\nnoise\nloss 2\n") == [b"loss 1", b"loss 2"]


@both
def test_follow_exits_with_the_job_code_or_128_plus_its_signal(tf: Tfrun, project: Path) -> None:
    write_script(project, "seven.py", "print('loss 1')\nraise SystemExit(7)\n")
    write_script(project, "term.py", "import os\nprint('loss 2', flush=True)\nos.kill(os.getpid(), 15)\n")
    for script, code in (("seven.py", 7), ("term.py", 128 + signal.SIGTERM)):
        job = tf.submit(str(project / script))
        for options in ([], ["--grep", "loss"], ["-t"]):
            followed = tf.run("logs", "-f", str(job), *options)
            assert followed.returncode == code, (script, options, followed.stderr)
            assert "loss" in followed.stdout


def test_small_reads_matched_on_the_loop_send_what_the_filter_threads_send() -> None:
    """A follower's small reads are matched on the event loop (no thread hop), big ones or costly filters in
    the filter threads: both ways must send the same frames, for partial lines and terminal effects too."""
    import asyncio

    from tfrun.protocol.logs import ReadLog
    from tfrun.runner.logs import logstream

    reads = [b"step 1 loss=0.5\nno", b"ise 1\nstep 2 lo", b"ss=0.4\r", b"\x1b[2Kstep 3 loss=0.3\n", b"x" * 70 + b"\n"]

    async def frames(inline: bool) -> list[tuple[int, int, bytes]]:
        req = ReadLog(job="1", patterns=["loss"], follow=True)
        sent: list[tuple[int, int, bytes]] = []

        async def send(msg: object) -> None:
            sent.append((msg.offset, msg.next_offset, msg.data))  # type: ignore[attr-defined]

        reader = logstream._line_reader(req, await logstream.selection(req), send, Path("output.log"), None, None)
        assert reader is not None
        assert reader.inline_bytes >= max(map(len, reads))  # cheap pattern, small reads: on the loop
        if not inline:
            reader.inline_bytes = 0
        offset = 0
        for data in reads:
            await reader.feed(data, offset)
            offset += len(data)
        return sent

    on_loop, in_threads = asyncio.run(frames(True)), asyncio.run(frames(False))
    assert on_loop == in_threads
    assert on_loop == [(0, 16, b"step 1 loss=0.5\n"), (16, 60, b"\x1b[2Kstep 3 loss=0.3\n")]


def test_costly_filters_are_not_matched_on_the_loop() -> None:
    """A thousand long patterns can cost a third of a second per chunk: even a short read of theirs goes to the
    filter threads, so no client's filter holds up the daemon's event loop."""
    import asyncio

    from tfrun.protocol.logs import ReadLog
    from tfrun.runner.logs import logstream

    async def inline_bytes(patterns: list[str]) -> int:
        req = ReadLog(job="1", patterns=patterns, follow=True)

        async def send(msg: object) -> None:
            pass

        reader = logstream._line_reader(req, await logstream.selection(req), send, Path("output.log"), None, None)
        assert reader is not None
        return reader.inline_bytes

    assert asyncio.run(inline_bytes([f"pattern{i:04d}-" + "x" * 100 for i in range(1000)])) < 16
    assert asyncio.run(inline_bytes(["loss"])) >= 4096
