"""Soak: tfrund SIGKILLed again and again (or the SSH session under the clients cut) while jobs run and
clients follow and wait. Every job ends with its true code, every follower prints its job's log byte for
byte, and every follower and waiter ends with its job's code, the job that lives through every kill too."""

from __future__ import annotations

import contextlib
import os
import random
import re
import signal
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional

import pytest
from harness import (
    TFRUN,
    Sshd,
    Tfrun,
    keepers_of,
    kill_and_await_successor,
    open_fds,
    own_sockets,
    serving_daemon,
    wait_for,
    write_script,
)

pytestmark = [pytest.mark.slow]

KILLS = 20
FILTER = r"^[0-9]*7 "  # a filtered follower resumes at line boundaries: lines whose number ends in 7


@dataclass
class SoakJob:
    """A job that prints numbered lines of varied length, then exits with `code` (or is killed by `signal`)."""

    name: str
    lines: Optional[int]  # None: until the gate opens
    code: int
    signal: Optional[int] = None
    job_id: int = 0
    clients: dict[str, subprocess.Popen[bytes]] = field(default_factory=dict)

    def script(self, gate: Path) -> str:
        more = f"not os.path.exists({str(gate)!r})" if self.lines is None else f"i < {self.lines}"
        end = f"os.kill(os.getpid(), {self.signal})" if self.signal else f"sys.exit({self.code})"
        return (
            "import os, sys, time\n"
            "i = 0\n"
            f"while {more}:\n"
            "    print(i, 'x' * (i % 97), flush=True)\n"
            "    i += 1\n"
            "    time.sleep(0.01)\n"
            f"{end}\n"
        )

    @property
    def exit_code(self) -> int:
        return 128 + self.signal if self.signal else self.code


def _submit(tf: Tfrun, project: Path, gate: Path, jobs: list[SoakJob]) -> None:
    for job in jobs:
        write_script(project, f"{job.name}.py", job.script(gate))
        job.job_id = tf.submit(str(project / f"{job.name}.py"))


def _start_clients(tf: Tfrun, jobs: list[SoakJob], filtered: bool) -> None:
    """A follower and a waiter for each job; with `filtered`, a follower with a pattern for the long one."""
    for job in jobs:
        verbs = {"follow": ["logs", "-f"], "wait": ["wait"]}
        if filtered and job.lines is None:
            verbs["grep"] = ["logs", "-f", "--grep", FILTER]
        for role, verb in verbs.items():
            out = tf.home.parent / f"{job.name}.{role}"
            with open(out, "wb") as stdout, open(out.with_suffix(".err"), "wb") as stderr:  # files: never full
                command = [*TFRUN, *verb, str(job.job_id)]
                job.clients[role] = subprocess.Popen(command, env=tf.env, stdout=stdout, stderr=stderr)


def _live_clients(jobs: list[SoakJob]) -> int:
    return sum(client.poll() is None for job in jobs for client in job.clients.values())


def _check(tf: Tfrun, jobs: list[SoakJob]) -> None:
    """Each job's record, log and clients, after the last kill."""
    for job in jobs:
        outputs = {}
        for role, client in job.clients.items():
            out = tf.home.parent / f"{job.name}.{role}"
            code = client.wait(timeout=120)
            assert code == job.exit_code, f"{job.name} {role}: {out.with_suffix('.err').read_text()}"
            outputs[role] = out.read_bytes()
        record = tf.job(job.job_id)
        assert (record["exit_code"], record["signal"]) == (job.exit_code, job.signal), record
        log = (tf.job_dir(job.job_id) / "output.log").read_bytes()
        lines = log.decode().splitlines()
        assert [int(line.split()[0]) for line in lines] == list(range(len(lines))), f"{job.name}: a gap in its log"
        assert job.lines is None or len(lines) == job.lines
        assert outputs["follow"] == log, f"{job.name}: the follower's output is not the log"
        if "grep" in outputs:
            wanted = "".join(f"{line}\n" for line in lines if re.match(FILTER, line))
            assert outputs["grep"].decode() == wanted, f"{job.name}: the filtered follower's output"


def test_twenty_daemon_kills_lose_no_job_no_byte_and_no_exit_code(tf: Tfrun, project: Path, gate: Path) -> None:
    jobs = [
        SoakJob("through-every-kill", lines=None, code=3),
        SoakJob("short", lines=300, code=0),
        SoakJob("medium", lines=1500, code=42),
        SoakJob("signalled", lines=800, code=0, signal=signal.SIGTERM),
    ]
    _submit(tf, project, gate, jobs)
    idle = own_sockets(tf.home)
    _start_clients(tf, jobs, filtered=True)
    started = time.monotonic()
    daemons = {wait_for(lambda: serving_daemon(tf.home))}
    for _ in range(KILLS):
        daemons.add(kill_and_await_successor(tf.home, lambda: _live_clients(jobs), idle))
        time.sleep(random.uniform(0.05, 0.4))  # kill at varied points of the jobs' output and the clients' reads
    assert len(daemons) == KILLS + 1
    assert tf.job(jobs[0].job_id)["state"] == "running", "the long job lives through every kill"
    gate.touch()
    _check(tf, jobs)
    print(f"soak: {KILLS} daemon kills in {time.monotonic() - started:.1f}s")


def _client_sockets(pid: int, own: set[str]) -> set[str]:
    return {target for target in open_fds(pid) if target.startswith("socket:")} - own


@pytest.mark.ssh
@pytest.mark.parametrize("tf", [pytest.param("ssh", marks=pytest.mark.ssh)], indirect=True)
def test_twenty_ssh_sessions_cut_lose_no_byte_and_no_exit_code(
    tf: Tfrun, sshd: Sshd, project: Path, gate: Path
) -> None:
    """The connection keeper and the sshd process serving it, killed in turn: the clients reconnect through a
    fresh keeper and a fresh SSH connection each time."""
    jobs = [SoakJob("through-every-cut", lines=None, code=3), SoakJob("medium", lines=1500, code=42)]
    _submit(tf, project, gate, jobs)
    daemon = wait_for(lambda: serving_daemon(tf.home))
    time.sleep(0.5)  # the submits' connections are gone
    own = _client_sockets(daemon, set())
    _start_clients(tf, jobs, filtered=False)
    started = time.monotonic()
    for cut in range(KILLS):
        wait_for(lambda: len(_client_sockets(daemon, own)) >= _live_clients(jobs), what="the clients to connect")
        cut_off = _client_sockets(daemon, own)
        victims = keepers_of(tf) if cut % 2 == 0 else sorted(sshd.sessions())
        assert victims, "the clients reach the box through a keeper and an sshd session"
        for pid in victims:
            with contextlib.suppress(ProcessLookupError):  # a session of the last cut's keeper, ending by itself
                os.kill(pid, signal.SIGKILL)
        wait_for(lambda: not cut_off & _client_sockets(daemon, own), what="the cut connections to end")  # noqa: B023
        time.sleep(random.uniform(0.05, 0.4))
    wait_for(lambda: len(_client_sockets(daemon, own)) >= _live_clients(jobs), what="the clients to connect")
    assert serving_daemon(tf.home) == daemon, "only the SSH sessions were cut"
    gate.touch()
    _check(tf, jobs)
    print(f"soak: {KILLS} SSH sessions cut in {time.monotonic() - started:.1f}s")
