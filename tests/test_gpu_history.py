"""A job's GPUs over its life (runner/gpus/history.py): what the daemon appends to the job's gpus.jsonl, and
what it reads back for the job's page (GetGpuUse): only the new lines, thinned to the peaks, never through a
link the job put in place of its file. (The page itself: tests/test_ui_pages.py.)"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from tfrun.runner.gpus.devices import GpuReading
from tfrun.runner.gpus.history import GpuHistory, read_gpu_use
from tfrun.runner.records.job import JobSpec
from tfrun.runner.records.store import Store

GIB = 1 << 30


@pytest.fixture
def store(tmp_path: Path) -> Iterator[Store]:
    found = Store(tmp_path / "tfrun.db")
    yield found
    found.close()


def _job(store: Store, tmp_path: Path) -> tuple[int, Path]:
    """A job in the store, and its folder (what the sampler writes into)."""
    spec = JobSpec(script="train.py", args=(), command=("python3", "train.py"), env={})
    row = store.create_job(None, spec, tmp_path / "jobs", tmp_path / "checkpoints")
    return row.id, Path(row.job_dir)


def test_each_held_gpu_is_appended_to_its_job_s_file_and_read_back_from_where_the_last_read_ended(
    store: Store, tmp_path: Path
) -> None:
    (one, first), (two, second) = _job(store, tmp_path), _job(store, tmp_path)
    readings = [GpuReading(0, "H200", 30 * GIB, 141 * GIB, 40, "GPU-a"), GpuReading(1, "H200", 5 * GIB, 141 * GIB, 7)]
    held = {"GPU-a": one, "1": two, "7": two, "0": 99}  # device 7: NVML does not list it; job 99: removed meanwhile
    sampler = GpuHistory(lambda: held, store)
    sampler.record(held, readings, 100.0)
    samples, after, thinned = read_gpu_use(first, 0, None)
    assert [(s.time, s.device, s.used, s.total, s.load) for s in samples] == [(100.0, "GPU-a", 30 * GIB, 141 * GIB, 40)]
    assert after == (first / "gpus.jsonl").stat().st_size and not thinned
    assert [s.device for s in read_gpu_use(second, 0, None)[0]] == ["1"]
    sampler.record(held, readings, 105.0)
    with open(first / "gpus.jsonl", "a") as f:
        f.write('{"time": 110, "device": "GPU-a", "used": 1')  # a line still being written: read once whole
    newer, later, _ = read_gpu_use(first, after, None)
    assert [s.time for s in newer] == [105.0] and later < (first / "gpus.jsonl").stat().st_size
    assert read_gpu_use(first, 10**9, None)[0][0].time == 100.0, "a place past the end: the file from its start"


def test_the_job_s_own_lines_are_not_trusted_and_its_link_is_not_followed(store: Store, tmp_path: Path) -> None:
    """The folder is the job's: a line of nonsense is skipped, and a gpus.jsonl it made a link (to another of
    its user's files) is neither written through nor read."""
    (tmp_path / "gpus.jsonl").write_text(
        "\n".join(
            [
                '{"time": 1, "device": "0", "used": -5, "total": 1}',
                "[]",
                "not json",
                '{"time": 2, "device": "0", "used": 5, "total": 10, "load": 1e400}',
            ]
        )
        + "\n"
    )
    assert [(s.time, s.used, s.load) for s in read_gpu_use(tmp_path, 0, None)[0]] == [(2.0, 5, None)]
    elsewhere = tmp_path / "elsewhere"
    elsewhere.write_text("mine\n")
    job, linked = _job(store, tmp_path)
    os.symlink(elsewhere, linked / "gpus.jsonl")
    GpuHistory(lambda: {"0": job}, store).record({"0": job}, [GpuReading(0, "H200", GIB, 2 * GIB, 3)], 1.0)
    assert elsewhere.read_text() == "mine\n"
    assert read_gpu_use(linked, 0, None) == ([], 0, False)


def test_thinning_keeps_each_gpu_s_peaks_of_memory_and_load(tmp_path: Path) -> None:
    """What a right-sizing reads is the peak: 10,000 samples to 10 ranges keep each range's highest memory and
    load of each GPU, which an even thinning would miss."""
    lines = []
    for i in range(10_000):
        used = 80 * GIB if i == 4321 else GIB * (1 + i % 3)
        lines.append(
            {"time": i, "device": str(i % 2), "used": used, "total": 141 * GIB, "load": 99 if i == 777 else 10}
        )
    (tmp_path / "gpus.jsonl").write_text("".join(json.dumps(line) + "\n" for line in lines))
    samples, _, thinned = read_gpu_use(tmp_path, 0, 10)
    assert thinned and len(samples) <= 10 * 2 * 3
    assert max(s.used for s in samples if s.device == "1") == 80 * GIB
    assert max(s.load or 0 for s in samples if s.device == "1") == 99
    assert {s.device for s in samples} == {"0", "1"}
