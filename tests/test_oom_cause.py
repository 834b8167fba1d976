"""An OOM judged once (issue 47): the lifecycle decides a job's cause as it records its end, from every account of it
(its cgroup's OOM-kill count with a SIGKILL, its log's last words, Slurm's word), and the alert watch's `oom` alert
at the end reads that cause. On a real store, a real alert watch and real job folders; the cgroup's counter is a
file of the kernel's form ("oom_kill N") that the test writes, so that a count can rise exactly when a test needs
it (tests/test_alerts.py and tests/test_restarts.py have the kernel's own OOM killer, under a memory cgroup).
"""

from __future__ import annotations

import json
import signal
from collections.abc import Iterator
from pathlib import Path
from typing import Optional

import pytest
from harness.alerting import PYTORCH_OOM

from tfrun.protocol.fields import JobState
from tfrun.runner.alerts.outbox import Outbox
from tfrun.runner.alerts.watch import Alerts
from tfrun.runner.config.settings import Config
from tfrun.runner.executors.slurm import states
from tfrun.runner.records.job import JobRow, JobSpec
from tfrun.runner.records.lifecycle import Lifecycle
from tfrun.runner.records.store import Store
from tfrun.runner.shim.process import boot_id


class Box:
    """A database of its own, the lifecycle over it, and alert watches (a new one: a restarted daemon's) with no
    cooldown, so that an alert stored twice would show twice."""

    def __init__(self, tmp_path: Path) -> None:
        self.store = Store(tmp_path / "tfrun.db")
        self.config = Config(checkpoint_root=tmp_path / "checkpoints", cooldown=0.0)
        self.lifecycle = Lifecycle(self.store, tmp_path / "jobs", lambda: self.config.checkpoint_root)
        self.counter = tmp_path / "memory.events"  # the job's cgroup's OOM-kill counter, as the kernel writes it

    def watch(self) -> Alerts:
        return Alerts(self.config, self.store, Outbox(self.store, self.config.cooldown, self.config.expire))

    def running(self, oom_kills: int = 2, boot: Optional[str] = None) -> JobRow:
        """A running job whose shim recorded the counter at `oom_kills` just before the job started, in this boot
        (or `boot`)."""
        spec = JobSpec(script="x.py", args=(), command=("python3", "x.py"), env={})
        row = self.lifecycle.start(self.lifecycle.create("hog", spec), pid=11, shim_pid=10, shim_start=5,
                                   boot_id=boot or boot_id(), started_at=1.0)  # fmt: skip
        shim = {"shim_pid": 10, "boot_id": boot or boot_id(), "oom_file": str(self.counter), "oom_kills": oom_kills}
        Path(row.job_dir, "shim.json").write_text(json.dumps(shim))
        self.count(oom_kills)
        Path(row.job_dir, "output.log").write_text("allocating\n")
        return row

    def count(self, kills: int) -> None:
        self.counter.write_text(f"low 0\nhigh 0\nmax 3\noom 3\noom_kill {kills}\n")

    def end_alerts(self, watch: Alerts, row: JobRow) -> list[tuple[str, str]]:
        """The alerts a job's watch stores by the end of it: (rule, summary), oldest first."""
        ended = self.store.get(row.id)
        assert ended is not None and ended.final
        looks = 1
        while not watch._look(ended, whole=True):
            looks += 1
            assert looks < 10
        return [(alert.rule, alert.summary) for alert in self.store.alerts(row.id, 10)]


@pytest.fixture
def box(tmp_path: Path) -> Iterator[Box]:
    made = Box(tmp_path)
    try:
        yield made
    finally:
        made.store.close()


KILLED = {"exit_code": 137, "signal": signal.SIGKILL, "finished_at": 2.0}


@pytest.mark.parametrize(
    ("values", "count", "boot", "cause"),
    [
        (KILLED, 3, None, "oom"),  # the kernel's OOM killer: a SIGKILL while the count rose
        (KILLED, 2, None, "signal"),  # a kill -9: the count stayed
        ({**KILLED, "exit_code": 143, "signal": signal.SIGTERM}, 3, None, "signal"),  # only a SIGKILL is its kill
        (KILLED, 3, "another machine or an earlier boot", "signal"),  # its shim's counter is not the one here
    ],
)
def test_the_lifecycle_decides_an_oom_kill_from_the_cgroup_as_it_records_the_end(
    box: Box, values: dict[str, int], count: int, boot: Optional[str], cause: str
) -> None:
    """Before, the local executor judged the cgroup and the lifecycle only took its word."""
    row = box.running(oom_kills=2, boot=boot)
    box.count(count)
    ended, _ = box.lifecycle.end(row, JobState.FAILED, **values)
    assert ended.cause == cause and box.store.get(row.id) == ended


def test_an_oom_kill_alerts_oom_then_failed(box: Box) -> None:
    row = box.running()
    box.count(3)
    box.lifecycle.end(row, JobState.FAILED, **KILLED)
    found = box.end_alerts(box.watch(), row)
    assert [rule for rule, _ in found] == ["oom", "failed"]
    assert "killed by the kernel's OOM killer (SIGKILL)" in found[0][1]


@pytest.mark.parametrize(
    ("boot", "rises"),
    [
        (None, "after its end"),  # another process of the same cgroup, killed before the watch reads the end
        ("a compute node", "before its end"),  # a Slurm job's shim: the counter named is its node's, not this one
    ],
)
def test_the_end_alert_reads_the_cause_and_never_the_cgroup_again(box: Box, boot: Optional[str], rises: str) -> None:
    """A kill -9 that the lifecycle ended as a signal alerts `failed` alone, whatever a counter says by the time the
    watch reads its end (a long log, a daemon down, another machine's counter). Before, the watch read the count
    again and alerted `oom` for a job whose cause, and whose `status`, said signal."""
    row = box.running(boot=boot)
    if rises == "before its end":
        box.count(3)
    ended, _ = box.lifecycle.end(row, JobState.FAILED, **KILLED)
    assert ended.cause == "signal"
    box.count(3)
    assert [rule for rule, _ in box.end_alerts(box.watch(), row)] == ["failed"]


def test_a_jobs_own_oom_message_is_its_one_oom_alert_even_across_a_daemon_restart(box: Box) -> None:
    """Its log's last words (a fatal OOM message, alerted as the watch read it) make its cause oom; a kill -9 after
    it (a job hung on its OOM) adds no second `oom` alert claiming the OOM killer, however short the cooldown,
    even when another daemon's watch reads its end (where the watch stands is saved with the alert)."""
    row = box.running()
    with open(Path(row.job_dir, "output.log"), "a") as log:
        log.write(f"Traceback (most recent call last):\n{PYTORCH_OOM}\n")
    assert not box.watch()._look(row, whole=True)  # it runs: the message's alert, stored with the watch's state
    ended, _ = box.lifecycle.end(row, JobState.FAILED, **KILLED)
    assert ended.cause == "oom"
    found = box.end_alerts(box.watch(), row)
    assert [rule for rule, _ in found] == ["oom", "failed"]
    assert "out of memory (PyTorch)" in found[0][1]


def test_slurms_memory_kill_is_the_jobs_cause_and_its_oom_alert(box: Box) -> None:
    """Slurm's OUT_OF_MEMORY, as its executor reports it (runner/executors/slurm/states.py), through the lifecycle:
    the cause oom, which the watch reads; no counter of this machine is read for it."""
    row = box.running(boot="a compute node")
    record = {"exit_code": 137, "signal": 9, "stopped": False, "started_at": 1.0, "finished_at": 2.0}
    change = states.end_of("OUT_OF_MEMORY", record, cancel_requested=False, started_at=1.0)  # type: ignore[arg-type]
    ended, _ = box.lifecycle.end(row, change.state, **change.values())
    assert ended.cause == "oom"
    found = box.end_alerts(box.watch(), row)
    assert [rule for rule, _ in found] == ["oom", "failed"]
    assert "killed by Slurm over its memory limit (sbatch --mem)" in found[0][1]
