"""Many boxes as one (client/fleet.py): three boxes, each a real sshd on 127.0.0.1 with a daemon of its own
(its TFRUN_HOME, one fake GPU: TFRUN_GPUS=0), all three in one client config and pool `gpu`. Placement, the
merged `ps`, job addresses (HOST:ID) and what a dead box costs, through the real commands."""

from __future__ import annotations

import getpass
import json
import shlex
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from conftest import TFRUN, Sshd, Tfrun, keepers_of, wait_for, write_script

BOXES = ("box1", "box2", "box3")


@dataclass
class Fleet:
    client: Tfrun
    sshd: dict[str, Sshd]
    homes: dict[str, Path]
    script: str  # a job that prints its argument, then waits until gates/ARG exists
    gates: Path

    def add(self, name: str, destination: str, pools: list[str], home: Path, key: Path) -> None:
        """Write host `name` into the client's config, as `hosts add` would, through it."""
        self.client.ok("hosts", "add", name, destination, "--identity-file", str(key),
                       "--tfrund", shlex.join([sys.executable, "-m", "tfrun.runner"]),
                       "--env", f"TFRUN_HOME={home}", "--env", "TFRUN_GPUS=0",
                       *(arg for pool in pools for arg in ("--pool", pool)))  # fmt: skip

    def submit(self, *args: str) -> subprocess.CompletedProcess[str]:
        result = self.client.run("submit", *args)
        assert result.returncode == 0, result.stderr
        return result

    def running(self, address: str) -> None:
        wait_for(lambda: json.loads(self.client.ok("status", "--json", address))["state"] == "running",
                 what=f"{address} to run")  # fmt: skip


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Fleet]:
    if not Path("/usr/sbin/sshd").exists():
        pytest.skip("openssh-server is not installed (.ci/run installs it)")
    root = tmp_path_factory.mktemp("fleet")
    client = Tfrun(root / "client-state", client_home=root / "client-home")
    servers = {name: Sshd(root / f"sshd-{name}") for name in BOXES}
    ssh_dir = client.client_home / ".ssh"
    ssh_dir.mkdir(mode=0o700)
    (ssh_dir / "known_hosts").write_text("".join(server.known_hosts_line for server in servers.values()))
    gates = root / "gates"
    gates.mkdir()
    project = root / "project"
    project.mkdir()
    script = write_script(project, "job.py", "import os, sys, time\nprint('job', sys.argv[1], flush=True)\n"
                          f"while not os.path.exists(os.path.join({str(gates)!r}, sys.argv[1])):\n"
                          "    time.sleep(0.1)\n")  # fmt: skip
    fleet = Fleet(client, servers, {name: root / f"home-{name}" for name in BOXES}, str(script), gates)
    for name, server in servers.items():
        fleet.add(name, f"{getpass.getuser()}@127.0.0.1:{server.port}", ["gpu"], fleet.homes[name], server.user_key)
    for name in BOXES:  # each daemon started once, with no fleet timeout to race
        client.ok("ps", "--host", name)
    yield fleet
    for home in fleet.homes.values():
        Tfrun(home).cleanup()
    client.cleanup()  # the keepers: they carry the client's TFRUN_HOME
    for server in servers.values():
        server.stop()


@pytest.fixture
def jobs_ended(fleet: Fleet) -> Iterator[None]:
    """Each test leaves every box with its GPU free: its jobs are cancelled at its end."""
    yield
    for name in BOXES:
        fleet.client.run("cancel", "--all", "--host", name)


def test_placement_picks_the_box_with_a_free_gpu_then_the_one_freed(fleet: Fleet, jobs_ended: None) -> None:
    for name in ("box1", "box3"):
        job = fleet.submit("--host", name, "--gpus", "1", fleet.script, f"busy-{name}").stdout.strip()
        fleet.running(f"{name}:{job}")
    placed = fleet.submit("--host", "gpu", "--gpus", "1", fleet.script, "first")
    assert "tfrun: placed on box2 (1 of 1 GPUs free)" in placed.stderr
    first = placed.stdout.strip()
    assert first.startswith("box2:")
    fleet.running(first)

    dry = fleet.client.run("submit", "--host", "gpu", "--gpus", "1", "--dry-run", fleet.script, "never")
    assert dry.returncode == 0, dry.stderr
    assert [line.split(":")[0] for line in dry.stdout.splitlines()[:3]] == list(BOXES)
    assert "box2: 0 of 1 GPUs free, 1 running, 0 queued" in dry.stdout
    assert "would place on box1: no box can start it now" in dry.stdout  # equal queues: by name

    (fleet.gates / "first").touch()
    assert fleet.client.run("wait", first).returncode == 0
    placed = fleet.submit("--host", "gpu", "--gpus", "1", "--json", fleet.script, "second")
    record = json.loads(placed.stdout)
    assert (record["host"], record["address"]) == ("box2", f"box2:{record['id']}")
    assert "placed on box2" in placed.stderr
    never = [job for name in BOXES for job in json.loads(fleet.client.ok("ps", "-a", "--json", "--host", name))
             if job["args"] == ["never"]]  # fmt: skip
    assert never == []  # the dry run submitted nothing


def test_ps_over_all_hosts_lists_each_job_once_with_its_host(fleet: Fleet, jobs_ended: None) -> None:
    ids = {name: fleet.submit("--host", name, fleet.script, f"ps-{name}").stdout.strip() for name in BOXES}
    # A second name for box1's daemon (after box1 in name order): its jobs are still listed once, as box1's.
    box1 = fleet.sshd["box1"]
    fleet.add("box1-alias", f"{getpass.getuser()}@127.0.0.1:{box1.port}", [], fleet.homes["box1"], box1.user_key)
    try:
        listed = json.loads(fleet.client.ok("ps", "--host", "all", "--json"))
        mine = [(job["host"], job["address"]) for job in listed if job["args"][0].startswith("ps-")]
        assert sorted(mine) == [(name, f"{name}:{ids[name]}") for name in BOXES]
        quiet = fleet.client.ok("ps", "--host", "gpu", "-q").split()
        assert {f"{name}:{ids[name]}" for name in BOXES} <= set(quiet)
        table = fleet.client.ok("ps", "--host", "gpu")
        assert table.splitlines()[0] == "jobs on pool gpu (3 of 3 hosts)"
        assert table.splitlines()[1].split()[:3] == ["HOST", "ID", "NAME"]
    finally:
        fleet.client.ok("hosts", "remove", "box1-alias")


def test_job_addresses_need_no_host(fleet: Fleet, jobs_ended: None) -> None:
    followed = fleet.submit("--host", "box2", fleet.script, "follow").stdout.strip()
    follow = subprocess.Popen([*TFRUN, "logs", "-f", f"box2:{followed}"], env=fleet.client.env, text=True,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE)  # fmt: skip
    status = fleet.client.ok("status", f"box2:{followed}")
    assert status.splitlines()[0].split() == ["id", f"box2:{followed}"]
    (fleet.gates / "follow").touch()
    out, err = follow.communicate(timeout=60)
    assert (follow.returncode, out) == (0, "job follow\n"), err

    cancelled = fleet.submit("--host", "box2", fleet.script, "cancel").stdout.strip()
    result = fleet.client.run("cancel", f"box2:{cancelled}")
    assert result.returncode == 0, result.stderr
    assert json.loads(fleet.client.ok("status", "--json", f"box2:{cancelled}"))["state"] == "cancelled"

    fleet.client.env["TFRUN_HOST"] = "box1"  # a standing default: an address overrules it
    try:
        assert fleet.client.ok("status", f"box2:{followed}").splitlines()[0].split() == ["id", f"box2:{followed}"]
    finally:
        del fleet.client.env["TFRUN_HOST"]
    unknown = fleet.client.run("status", "nosuch:3")  # no host nosuch: a job name, on the default host
    assert (unknown.returncode, unknown.stderr) == (3, "tfrun: error: no job 'nosuch:3' on box1\n")
    both = fleet.client.run("status", "--host", "box1", f"box2:{followed}")
    assert both.returncode == 2
    assert both.stderr == f"tfrun: error: --host box1 but job box2:{followed} is on box2: give one or the other\n"
    pool = fleet.client.run("cancel", "--host", "gpu", "3")
    assert (pool.returncode, pool.stderr.count("\n")) == (2, 1)
    assert "gpu is a pool: cancel needs one host (--host NAME) or a job address HOST:ID" in pool.stderr
    pooled = fleet.client.run("cancel", "gpu:3")  # an address names one host, not a pool
    assert (pooled.returncode, pooled.stderr.count("\n")) == (2, 1)
    assert "gpu is a pool (members: box1, box2, box3): a job address names one host" in pooled.stderr


def test_a_dead_box_is_skipped_within_the_timeout(fleet: Fleet, tmp_path: Path) -> None:
    """box4's sshd is stopped (a refused port); box5 takes the connection but never says a word (a box that
    hangs): each costs at most TFRUN_FLEET_TIMEOUT and a line on stderr, and no keeper is left behind."""
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
    fleet.client.env["TFRUN_FLEET_TIMEOUT"] = "2s"
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
        del fleet.client.env["TFRUN_FLEET_TIMEOUT"]
        silent.close()
        for name in ("box4", "box5"):
            fleet.client.ok("hosts", "remove", name)


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
