"""Watching many boxes as one (issue 18): `top`, `alerts` and `notify-test` given `--host POOL`, the daemon's
`name` in its alerts, and Tab completion of job addresses, on three real sshd boxes (tests/harness/fleetbox.py) and
a fourth whose sshd is stopped, through the real commands."""

from __future__ import annotations

import getpass
import json
import os
import shlex
import signal
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from harness import TFRUN, Receiver, Sshd, Tfrun, wait_for, write_script
from harness.fleetbox import BOXES, Fleet, fleet_fixture, jobs_ended_fixture  # noqa: F401 - the fixtures fleet, jobs_ended
from test_views import _frame_with, _in_tmux, screen

pytestmark = [pytest.mark.ssh]


@pytest.fixture
def dead_member(fleet: Fleet, tmp_path: Path) -> Iterator[None]:
    """box4 joins pool gpu, its sshd stopped (a refused port); the fleet timeout is 2s while the test runs."""
    box4 = Sshd(tmp_path / "sshd-box4")
    box4.stop()
    fleet.add("box4", f"{getpass.getuser()}@127.0.0.1:{box4.port}", ["gpu"], tmp_path / "home-box4",
              fleet.sshd["box1"].user_key)  # fmt: skip
    fleet.client.env["TFRUN_POOL_TIMEOUT"] = "2s"
    yield
    del fleet.client.env["TFRUN_POOL_TIMEOUT"]
    fleet.client.ok("hosts", "remove", "box4")


def timed(fleet: Fleet, *argv: str) -> subprocess.CompletedProcess[str]:
    """`tfrun ARGV`, which must end well within the time a dead member may cost."""
    started = time.monotonic()
    result = fleet.client.run(*argv, timeout=60)
    assert time.monotonic() - started < 30, argv
    assert "Traceback" not in result.stderr
    return result


def test_top_over_a_pool_shows_every_members_jobs_and_marks_a_dead_one(
    fleet: Fleet, jobs_ended: None, dead_member: None
) -> None:
    long = ["--comment", "x" * 150, "--tag", "the-very-end"]  # in a pipe a row stays whole, whatever COLUMNS says
    ids = {name: fleet.submit("--host", name, fleet.script, f"top-{name}", *long).stdout.strip() for name in BOXES}
    for name in BOXES:
        fleet.running(f"{name}:{ids[name]}")
    fleet.client.env["COLUMNS"] = "40"
    try:
        result = timed(fleet, "top", "--host", "gpu", "--once")
    finally:
        del fleet.client.env["COLUMNS"]
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert lines[0].startswith("tfrun top — pool gpu")
    assert "3 of 4 hosts" in lines[0]
    assert lines[1].startswith("box4: unreachable (")
    header = next(line for line in lines if line.startswith("HOST"))
    assert header.split()[:4] == ["HOST", "ID", "NAME", "STATE"]
    rows = {line.split()[1]: line.split() for line in lines if line.startswith("box") and ":" in line.split()[1]}
    for name in BOXES:
        row = rows[f"{name}:{ids[name]}"]
        assert (row[0], row[3], row[-1]) == (name, "running", "the-very-end")
    gpus = [line.split() for line in lines if line.split()[:1] in ([name] for name in BOXES) and line.split()[-1]
            in {f"{name}:{ids[name]}" for name in BOXES}]  # fmt: skip
    assert sorted(row[0] for row in gpus) == list(BOXES)  # each box's GPU, held by its job, by address


def test_live_top_over_a_pool_keeps_a_silent_members_last_view_marked_stale(
    fleet: Fleet, jobs_ended: None, tmux: str, tmp_path: Path
) -> None:
    """box3's daemon is frozen (SIGSTOP) while top runs: its jobs stay on screen, marked stale, and the
    frames go on for box1 and box2; thawed, it is fresh again."""
    job = fleet.submit("--host", "box3", fleet.script, "live").stdout.strip()
    fleet.running(f"box3:{job}")
    exit_file = tmp_path / "exit"
    fleet.client.env["TFRUN_POOL_TIMEOUT"] = "1s"
    try:
        _in_tmux(fleet.client, tmux, "top --host gpu --interval 0.3", exit_file, width=160)
    finally:
        del fleet.client.env["TFRUN_POOL_TIMEOUT"]

    def shown(*parts: str) -> Any:
        """The first frame of top's that shows every one of `parts`."""
        return wait_for(lambda: _frame_with(screen(tmux), *parts), what=f"a frame with {parts}")

    shown(f"box3:{job}", "3 of 3 hosts", "q: quit")
    pid = json.loads(Tfrun(fleet.homes["box3"]).daemon("status", "--json").stdout)["pid"]
    os.kill(pid, signal.SIGSTOP)
    try:
        frozen = shown("box3: stale, as of", f"box3:{job}", "2 of 3 hosts")
        wait_for(lambda: screen(tmux) != frozen, what="a redraw while box3 is silent")
    finally:
        os.kill(pid, signal.SIGCONT)
    shown("3 of 3 hosts")
    subprocess.run(["tmux", "-L", tmux, "send-keys", "q"], check=True)
    assert wait_for(lambda: exit_file.exists() and exit_file.read_text().strip(), what="top to quit") == "0"


def test_a_boxs_name_names_it_in_its_alerts_and_alerts_merge_by_time(fleet: Fleet, tmp_path: Path) -> None:
    refused = fleet.client.run("config", "--host", "box2", "set", "name", "box two")
    assert refused.returncode == 2 and refused.stderr.count("\n") == 1, refused.stderr
    assert "cannot name the box" in refused.stderr
    changed = fleet.client.ok("config", "--host", "box2", "set", "name", "box2")
    assert "name: applies now" in changed
    shown = json.loads(fleet.client.ok("config", "--host", "box2", "--json"))
    assert (shown["values"]["name"], shown["sources"]["name"]) == ("box2", "config.toml")
    failing = str(write_script(tmp_path, "fails.py", "import sys\nprint('bad', flush=True)\nsys.exit(3)\n"))
    ended = {}
    for name in ("box1", "box2"):  # box1's first: the merged list is in time order
        ended[name] = fleet.submit("--host", name, failing).stdout.strip()
        assert fleet.client.run("wait", f"{name}:{ended[name]}").returncode == 3

    def mine() -> list[dict[str, Any]]:
        listed = json.loads(fleet.client.ok("alerts", "--host", "gpu", "--json"))
        return [a for a in listed if a["address"] in {f"{n}:{i}" for n, i in ended.items()}]

    alerts = wait_for(lambda: len(mine()) == 2 and mine(), what="both failed alerts")
    assert [(a["host"], a["address"], a["rule"]) for a in alerts] == [
        ("box1", f"box1:{ended['box1']}", "failed"), ("box2", f"box2:{ended['box2']}", "failed")]  # fmt: skip
    assert "on box2: " in alerts[1]["summary"] and "box2" in alerts[1]["body"]
    text = fleet.client.ok("alerts", "--host", "gpu").splitlines()
    lines = [line for line in text if f"box1:{ended['box1']} " in line or f"box2:{ended['box2']} " in line]
    assert len(lines) == 2 and f"box1:{ended['box1']}" in lines[0] and "failed" in lines[0]
    bare = fleet.client.run("alerts", "--host", "gpu", ended["box1"])
    assert bare.returncode == 2 and "give JOB as an address HOST:ID" in bare.stderr


def test_notify_test_over_a_pool_says_each_member_and_fails_for_a_dead_one(fleet: Fleet, receiver: Receiver,
                                                                          tmp_path: Path) -> None:  # fmt: skip
    for name in BOXES:
        fleet.client.ok("config", "--host", name, "set", "notify", receiver.url)
    fleet.client.ok("config", "--host", "box2", "set", "name", "box2")
    try:
        result = timed(fleet, "notify-test", "--host", "gpu")
        assert result.returncode == 0, result.stderr
        assert result.stdout.splitlines() == [f"{name}: sent to json://127.0.0.1:{receiver.port}/***"
                                              for name in BOXES]  # fmt: skip
        wait_for(lambda: len(receiver.posts) == 3, what="three test messages")
        assert any("test message from box2" in post.get("title", "") for post in receiver.posts)
        box4 = Sshd(tmp_path / "sshd-box4")
        box4.stop()
        fleet.add("box4", f"{getpass.getuser()}@127.0.0.1:{box4.port}", ["gpu"], tmp_path / "home-box4",
                  fleet.sshd["box1"].user_key)  # fmt: skip
        fleet.client.env["TFRUN_POOL_TIMEOUT"] = "2s"
        try:
            down = timed(fleet, "notify-test", "--host", "gpu")
            assert down.returncode == 1
            assert down.stdout.count("sent to") == 3
            assert down.stderr.startswith("tfrun: error: box4: unreachable (") and down.stderr.count("\n") == 1
            records = json.loads(timed(fleet, "notify-test", "--host", "gpu", "--json").stdout)
            assert [(r["host"], r["reachable"], r["ok"]) for r in records] == [
                ("box1", True, True), ("box2", True, True), ("box3", True, True), ("box4", False, False)]  # fmt: skip
        finally:
            del fleet.client.env["TFRUN_POOL_TIMEOUT"]
            fleet.client.ok("hosts", "remove", "box4")
    finally:
        for name in BOXES:
            fleet.client.ok("config", "--host", name, "unset", "notify")


def completions(fleet: Fleet, words: str) -> list[tuple[str, str]]:
    """What tfrun offers for the last word of `words`, asked the way click's bash script asks."""
    env = {**fleet.client.env, "_TFRUN_COMPLETE": "bash_complete", "COMP_WORDS": words,
           "COMP_CWORD": str(len(words.split(" ")) - 1)}  # fmt: skip
    result = subprocess.run(TFRUN, env=env, capture_output=True, text=True, timeout=30)
    assert result.returncode == 0 and result.stderr == "", result.stderr
    return [tuple(line.split(",", 1)) for line in result.stdout.splitlines() if line]  # type: ignore[misc]


def test_completion_offers_pools_and_a_hosts_job_addresses(fleet: Fleet, jobs_ended: None) -> None:
    job = fleet.submit("--host", "box2", fleet.script, "completed").stdout.strip()
    offered = completions(fleet, "tfrun logs box2:")
    assert offered and offered[0] == ("plain", f"box2:{job}")
    assert all(value.startswith("box2:") for _, value in offered)
    assert completions(fleet, f"tfrun logs box2:{job}") == [("plain", f"box2:{job}")]
    assert completions(fleet, "tfrun logs nosuch:") == []
    # In bash itself, which splits `box2:` into the words `box2` and `:` (a colon breaks words): the same jobs,
    # each answered as what follows the colon, the part of the word bash replaces.
    source = fleet.client.ok("completion", "bash")
    for line, words in (
        ("tfrun logs box2:", "tfrun logs box2 :"),
        (f"tfrun logs box2:{job}", f"tfrun logs box2 : {job}"),
    ):
        asked = (f"COMP_LINE={shlex.quote(line)}; COMP_POINT={len(line)}; COMP_WORDS=({words}); "
                 f"COMP_CWORD={len(words.split()) - 1}; _tfrun_completion {TFRUN[0]}; "
                 'echo "${COMPREPLY[@]}"')  # fmt: skip
        bash = subprocess.run(["bash", "-c", f"{source}\n{asked}"], env=fleet.client.env, capture_output=True,
                              text=True, timeout=60)  # fmt: skip
        assert bash.returncode == 0 and bash.stderr == "", bash.stderr
        assert job in bash.stdout.split() and all(word.isdigit() for word in bash.stdout.split()), bash.stdout
    assert [value for _, value in completions(fleet, "tfrun top --host ")] == ["all", *BOXES, "gpu", "local"]
    assert [value for _, value in completions(fleet, "tfrun cancel --host ")] == [*BOXES, "local"]
