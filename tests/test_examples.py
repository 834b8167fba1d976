"""The example jobs train for real, with TensorFlow on the CPU, submitted through the local daemon."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
from conftest import Tfrun

EXAMPLES = Path(__file__).resolve().parent.parent / "jobs" / "examples"

pytest.importorskip("tensorflow", reason="the example jobs need TensorFlow (pip install -e '.[test]')")


def test_the_demo_job_trains_and_checkpoints_through_tfrun(tf: Tfrun) -> None:
    result = tf.run(
        "submit", "--follow", "--python", sys.executable, str(EXAMPLES / "mnist_mirrored.py"),
        "--epochs", "2", "--examples", "4000", "--synthetic",
        timeout=600,
    )  # fmt: skip
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    losses = [float(line.rsplit(" ", 1)[1]) for line in result.stdout.splitlines() if line.startswith("Epoch ")]
    assert len(losses) == 2 and losses[1] < losses[0], result.stdout
    record = tf.jobs()[0]
    assert record["state"] == "succeeded"
    assert any(p.name.startswith("final-1") for p in Path(record["checkpoint_dir"]).iterdir())
