"""The example jobs train for real, with TensorFlow on the CPU, submitted through the local daemon."""

from __future__ import annotations

import json
import socket
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
    steps = [point["step"] for point in json.loads(listed)["checkpoints"]]
    assert steps == [63, 126], "a checkpoint at the end of each epoch of 63 steps (4000 examples, 64 a batch)"


def test_the_demo_says_in_whole_words_why_mnist_cannot_be_downloaded(tf: Tfrun) -> None:
    """A download that fails for real, on any machine (its proxy's name never resolves): the demo says why in
    the error's own words, none cut (`Name or s` was `Name or service not known`), then trains on synthetic
    digits."""
    proxy = "http://proxy.invalid:3128"
    with pytest.raises(socket.gaierror) as resolving:
        socket.getaddrinfo("proxy.invalid", 3128)
    proxies = [f"--env={name}={value}" for name, value in (("https_proxy", proxy), ("HTTPS_PROXY", proxy),
                                                          ("no_proxy", ""), ("NO_PROXY", ""))]  # fmt: skip
    result = tf.run(
        "submit", "--follow", "--python", sys.executable, *proxies, str(EXAMPLES / "mnist_mirrored.py"),
        "--epochs", "1", "--examples", "2000",
        timeout=600,
    )  # fmt: skip
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    [said] = [line for line in result.stdout.splitlines() if line.startswith("MNIST unavailable")]
    assert said.startswith("MNIST unavailable (URL fetch failure on https://"), said
    assert said.endswith(f"{resolving.value.strerror}); training on synthetic digits"), said


@pytest.mark.slow  # more than 10 s
def test_the_model_fit_example_trains_a_small_cnn_and_checkpoints_each_epoch(tf: Tfrun) -> None:
    result = tf.run(
        "submit", "--follow", "--python", sys.executable, str(EXAMPLES / "mnist_fit.py"),
        "--epochs", "2", "--examples", "2000", "--synthetic", "--model", "cnn",
        timeout=600,
    )  # fmt: skip
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert result.stdout.count("val_accuracy") == 2
    points = json.loads(tf.ok("checkpoints", "--json", "1"))["checkpoints"]
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
