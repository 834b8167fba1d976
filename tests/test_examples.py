"""The example jobs train for real, with TensorFlow on the CPU, submitted through the local daemon."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
from harness import Tfrun

from tfrun.runner.logs.lines import plain

pytestmark = [pytest.mark.tensorflow]

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
    listed = tf.ok("checkpoints", "--json", str(record["id"]))
    steps = [point["step"] for point in json.loads(listed)]
    assert steps == [63, 126], "a checkpoint at the end of each epoch of 63 steps (4000 examples, 64 a batch)"


@pytest.mark.slow  # more than 10 s
def test_the_model_fit_example_trains_a_small_cnn_and_checkpoints_each_epoch(tf: Tfrun) -> None:
    result = tf.run(
        "submit", "--follow", "--python", sys.executable, str(EXAMPLES / "mnist_fit.py"),
        "--epochs", "2", "--examples", "2000", "--synthetic", "--model", "cnn",
        timeout=600,
    )  # fmt: skip
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert result.stdout.count("val_accuracy") == 2
    points = json.loads(tf.ok("checkpoints", "--json", "1"))
    assert [point["step"] for point in points] == [29, 58], "one checkpoint per epoch of 29 steps"


@pytest.mark.slow  # more than 10 s
def test_a_real_keras_fit_followed_with_a_filter_shows_each_epoch_once(tf: Tfrun, tmp_path: Path) -> None:
    """model.fit of the installed TensorFlow, live under tfrun: its redrawn progress bar, filtered on the box."""
    project = tmp_path / "fit"
    project.mkdir()
    (project / "keras_fit.py").write_bytes((Path(__file__).resolve().parent / "data" / "keras_fit.py").read_bytes())
    job = int(tf.ok("submit", "--python", sys.executable, str(project / "keras_fit.py")).strip())
    followed = tf.run("logs", "-f", str(job), "-e", "val_loss", timeout=600)
    assert followed.returncode == 0, followed.stdout[-3000:] + followed.stderr[-3000:]
    lines = [plain(line) for line in followed.stdout.splitlines()]
    assert len(lines) == 3, followed.stdout
    assert all(line.startswith("9/9 ") and "/step - " in line and "ETA" not in line for line in lines), lines
    losses = [float(line.split(" loss: ")[1].split()[0]) for line in lines]
    assert losses == sorted(losses, reverse=True), "the loss falls over 3 epochs of this easy problem"
