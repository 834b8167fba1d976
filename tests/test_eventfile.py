"""The daemon's TensorBoard scalars (runner/metrics/eventfile.py), read back with TensorBoard's own reader: what a job
printed becomes curves in its TensorBoard folder's `printed` run (issue 20)."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Optional

from harness import Tfrun, wait_for, write_script
from tensorboard.backend.event_processing import event_accumulator

from tfrun.runner.metrics.eventfile import PRINTED, ScalarFile, crc32c


def _scalars(folder: Path) -> dict[str, list[tuple[int, float]]]:
    """Every scalar series in `folder`, as TensorBoard loads it."""
    reader = event_accumulator.EventAccumulator(str(folder), size_guidance={event_accumulator.SCALARS: 0})
    reader.Reload()
    return {tag: [(e.step, e.value) for e in reader.Scalars(tag)] for tag in reader.Tags()["scalars"]}


def test_crc32c_is_castagnolis() -> None:
    assert crc32c(b"123456789") == 0xE3069283  # the check value of CRC-32C
    assert crc32c(b"") == 0


def test_scalars_read_back_by_tensorboard_across_restarts(tmp_path: Path) -> None:
    folder = tmp_path / "tensorboard" / PRINTED
    ScalarFile(folder).append([(0, {"loss": 2.5, "accuracy": 0.25}), (100, {"loss": 1.25})])
    ScalarFile(folder).append([(200, {"loss": math.nan, "flag": True, "huge": 10**400}), (300, {"loss": 0.5})])
    assert len(list(folder.glob("events.out.tfevents.*"))) == 1, "a daemon restart appends to the same file"
    series = _scalars(folder)
    assert set(series) == {"loss", "accuracy"}, "bools and numbers beyond a double are no scalars"
    assert series["accuracy"] == [(0, 0.25)]
    steps = [step for step, _ in series["loss"]]
    assert steps == [0, 100, 200, 300]
    values = [value for _, value in series["loss"]]
    assert values[:2] == [2.5, 1.25] and math.isnan(values[2]) and values[3] == 0.5


def test_nothing_to_write_makes_no_file(tmp_path: Path) -> None:
    ScalarFile(tmp_path / "run").append([(1, {"note": "text"})])  # type: ignore[dict-item]
    assert not (tmp_path / "run").exists()


def test_a_jobs_printed_losses_become_tensorboard_scalars(tf: Tfrun, project: Path) -> None:
    write_script(
        project, "plain.py", "for epoch in range(1, 4):\n    print(f'Epoch {epoch}, Avg Loss: {1.0 / epoch:.4f}')\n"
    )
    job = tf.submit(str(project / "plain.py"))
    assert tf.run("wait", str(job)).returncode == 0
    folder = tf.job_dir(job) / "tensorboard" / PRINTED

    def three_losses() -> Optional[list[tuple[int, float]]]:
        """The watch keeps what it read in batches (every KEEP_EVERY_S, and all once the job's end is read): the
        run may hold the first loss a moment before the others."""
        loss = _scalars(folder).get("avg_loss", []) if folder.is_dir() else []
        return loss if len(loss) >= 3 else None

    loss = wait_for(three_losses, what="the printed run's three losses")
    assert [round(value, 4) for _, value in loss] == [1.0, 0.5, 0.3333]
