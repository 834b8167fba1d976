"""A job's states and moves (runner/records/lifecycle.py), on a real store: every allowed move is made and persisted,
every other one is refused with nothing written, and no code but the lifecycle writes a job's state."""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path

import pytest

from tfrun.protocol.fields import CAUSES, Cause, JobState, State
from tfrun.runner.records.job import JobRow, JobSpec
from tfrun.runner.records.lifecycle import MOVES, ForbiddenMove, Lifecycle, allowed
from tfrun.runner.records.store import Store

ENDS: tuple[State, ...] = (JobState.SUCCEEDED, JobState.FAILED, JobState.CANCELLED, JobState.LOST)
STATES: tuple[State, ...] = (JobState.QUEUED, JobState.RUNNING, *ENDS)

# Today's moves, as ARCHITECTURE.md's table gives them: a queued job may end before its start is recorded
# (its exit record read first, a failure to start, a cancel, a reboot).
EXPECTED = {
    (None, JobState.QUEUED),
    (JobState.QUEUED, JobState.RUNNING),
    *((JobState.QUEUED, end) for end in ENDS),
    *((JobState.RUNNING, end) for end in ENDS),
}


@pytest.fixture
def lifecycle(tmp_path: Path) -> Iterator[Lifecycle]:
    store = Store(tmp_path / "tfrun.db")
    yield Lifecycle(store, tmp_path / "jobs", lambda: tmp_path / "checkpoints")
    store.close()


def _spec(max_restarts: int = 0, restart_on: tuple[Cause, ...] = CAUSES) -> JobSpec:
    return JobSpec(script="train.py", args=(), command=("python3", "train.py"), env={}, max_restarts=max_restarts,
                   restart_on=restart_on)  # fmt: skip


def _in_state(
    lifecycle: Lifecycle, state: State, max_restarts: int = 0, restart_on: tuple[Cause, ...] = CAUSES
) -> JobRow:
    """A new job brought to `state` by allowed moves."""
    row = lifecycle.create("j", _spec(max_restarts, restart_on))
    if state == JobState.QUEUED:
        return row
    row = lifecycle.start(row, pid=11, shim_pid=10, shim_start=5, boot_id="b", started_at=1.0)
    if state == JobState.RUNNING:
        return row
    ended, _ = lifecycle.end(row, state, exit_code=1, finished_at=2.0, reason="r")
    return ended


def _move(lifecycle: Lifecycle, row: JobRow, state: State) -> JobRow:
    """Ask the lifecycle to move `row` to `state` through the entry point for it."""
    if state == JobState.RUNNING:
        return lifecycle.start(row, pid=21, shim_pid=20, shim_start=6, boot_id="b", started_at=3.0)
    ended, _ = lifecycle.end(row, state, exit_code=0, finished_at=4.0, reason="moved")
    return ended


def _dump(store: Store) -> list[str]:
    return list(store.db.iterdump())


def test_the_table_is_todays_moves() -> None:
    table = {(old, new) for old, targets in MOVES.items() for new in targets}
    assert table == EXPECTED
    assert set(MOVES) == {None, *STATES}
    assert all(not MOVES[end] for end in ENDS)  # nothing moves a final job


def test_creating_a_job_records_it_queued_and_returns_the_row_it_wrote(lifecycle: Lifecycle) -> None:
    row = lifecycle.create("j", _spec(), submission_id="s1")
    assert row.state == JobState.QUEUED and Path(row.job_dir).is_dir()
    assert lifecycle.store.get(row.id) == row
    assert lifecycle.store.find_submission("s1") == row


@pytest.mark.parametrize(("old", "new"), sorted((o, n) for o, n in EXPECTED if o is not None))
def test_every_allowed_move_is_made_and_persisted(lifecycle: Lifecycle, old: State, new: State) -> None:
    row = _in_state(lifecycle, old)
    moved = _move(lifecycle, row, new)
    assert moved.state == new
    assert lifecycle.store.get(row.id) == moved  # what it returned is what it wrote


@pytest.mark.parametrize(
    ("old", "new"), [(o, n) for o in STATES for n in STATES if (o, n) not in EXPECTED], ids=lambda s: str(s)
)
def test_every_other_move_is_refused_and_writes_nothing(lifecycle: Lifecycle, old: State, new: State) -> None:
    assert not allowed(old, new)
    row = _in_state(lifecycle, old)
    before = _dump(lifecycle.store)
    with pytest.raises(ForbiddenMove, match=f"job {row.id}: {old} -> {new} is not a move"):
        _move(lifecycle, row, new)
    assert _dump(lifecycle.store) == before
    assert lifecycle.store.get(row.id) == row


@pytest.mark.parametrize("new", [JobState.RUNNING, *ENDS])
def test_a_move_from_a_state_the_job_has_left_is_refused_and_writes_nothing(lifecycle: Lifecycle, new: State) -> None:
    queued = _in_state(lifecycle, JobState.QUEUED)
    ended, _ = lifecycle.end(queued, JobState.CANCELLED, finished_at=1.0, reason="cancelled before it started")
    before = _dump(lifecycle.store)
    with pytest.raises(ForbiddenMove, match=r"queued -> \w+ is not a move a job can make \(it is cancelled\)"):
        _move(lifecycle, queued, new)  # `queued` is stale: the job is cancelled
    assert _dump(lifecycle.store) == before
    assert lifecycle.store.get(queued.id) == ended


def test_no_store_write_but_the_lifecycles_sets_a_state(lifecycle: Lifecycle) -> None:
    row = _in_state(lifecycle, JobState.QUEUED)
    with pytest.raises(ValueError, match="not updatable"):
        lifecycle.store.update(row.id, state=JobState.RUNNING)
    runner = Path(__file__).resolve().parent.parent / "runner"
    movers = [p.name for p in runner.rglob("*.py") if re.search(r"\.move\(", p.read_text())]
    assert movers == ["lifecycle.py"]


@pytest.mark.parametrize("end", [JobState.FAILED, JobState.LOST])
def test_a_failed_or_lost_job_with_restarts_left_gets_its_restart_in_the_same_move(
    lifecycle: Lifecycle, end: State
) -> None:
    row = _in_state(lifecycle, JobState.RUNNING, max_restarts=2)
    lifecycle.store.set_job_alerts(row.id, {"nan": None}, ["https://example.com/hook"], ["loss=(\\S+)"])
    ended, restart = lifecycle.end(row, end, exit_code=1, finished_at=2.0)
    assert restart is not None and ended.restarted_as == restart.id
    assert lifecycle.store.get(row.id) == ended and lifecycle.store.get(restart.id) == restart
    assert restart.state == JobState.QUEUED and restart.spec.restart_of == row.id and restart.spec.max_restarts == 1
    assert restart.checkpoint_dir == row.checkpoint_dir
    assert lifecycle.store.job_alerts(restart.id) == lifecycle.store.job_alerts(row.id)
    assert row.id in lifecycle.store.watched_jobs()  # its end alerts are due


@pytest.mark.parametrize(("end", "restarts"), [(JobState.SUCCEEDED, 2), (JobState.CANCELLED, 2), (JobState.FAILED, 0)])
def test_other_ends_get_no_restart(lifecycle: Lifecycle, end: State, restarts: int) -> None:
    row = _in_state(lifecycle, JobState.RUNNING, max_restarts=restarts)
    ended, restart = lifecycle.end(row, end, exit_code=0, finished_at=2.0)
    assert restart is None and ended.restarted_as is None
    assert [r.id for r in lifecycle.store.list(include_final=True)] == [row.id]


# How an end's values tell its cause (--restart-on), where the executor gave none, and whether the default
# (lost, oom, signal) restarts it.
CAUSED = [
    (JobState.LOST, {"exit_code": 255, "reason": "its shim is gone"}, "lost", True),
    (JobState.FAILED, {"exit_code": 137, "signal": 9}, "signal", True),
    (JobState.FAILED, {"exit_code": 137, "signal": 9, "cause": "oom"}, "oom", True),  # the executor's word: Slurm's
    (JobState.FAILED, {"exit_code": 1}, "error", False),
    (JobState.FAILED, {"reason": "job 3, which it runs after, failed"}, "error", False),  # it never started
    (JobState.SUCCEEDED, {"exit_code": 0}, None, False),
    (JobState.CANCELLED, {"exit_code": 143, "signal": 15}, None, False),
]


@pytest.mark.parametrize(("end", "values", "cause", "restarted"), CAUSED)
def test_an_end_records_its_cause_and_restarts_only_for_a_cause_of_restart_on(
    lifecycle: Lifecycle, end: State, values: dict[str, object], cause: str, restarted: bool
) -> None:
    row = _in_state(lifecycle, JobState.RUNNING, max_restarts=1, restart_on=("lost", "oom", "signal"))
    ended, restart = lifecycle.end(row, end, finished_at=2.0, **values)
    assert ended.cause == cause and lifecycle.store.get(row.id) == ended
    assert (restart is not None, ended.restarted_as is not None) == (restarted, restarted)
    assert len(lifecycle.store.list(include_final=True)) == 1 + restarted


def test_a_failed_jobs_log_ending_in_an_out_of_memory_traceback_is_an_oom(lifecycle: Lifecycle) -> None:
    row = _in_state(lifecycle, JobState.RUNNING, max_restarts=1, restart_on=("oom",))
    (Path(row.job_dir) / "output.log").write_text("step 1\ntorch.OutOfMemoryError: CUDA out of memory.\n")
    ended, restart = lifecycle.end(row, JobState.FAILED, exit_code=1, finished_at=2.0)
    assert ended.cause == "oom" and restart is not None


def test_an_end_that_fails_half_way_leaves_the_job_as_it_was(
    lifecycle: Lifecycle, monkeypatch: pytest.MonkeyPatch
) -> None:
    row = _in_state(lifecycle, JobState.RUNNING, max_restarts=1)
    before = _dump(lifecycle.store)

    def full_disk(job_id: int) -> None:
        raise OSError("disk full")

    monkeypatch.setattr(lifecycle.store, "end_alerts_due", full_disk)
    with pytest.raises(OSError, match="disk full"):
        lifecycle.end(row, JobState.FAILED, exit_code=1, finished_at=2.0)
    assert _dump(lifecycle.store) == before


def test_every_move_tells_who_waits_on_the_store(lifecycle: Lifecycle) -> None:
    """The alert watch wakes at a job's start and end (Store.on_job_write) instead of finding them at its next
    poll: a job that fails in its first second alerts as soon as one that fails later."""
    told: list[int] = []
    lifecycle.store.on_job_write.append(lambda: told.append(lifecycle.store.job_writes))
    row = lifecycle.create("j", _spec())
    created = len(told)
    row = lifecycle.start(row, pid=11, shim_pid=10, shim_start=5, boot_id="b", started_at=1.0)
    started = len(told)
    lifecycle.end(row, JobState.FAILED, exit_code=1, finished_at=2.0, reason="r")
    assert 0 < created < started < len(told)
    assert told == sorted(told) and told[-1] == lifecycle.store.job_writes  # told after each write is counted
