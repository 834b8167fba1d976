"""Many boxes as one (client/pools/members.py): three boxes, each a real sshd with a daemon of its own (its TFRUN_HOME,
one fake GPU: TFRUN_GPUS=0), all three in one client config and pool `gpu` (tests/harness/fleetbox.py). Placement, the
merged `ps`, job addresses (HOST:ID) and what a dead box costs, through the real commands.

Placement, `ps --host all` and addresses run in both layouts of the fleet: "direct" (three sshd on 127.0.0.1)
and "jump" (issue 18: the client and box1's and box2's sshd on 127.0.0.1 of a network namespace of the test's
own; box3 in a namespace reachable only through a fourth sshd, the bastion's, as `hosts add --jump` names it).
In the jump layout, box3 is the box placement must pick and the one whose job is followed and cancelled by
address, so each goes through the bastion."""

from __future__ import annotations

import functools
import getpass
import json
import os
import socket
import subprocess
import time
from pathlib import Path

import pytest
from harness import Sshd, Tfrun, keepers_of, serving_daemon, wait_for
from harness.fleetbox import BOXES, Fleet, fleet_fixture, jobs_ended_fixture  # noqa: F401 - the fixtures fleet, jobs_ended

pytestmark = [pytest.mark.slow]

BOTH_LAYOUTS = pytest.mark.parametrize("fleet", ["direct", pytest.param("jump", marks=pytest.mark.root)], indirect=True)
DIRECT = pytest.mark.parametrize("fleet", ["direct"], indirect=True)  # one fleet, shared with BOTH_LAYOUTS'
JUMP = pytest.mark.parametrize("fleet", [pytest.param("jump", marks=pytest.mark.root)], indirect=True)


@pytest.mark.ssh
@BOTH_LAYOUTS
def test_placement_picks_the_box_with_a_free_gpu_then_the_one_freed(fleet: Fleet, jobs_ended: None) -> None:
    free = fleet.jumped or "box2"  # the jump layout: only the box behind the bastion has a free GPU
    for name in BOXES:
        if name != free:
            job = fleet.submit("--host", name, "--gpus", "1", fleet.script, f"busy-{name}").stdout.strip()
            fleet.running(f"{name}:{job}")
    placed = fleet.submit("--host", "gpu", "--gpus", "1", fleet.script, "first")
    assert f"tfrun: placed on {free} (1 of 1 GPUs free)" in placed.stderr
    first = placed.stdout.strip()
    assert first.startswith(f"{free}:")
    fleet.running(first)

    dry = fleet.client.run("submit", "--host", "gpu", "--gpus", "1", "--dry-run", fleet.script, "never")
    assert dry.returncode == 0, dry.stderr
    assert [line.split(":")[0] for line in dry.stdout.splitlines()[:3]] == list(BOXES)
    assert f"{free}: 0 of 1 GPUs free, 1 running, 0 queued" in dry.stdout
    assert "would place on box1: no box can start it now" in dry.stdout  # equal queues: by name
    too_many = fleet.client.run("submit", "--host", "gpu", "--gpus", "9", fleet.script, "never")
    assert too_many.returncode == 1, too_many.stderr  # every member answered: not the 125 of none reached
    assert too_many.stderr == "tfrun: error: no member of pool gpu that answered can run 9 GPUs\n"

    (fleet.gates / "first").touch()
    assert fleet.client.run("wait", first).returncode == 0
    placed = fleet.submit("--host", "gpu", "--gpus", "1", "--json", fleet.script, "second")
    record = json.loads(placed.stdout)
    assert (record["host"], record["address"]) == (free, f"{free}:{record['id']}")
    assert f"placed on {free}" in placed.stderr
    never = [job for name in BOXES for job in json.loads(fleet.client.ok("ps", "-a", "--json", "--host", name))
             if job["args"] == ["never"]]  # fmt: skip
    assert never == []  # the dry run submitted nothing


@pytest.mark.ssh
@DIRECT
def test_placement_counts_what_each_box_gives_a_job_without_gpus(fleet: Fleet, jobs_ended: None) -> None:
    """Every box's GPU busy; box2's daemon gives a job without --gpus no GPU (`config set default_gpus 0`): such a
    job is placed on box2, which starts it now, not queued on box1 (the first by name among equal queues) as
    when placement took every box with GPUs to give it one. A job that asks for one still queues."""
    for name in BOXES:
        job = fleet.submit("--host", name, "--gpus", "1", fleet.script, f"full-{name}").stdout.strip()
        fleet.running(f"{name}:{job}")
    fleet.client.ok("config", "set", "default_gpus", "0", "--host", "box2")
    try:
        dry = fleet.client.run("submit", "--host", "gpu", "--dry-run", fleet.script, "never")
        assert "would place on box2: it can start now: a job without --gpus gets no GPU there" in dry.stdout, dry.stdout
        placed = fleet.submit("--host", "gpu", fleet.script, "cpu-only")
        assert "tfrun: placed on box2 (0 of 1 GPUs free)" in placed.stderr
        address = placed.stdout.strip()
        fleet.running(address)
        assert json.loads(fleet.client.ok("status", "--json", address))["gpus"] == []
        placed = fleet.submit("--host", "gpu", "--gpus", "1", fleet.script, "needs-one")
        assert "tfrun: placed on box1 (0 of 1 GPUs free, 0 queued)" in placed.stderr
    finally:
        fleet.client.ok("config", "unset", "default_gpus", "--host", "box2")


@pytest.mark.ssh
@BOTH_LAYOUTS
def test_ps_over_all_hosts_lists_each_job_once_with_its_host(fleet: Fleet, jobs_ended: None) -> None:
    ids = {name: fleet.submit("--host", name, fleet.script, f"ps-{name}").stdout.strip() for name in BOXES}
    # A second name for box1's daemon (after box1 in name order): its jobs are still listed once, as box1's.
    fleet.add("box1-alias", fleet.destination("box1"), [], fleet.homes["box1"], fleet.sshd["box1"].user_key)
    try:
        listed = json.loads(fleet.client.ok("ps", "--host", "all", "--json"))
        mine = [(job["host"], job["address"]) for job in listed if job["args"][0].startswith("ps-")]
        assert sorted(mine) == [(name, f"{name}:{ids[name]}") for name in BOXES]
        quiet = fleet.client.ok("ps", "--host", "gpu", "-q").split()
        assert {f"{name}:{ids[name]}" for name in BOXES} <= set(quiet)
        tasks = fleet.submit("--host", "box2", "--gpus", "0", "--name", "sw", "--array", "x=1,2", fleet.script,
                             "ps-array").stdout.split()  # fmt: skip
        table = fleet.client.ok("ps", "--host", "gpu")
        assert table.splitlines()[0] == "jobs on pool gpu (3 of 3 hosts)"
        assert table.splitlines()[1].split()[:3] == ["HOST", "ID", "NAME"]
        rows = [line.split()[:3] for line in table.splitlines()]  # the array's row, then its tasks under it
        first = rows.index(["box2", f"box2:{tasks[0]}[0-1]", "sw"])
        assert rows[first + 1 : first + 3] == [["box2", f"box2:{task}", f"sw-{i}"] for i, task in enumerate(tasks)]
    finally:
        fleet.client.ok("hosts", "remove", "box1-alias")


@pytest.mark.ssh
@BOTH_LAYOUTS
def test_job_addresses_need_no_host(fleet: Fleet, jobs_ended: None) -> None:
    far = fleet.jumped or "box2"  # the jump layout: the box behind the bastion
    followed = fleet.submit("--host", far, fleet.script, "follow").stdout.strip()
    follow = fleet.popen("logs", "-f", f"{far}:{followed}", stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    status = fleet.client.ok("status", f"{far}:{followed}")
    assert status.splitlines()[0].split() == ["id", f"{far}:{followed}"]
    (fleet.gates / "follow").touch()
    out, err = follow.communicate(timeout=60)
    assert (follow.returncode, out) == (0, "job follow\n"), err

    cancelled = fleet.submit("--host", far, fleet.script, "cancel").stdout.strip()
    result = fleet.client.run("cancel", f"{far}:{cancelled}")
    assert result.returncode == 0, result.stderr
    assert json.loads(fleet.client.ok("status", "--json", f"{far}:{cancelled}"))["state"] == "cancelled"

    for standing in ("box1", "gpu"):  # a standing default, a host or a pool: an address overrules it
        fleet.client.env["TFRUN_HOST"] = standing
        try:
            shown = fleet.client.ok("status", f"{far}:{followed}").splitlines()[0].split()
            assert shown == ["id", f"{far}:{followed}"]
        finally:
            del fleet.client.env["TFRUN_HOST"]
    # --after with an address: the new job goes to that host, and runs once that job succeeded there.
    chained = fleet.submit("--after", f"{far}:{followed}", fleet.script, "chained").stdout.strip()
    assert chained.startswith(f"{far}:")
    (fleet.gates / "chained").touch()
    assert fleet.client.run("wait", chained).returncode == 0
    assert json.loads(fleet.client.ok("status", "--json", chained))["after"] == [int(followed)]
    unknown = fleet.client.run("status", "nosuch:3")  # no host nosuch: a job name, on the default host
    assert (unknown.returncode, unknown.stderr) == (3, "tfrun: error: no job 'nosuch:3' on box1\n")
    both = fleet.client.run("status", "--host", "box1", f"{far}:{followed}")
    assert both.returncode == 2
    assert both.stderr == f"tfrun: error: --host box1 but job {far}:{followed} is on {far}: give one or the other\n"
    pool = fleet.client.run("cancel", "--host", "gpu", "3")
    assert (pool.returncode, pool.stderr.count("\n")) == (2, 1)
    assert "gpu is a pool: cancel needs one host (--host NAME) or a job address HOST:ID" in pool.stderr
    pooled = fleet.client.run("cancel", "gpu:3")  # an address names one host, not a pool
    assert (pooled.returncode, pooled.stderr.count("\n")) == (2, 1)
    assert "gpu is a pool (members: box1, box2, box3): a job address names one host" in pooled.stderr


@pytest.mark.ssh
@DIRECT
def test_a_dead_box_is_skipped_within_the_timeout(fleet: Fleet, tmp_path: Path) -> None:
    """box4's sshd is stopped (a refused port); box5 takes the connection but never says a word (a box that
    hangs): each costs at most TFRUN_POOL_TIMEOUT and a line on stderr, and no keeper is left behind."""
    box4 = Sshd(tmp_path / "sshd-box4")
    box4.stop()
    silent = socket.socket()
    silent.bind(("127.0.0.1", 0))
    silent.listen()
    user = getpass.getuser()
    key = fleet.sshd["box1"].user_key
    box1 = fleet.sshd["box1"]
    fleet.add("box1", f"{user}@127.0.0.1:{box1.port}", ["gpu", "wide"], fleet.homes["box1"], key)
    fleet.add("box4", f"{user}@127.0.0.1:{box4.port}", ["wide"], tmp_path / "home-box4", key)
    fleet.add("box5", f"{user}@127.0.0.1:{silent.getsockname()[1]}", ["wide"], tmp_path / "home-box5", key)
    fleet.client.env["TFRUN_POOL_TIMEOUT"] = "2s"
    try:
        for argv in (["ps", "--host", "wide"], ["submit", "--host", "wide", "--dry-run", fleet.script, "x"]):
            started = time.monotonic()
            result = fleet.client.run(*argv, timeout=60)
            assert time.monotonic() - started < 30
            assert result.returncode == 0, result.stderr
            notes = result.stderr.splitlines()
            assert [line.split(":")[1].strip() for line in notes] == ["box4 skipped", "box5 skipped"], notes
            assert notes[1] == "tfrun: box5 skipped: no answer within 2s"
            assert "Traceback" not in result.stderr
        assert "would place on box1" in result.stdout
        pools = json.loads(fleet.client.ok("pools", "--json"))
        assert [row["reachable"] for row in pools["wide"]] == [True, False, False]
        assert not [pid for pid in keepers_of(fleet.client) if str(silent.getsockname()[1]).encode() in
                    Path(f"/proc/{pid}/cmdline").read_bytes()]  # fmt: skip
    finally:
        del fleet.client.env["TFRUN_POOL_TIMEOUT"]
        silent.close()
        for name in ("box4", "box5"):
            fleet.client.ok("hosts", "remove", name)


@pytest.mark.ssh
@JUMP
def test_the_box_behind_the_bastion_is_reached_only_through_it(fleet: Fleet) -> None:
    """Each daemon runs in its box's namespace (started through SSH): box1's and box2's in the client's, box3's
    in one that the client cannot reach: without the jump, a connection to box3 fails at once."""
    for name in BOXES:
        daemon = wait_for(functools.partial(serving_daemon, fleet.homes[name]), what=f"{name}'s daemon")
        assert os.readlink(f"/proc/{daemon}/ns/net") == f"net:[{fleet.namespaces[name].inode}]", name
    box3 = fleet.jumped
    assert box3 is not None
    hosts = json.loads(fleet.client.ok("hosts", "list", "--json"))["hosts"]
    assert [hosts[name].get("jump") for name in BOXES] == [None, None, fleet.jump]
    fleet.add("box3-direct", fleet.destination(box3), [], fleet.homes[box3], fleet.sshd[box3].user_key)
    try:
        started = time.monotonic()
        direct = fleet.client.run("ps", "--host", "box3-direct", timeout=60)
        assert time.monotonic() - started < 10, "no route: refused at once, not after a timeout"
        assert direct.returncode == 125, direct.stderr
        assert f"cannot connect to {fleet.destination(box3)}: Network is unreachable" in direct.stderr
    finally:
        fleet.client.ok("hosts", "remove", "box3-direct")


@pytest.mark.ssh
@JUMP
def test_a_stopped_bastion_costs_box3_one_note_within_the_timeout(fleet: Fleet, jobs_ended: None) -> None:
    """The bastion's sshd stopped, with the connections through it (as when the jump host goes down): a pool
    verb lists box1's and box2's jobs and names box3 once, within TFRUN_POOL_TIMEOUT; box3 is back with it."""
    assert fleet.bastion is not None and fleet.jumped is not None
    ids = {name: fleet.submit("--host", name, fleet.script, f"down-{name}").stdout.strip() for name in BOXES}
    fleet.bastion.stop(sessions=True)
    fleet.client.env["TFRUN_POOL_TIMEOUT"] = "2s"
    try:
        for argv in (["ps", "--host", "gpu", "--json"], ["submit", "--host", "gpu", "--dry-run", fleet.script, "x"]):
            started = time.monotonic()
            result = fleet.client.run(*argv, timeout=60)
            took = time.monotonic() - started
            assert result.returncode == 0, result.stderr
            assert took < 2 + 8, f"{argv[0]} took {took:.1f}s"  # the timeout, and a slow machine's start-up
            [note] = result.stderr.splitlines()
            assert note.startswith(f"tfrun: {fleet.jumped} skipped: cannot connect to jump host {fleet.jump}"), note
            assert "Traceback" not in result.stderr
            if argv[0] == "ps":
                listed = [job["address"] for job in json.loads(result.stdout) if job["args"][0].startswith("down-")]
                assert sorted(listed) == [f"{name}:{ids[name]}" for name in ("box1", "box2")]
        assert fleet.client.ok("status", f"box1:{ids['box1']}").splitlines()[0].split() == ["id", f"box1:{ids['box1']}"]
    finally:
        del fleet.client.env["TFRUN_POOL_TIMEOUT"]
        fleet.bastion.start()  # same port, keys and authorized key: the fleet as it was for the next test
    listed = json.loads(fleet.client.ok("ps", "--host", "all", "--json"))
    assert f"{fleet.jumped}:{ids[fleet.jumped]}" in [job["address"] for job in listed]


def test_pool_and_host_names_are_checked_when_added(tmp_path: Path) -> None:
    client = Tfrun(tmp_path / "state")
    client.ok("hosts", "add", "box1", "alice@gpu1", "--pool", "gpu", "--pool", "fast")
    listed = client.ok("hosts", "list")
    assert listed.split() == ["*", "box1", "alice@gpu1", "tfrund=tfrund", "pools=gpu,fast"]
    assert json.loads(client.ok("hosts", "list", "--json"))["hosts"]["box1"]["pools"] == ["gpu", "fast"]
    refused = {
        ("box2", "--pool", "box1"): "'box1' names a host; a pool needs a name of its own",
        ("gpu",): "'gpu' names a pool already; a host needs a name of its own",
        ("all",): "'all' cannot name a host",
        ("box2", "--pool", "local"): "'local' cannot name a pool",
        ("box2", "--pool", "a:b"): "'a:b' cannot name a pool",
    }
    for args, message in refused.items():
        result = client.run("hosts", "add", args[0], "alice@gpu2", *args[1:])
        assert (result.returncode, result.stderr) == (2, f"tfrun: error: {message}\n")
    assert "box2" not in client.ok("hosts", "list")
