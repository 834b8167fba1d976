"""`logs --tail N` takes any count, as GNU tail, docker and kubectl do: more than the log holds prints all of
it, and the daemon holds no more than it must (without a filter nothing: it reads the log from where its
last N lines begin; with one at most the lines that pass, within a byte cap)."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
from harness import Tfrun, write_script

from tfrun.runner.logs import lines, logstream


def naive_tail_start(data: bytes, n: int, floor: int) -> int:
    """Where the last `n` finished lines after `floor` begin, by reading forwards."""
    ends = [i + 1 for i in range(floor, len(data)) if data[i : i + 1] == b"\n"]
    return ends[-n - 1] if len(ends) > n else floor


@pytest.mark.parametrize(
    "data",
    [b"", b"a", b"a\n", b"\n\n\n", b"one\ntwo\nthree\n", b"one\ntwo\nthree", b"x\n" * 70_000 + b"partial"],
)
def test_the_tail_starts_where_the_last_lines_begin(
    tmp_path: Path, data: bytes, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(logstream, "LOG_CHUNK_BYTES", 1000)  # lines across many blocks read backwards
    log = tmp_path / "output.log"
    log.write_bytes(data)
    with open(log, "rb") as handle:
        for n in [0, 1, 2, 3, 999, 1000, 69_999, 70_000, 10**6, 2**63 - 1]:
            for floor in {0, min(len(data), 2), min(len(data), 4)}:
                if floor and data[floor - 1 : floor] != b"\n":
                    continue  # a request's offset is a line boundary
                found = asyncio.run(logstream._tail_start(handle, n, floor, len(data)))
                assert found == naive_tail_start(data, n, floor), (n, floor)


def test_a_filtered_tail_holds_at_most_its_byte_cap_and_says_what_it_left_out(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(lines, "FILTERED_TAIL_BYTES", 10 * (10 + lines._LINE_COST))
    tail = lines.Tail(2**63 - 1)
    for i in range(50):
        tail.add([b"%010d" % i, b"%010d" % (i + 1000)])  # ten bytes a line
    assert len(tail.lines) == 10
    assert tail.release() == [
        b"[tfrun: 90 earlier lines of the tail left out: it holds at most 0 MB]",
        *[b"%010d" % i for j in range(45, 50) for i in (j, j + 1000)],
    ]
    small = lines.Tail(3)
    small.add([b"a", b"b"])
    small.add([b"c", b"d", b"e", b"f"])
    small.add([])
    assert small.release() == [b"d", b"e", b"f"] and small.bytes == 3 * (1 + lines._LINE_COST)
    none = lines.Tail(0)
    none.add([b"a"])
    assert none.release() == []


def test_any_count_of_tail_lines_prints_what_there_is(tf: Tfrun, project: Path) -> None:
    write_script(
        project, "run.sh", "#!/bin/sh\nfor i in $(seq 300); do echo step $i; done\nprintf end\n", executable=True
    )
    job = tf.submit(str(project / "run.sh"))
    assert tf.run("wait", str(job)).returncode == 0
    every = [f"step {i}" for i in range(1, 301)] + ["end"]
    for count in ["0", "1", "300", "301", "1000001", str(2**63 - 1), "1" + "0" * 30]:
        n = min(int(count), 301)
        assert tf.ok("logs", str(job), "--tail", count).splitlines() == (every[-n - 1 : -1] if n else []) + ["end"]
    assert tf.ok("logs", str(job), "--tail", "1" + "0" * 30, "-e", "step 1").splitlines() == [
        line for line in every if line.startswith("step 1")
    ]


def vm_peak_mb(pid: int) -> float:
    """The most memory the process has held at once (VmHWM), in MB."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    raise AssertionError("no VmHWM")


def test_a_huge_tail_of_a_big_log_holds_none_of_it(tf: Tfrun, project: Path) -> None:
    """Two million lines, `--tail` of more: a deque of them took some 150 MB of the daemon's memory."""
    write_script(project, "many.py", "import sys\nsys.stdout.write('line\\n' * 2_000_000)\n")
    job = tf.submit(str(project / "many.py"))
    assert tf.run("wait", str(job)).returncode == 0
    pid = tf.daemon_pid()
    before = vm_peak_mb(pid)
    out = tf.ok("logs", str(job), "--tail", str(2**63 - 1))
    assert out.count("\n") == 2_000_000
    assert vm_peak_mb(pid) - before < 40


def test_a_filtered_tail_of_a_big_log_holds_at_most_its_cap(tf: Tfrun, project: Path) -> None:
    """Every line passes `-e line`: the tail holds at most FILTERED_TAIL_BYTES of them, and says how many it left
    out."""
    write_script(project, "many.py", "import sys\nsys.stdout.write('line\\n' * 2_000_000)\n")
    job = tf.submit(str(project / "many.py"))
    assert tf.run("wait", str(job)).returncode == 0
    pid = tf.daemon_pid()
    before = vm_peak_mb(pid)
    out = tf.ok("logs", str(job), "--tail", str(2**63 - 1), "-e", "line").splitlines()
    kept = lines.FILTERED_TAIL_BYTES // (len("line") + lines._LINE_COST)
    assert out[0] == f"[tfrun: {2_000_000 - kept} earlier lines of the tail left out: it holds at most 64 MB]"
    assert len(out) == kept + 1 and set(out[1:]) == {"line"}
    assert vm_peak_mb(pid) - before < (lines.FILTERED_TAIL_BYTES >> 20) + 60
