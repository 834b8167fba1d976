"""`tfrun logs` in time and under load: the index that places lines in time, `--since` and `--timestamps`, captured
Keras output followed live, a 100 MB line that leaves the daemon small, three followers of 20 MB/s that get
every byte.
"""

from __future__ import annotations

import datetime
import hashlib
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest
from harness import TFRUN, Tfrun, local_and_ssh, wait_for, write_script
from harness.paths import DATA

from tfrun.client.cli.timespec import Since, parse_since
from tfrun.duration import parse_duration
from tfrun.runner.logs.lines import MAX_LINE_BYTES, plain
from tfrun.runner.shim import logindex
from tfrun.runner.shim.logindex import LogIndex

pytestmark = [pytest.mark.slow]


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


@local_and_ssh
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


# Follows job argv[1] with --tail 2 at the protocol's level; prints each frame's type and data, as JSON lines.
_FRAMES = """
import asyncio, json, sys
from tfrun.client.library.asyncclient import AsyncClient
from tfrun.protocol.logs import LogEnd, ReadLog

async def main():
    channel = await AsyncClient().connect()
    request = ReadLog(job=sys.argv[1], follow=True, tail=2)
    await channel.send(request)
    while True:
        msg = await channel.reply_to(request)
        print(json.dumps([msg.TYPE, getattr(msg, "data", b"").decode()]), flush=True)
        if isinstance(msg, LogEnd):
            return

asyncio.run(main())
"""


def test_a_follower_s_tail_comes_as_lines_and_what_follows_as_bytes(tf: Tfrun, project: Path, gate: Path) -> None:
    """`logs -f -n 2`: the tail is lines; once it is out, nothing else reads lines, so what the job writes next
    is sent as read (as a follower that reconnected gets it: a line at a time through the terminal reader cost
    tfrund a third more), every byte once, a last line without newline too."""
    write_script(project, "later.py", "import os, time\n"
                 "print('\\n'.join(f'line {i}' for i in range(5)), flush=True)\n"
                 f"while not os.path.exists({str(gate)!r}):\n    time.sleep(0.01)\n"
                 "print('line 5\\nline 6', flush=True)\nprint('partial', end='', flush=True)\n")  # fmt: skip
    job = tf.submit(str(project / "later.py"))
    wait_for(lambda: tf.log(job).count(b"\n") == 5, what="the first lines")
    follower = subprocess.Popen(
        [sys.executable, "-c", _FRAMES, str(job)], env=tf.env, stdout=subprocess.PIPE, text=True
    )
    assert follower.stdout is not None
    first = json.loads(follower.stdout.readline())
    gate.touch()
    frames = [first, *(json.loads(line) for line in follower.stdout)]
    assert follower.wait(timeout=60) == 0
    assert first == ["log_lines", "line 3\nline 4\n"]
    assert "".join(data for _, data in frames) == "line 3\nline 4\nline 5\nline 6\npartial"
    assert {kind for kind, _ in frames[1:-1]} == {"log_chunk"} and frames[-1][0] == "log_end", frames


@local_and_ssh
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


@local_and_ssh
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
