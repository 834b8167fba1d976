"""The training side (tfrun.jobs) with real TensorFlow on the CPU, under a real daemon: killed with
SIGKILL in the middle of training, a job restarted by `--max-restarts` resumes from its last checkpoint
with the weights it saved, and ends after as many steps as a run that was never interrupted.

Keras 3 runs with the TensorFlow of the test environment. Keras 2 runs with tensorflow-cpu 2.15, the
closest to the container's TF 2.9 that installs here, from the interpreter in TFRUN_KERAS2_PYTHON or
.venv-keras2/ (which .ci/run makes); without one those cases are skipped, saying so.
"""

from __future__ import annotations

import json
import os
import re
import signal
import sys
from pathlib import Path

import pytest
from harness import Tfrun, wait_for
from harness.paths import REPO

pytestmark = [pytest.mark.slow]

RESUMABLE = Path(__file__).resolve().parent / "data" / "resumable.py"


def _keras2_python() -> str | None:
    candidate = os.environ.get("TFRUN_KERAS2_PYTHON") or str(REPO / ".venv-keras2" / "bin" / "python")
    return candidate if os.access(candidate, os.X_OK) else None


def _keras3_python() -> str | None:
    try:
        import tensorflow  # noqa: F401
    except ImportError:
        return None
    return sys.executable


PYTHONS = [
    pytest.param(_keras3_python, id="keras3"),
    pytest.param(_keras2_python, id="keras2-tf2.15"),
]


def _python(which: object) -> str:
    assert callable(which)
    python = which()
    if python is None:
        pytest.skip("no such TensorFlow here: .ci/run makes .venv-keras2 (tensorflow-cpu 2.15) and installs TF 3")
    return str(python)


def _lines(log: str, word: str) -> list[dict[str, str]]:
    """The `word step S epoch E digest D`-style lines of the job's log, as dicts."""
    found = []
    for line in log.splitlines():
        if line.startswith(word + " "):
            parts = line.split()[1:]
            found.append(dict(zip(parts[::2], parts[1::2])))
    return found


@pytest.mark.parametrize("which", PYTHONS)
@pytest.mark.parametrize(("mode", "hang_at"), [("fit", 60), ("loop", 49)])
def test_a_job_killed_mid_training_resumes_from_its_checkpoint(
    tf: Tfrun, project: Path, which: object, mode: str, hang_at: int
) -> None:
    python = _python(which)
    (project / "resumable.py").write_bytes(RESUMABLE.read_bytes())
    first = int(
        tf.ok("submit", "--max-restarts", "1", "--python", python, str(project / "resumable.py"), mode, "5", "20",
              str(hang_at)).strip()
    )  # fmt: skip
    wait_for(lambda: b"hanging" in tf.log(first), timeout=240, what="the job to save and hang")
    os.kill(tf.job(first)["pid"], signal.SIGKILL)
    assert tf.run("wait", str(first), timeout=300).returncode == 0, "the restart carried on and succeeded"

    killed, second = tf.job(first), tf.job(str(tf.job(first)["restarted_as"]))
    assert (killed["state"], killed["exit_code"], killed["restarts_left"]) == ("failed", 137, 1)
    assert (second["restart_of"], second["state"], second["restarts_left"]) == (first, "succeeded", 0)
    assert second["checkpoint_dir"] == killed["checkpoint_dir"]

    saved_before = _lines(tf.log(first).decode(), "saved")[-1]
    (start,) = _lines(tf.log(second["id"]).decode(), "start")
    assert int(start["step"]) == int(saved_before["step"]) >= hang_at > 0
    assert start == saved_before, "the restarted job began with exactly the weights and counters last saved"
    assert int(start["epoch"]) == (3 if mode == "fit" else 2)
    (done,) = _lines(tf.log(second["id"]).decode(), "done")
    assert done == {"step": "100", "iterations": "100"}, "as many steps as a run never interrupted: 5 x 20"


@pytest.mark.tensorflow
@pytest.mark.parametrize("which", PYTHONS)
def test_the_callback_writes_exact_metrics_and_stops_on_nan(tf: Tfrun, project: Path, which: object) -> None:
    python = _python(which)
    (project / "nan.py").write_text(
        "import numpy as np, tensorflow as tf\n"
        "from tfrun.jobs import TfrunCallback\n"
        "x = np.ones((64, 2), 'float32'); y = np.ones((64, 1), 'float32')\n"
        "model = tf.keras.Sequential([tf.keras.Input((2,)), tf.keras.layers.Dense(1)])\n"
        "model.compile(optimizer=tf.keras.optimizers.SGD(1e30), loss='mse')\n"  # diverges within a few steps
        "model.fit(x, y, batch_size=8, epochs=50, verbose=0, callbacks=[TfrunCallback()])\n"
        "print('fit returned')\n"
    )
    job = int(tf.ok("submit", "--python", python, str(project / "nan.py")).strip())
    assert tf.run("wait", str(job), timeout=300).returncode == 0
    log = tf.log(job).decode()
    assert re.search(r"tfrun: loss is (nan|inf) at step \d+: stopping", log) and "fit returned" in log
    records = [json.loads(line) for line in (tf.job_dir(job) / "metrics.jsonl").read_text().splitlines()]
    steps = [r["step"] for r in records if "loss" in r]
    assert steps == list(range(1, len(steps) + 1)) and len(steps) < 50 * 8, "one line a step, stopped early"
    last = [r["loss"] for r in records if "loss" in r][-1]
    assert not last < float("inf"), "the last loss recorded is the NaN (or inf) that stopped training"


@pytest.mark.tensorflow
@pytest.mark.parametrize("which", PYTHONS)
def test_steps_are_counted_right_when_keras_runs_several_per_call(tf: Tfrun, project: Path, which: object) -> None:
    """With steps_per_execution=4 Keras calls the callback every 4 steps: the step count still ends at
    epochs x steps, and a checkpoint every 10 steps is taken at the first call past each multiple."""
    python = _python(which)
    (project / "spe.py").write_text(
        "import numpy as np, tensorflow as tf\n"
        "from tfrun.jobs import Checkpoints, TfrunCallback\n"
        "x = np.random.rand(160, 3).astype('float32'); y = x.sum(axis=1, keepdims=True)\n"
        "model = tf.keras.Sequential([tf.keras.Input((3,)), tf.keras.layers.Dense(1)])\n"
        "model.compile(optimizer='sgd', loss='mse', steps_per_execution=4)\n"
        "checkpoints = Checkpoints(model=model, optimizer=model.optimizer)\n"
        "model.fit(x, y, batch_size=8, epochs=2, verbose=0,\n"
        "          callbacks=[TfrunCallback(checkpoints, save_every_epochs=0, save_every_steps=10)])\n"
        "print('iterations', int(model.optimizer.iterations.numpy()))\n"
    )
    job = int(tf.ok("submit", "--python", python, str(project / "spe.py")).strip())
    assert tf.run("wait", str(job), timeout=300).returncode == 0, tf.log(job).decode()[-2000:]
    steps = [json.loads(line)["step"] for line in (tf.job_dir(job) / "metrics.jsonl").read_text().splitlines()]
    assert steps == list(range(4, 41, 4)), "one record per call, counted in steps: 2 epochs x 20 steps"
    assert "iterations 40" in tf.log(job).decode()
    saved = [point["step"] for point in json.loads(tf.ok("checkpoints", "--json", str(job)))["checkpoints"]]
    assert saved == [20, 32, 40], "saved at 12, 20, 32 and 40; the last 3 kept"
