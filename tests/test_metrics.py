"""Metrics read from raw job output (runner/metrics/) and loss spikes (runner/alerts/spikes.py), on real output.

tests/data/keras{2,3}_fit.log come from tests/data/keras_fit.py; tests/data/curves/*.jsonl and
tests/data/keras3_spike.log from tests/data/make_curves.py; the short Keras snippets below are cut from real
`model.fit` runs under TF 2.15 and 2.21, written to a file as tfrun does. tests/data/real/ holds the output of
published training scripts run on synthetic data, each made by the script beside it (its docstring says how), with
the losses the script computed in a sidecar `*.truth.json`.
"""

from __future__ import annotations

import json
import math
import re
import statistics
from pathlib import Path
from typing import Any, Optional

import pytest

from tfrun.runner.alerts.spikes import DEFAULT_WINDOW, Spike, SpikeDetector
from tfrun.runner.metrics import MAX_SEGMENT, LogMetrics, PatternError, Sample, training_loss
from tfrun.runner.metrics.explain import explain

DATA = Path(__file__).parent / "data"
REAL = DATA / "real"
RECOVERED_SHARE = 0.95  # issue #16: at least this share of the printed training losses read, at their step
KERAS_LOGS = ["keras2_fit.log", "keras3_fit.log", "keras3_spike.log"]
LOG_SPIKE_AT = 113  # make_curves.py: the learning rate of keras3_spike.log is bumped before this global step

# verbose=2: one line an epoch (TF 2.15, then TF 2.21).
KERAS2_VERBOSE2 = (
    b"Epoch 1/2\n5/5 - 1s - loss: 0.7556 - accuracy: 0.3611 - val_loss: 0.7542 - val_accuracy: 0.5000 - 969ms/epoch"
    b" - 194ms/step\nEpoch 2/2\n5/5 - 0s - loss: 0.7472 - accuracy: 0.3056 - val_loss: 0.7521 - val_accuracy: 0.5000"
    b" - 39ms/epoch - 8ms/step\n"
)
KERAS3_VERBOSE2 = (
    b"Epoch 1/2\n5/5 - 2s - 373ms/step - accuracy: 0.3611 - loss: 0.7556 - val_accuracy: 0.5000 - val_loss: 0.7542\n"
    b"Epoch 2/2\n5/5 - 0s - 26ms/step - accuracy: 0.3333 - loss: 0.7467 - val_accuracy: 0.5000 - val_loss: 0.7523\n"
)
# A dataset of unknown size (TF 2.15): `N/Unknown` through the first epoch, then Keras knows there are 6.
KERAS2_UNKNOWN = b"".join(
    [
        b"Epoch 1/2\n",
        *(
            b"\r      %d/Unknown - 0s %dms/step - loss: %s - accuracy: %s" % redraw + b"\b" * 64
            for redraw in [
                (1, 74, b"0.7405", b"0.3750"),
                (2, 67, b"0.7032", b"0.4375"),
                (3, 67, b"0.7175", b"0.3750"),
                (4, 66, b"0.7305", b"0.3438"),
                (5, 66, b"0.7448", b"0.3500"),
                (6, 66, b"0.7424", b"0.3750"),
            ]
        ),
        b"\r6/6 [==============================] - 0s 72ms/step - loss: 0.7424 - accuracy: 0.3750\n",
        b"Epoch 2/2\n",
        b"\r1/6 [====>.........................] - ETA: 0s - loss: 0.7339 - accuracy: 0.3750" + b"\b" * 80,
        b"\r2/6 [=========>....................] - ETA: 0s - loss: 0.6985 - accuracy: 0.4375" + b"\b" * 80,
    ]
)
# The same in TF 2.21, where Keras's warning on stderr lands in the middle of the progress bar's line.
BAR3 = b"\x1b[32m" + "\u2501".encode() * 20 + b"\x1b[0m\x1b[37m\x1b[0m"
KERAS3_UNKNOWN = b"".join(
    [
        b"Epoch 1/2\n",
        b"\r      5/Unknown \x1b[1m0s\x1b[0m 65ms/step - accuracy: 0.3500 - loss: 0.7445",
        b"\b" * 62,
        b"\r      6/Unknown \x1b[1m0s\x1b[0m 65ms/step - accuracy: 0.3750 - loss: 0.7420",
        b"/work/main/.venv/lib/python3.11/site-packages/keras/src/trainers/epoch_iterator.py:164: UserWarning: Your "
        b"input ran out of data; interrupting training. Make sure that your dataset or generator can generate at "
        b"least `steps_per_epoch * epochs` batches. You may need to use the `.repeat()` function when building "
        b"your dataset.\n  self._interrupted_warning()\n",
        b"\b" * 62,
        b"\r\x1b[1m6/6\x1b[0m " + BAR3 + b" \x1b[1m0s\x1b[0m 66ms/step - accuracy: 0.3750 - loss: 0.7420\n",
        b"Epoch 2/2\n",
        b"\r\x1b[1m1/6\x1b[0m " + BAR3 + b" \x1b[1m1s\x1b[0m 292ms/step - accuracy: 0.3750 - loss: 0.7329",
        b"\b" * 72,
        b"\r\x1b[1m2/6\x1b[0m " + BAR3 + b" \x1b[1m0s\x1b[0m 64ms/step - accuracy: 0.4375 - loss: 0.6979 ",
        b"\b" * 71,
    ]
)
# PyTorch Lightning's tqdm bar, redrawn with \r, and reset (not ended) for the next epoch.
LIGHTNING = (
    "Epoch 0:   0%|          | 0/4 [00:00<?, ?it/s]"
    "\rEpoch 0:  25%|██▌       | 1/4 [00:00<00:00, 24.10it/s]"
    "\rEpoch 0:  25%|██▌       | 1/4 [00:00<00:00, 24.10it/s, v_num=0, train_loss_step=2.310]"
    "\rEpoch 0:  50%|█████     | 2/4 [00:00<00:00, 30.51it/s, v_num=0, train_loss_step=2.150]"
    "\rEpoch 0:  50%|█████     | 2/4 [00:00<00:00, 30.51it/s, v_num=0, train_loss_step=2.150]"
    "\rEpoch 0: 100%|██████████| 4/4 [00:00<00:00, 33.33it/s, v_num=0, train_loss_step=1.900]"
    "\rEpoch 0: 100%|██████████| 4/4 [00:00<00:00, 33.33it/s, v_num=0, train_loss_step=1.900, train_loss_epoch=2.080]"
    "\rEpoch 1:  25%|██▌       | 1/4 [00:00<00:00, 29.80it/s, v_num=0, train_loss_step=1.7e+00, train_loss_epoch=2.080]"
    "\rEpoch 1:  75%|███████▌  | 3/4 [00:00<00:00, 31.02it/s, v_num=0, train_loss_step=nan, train_loss_epoch=2.080]\r"
).encode()
# Lightning's redraws of one step, the first still with the previous step's loss (the bar's format as in
# LIGHTNING; the values nan.0 and inf.0 are how Lightning's postfix prints a NaN and an Inf).
LIGHTNING_NAN_REDRAWS = [
    "\rEpoch 1:  100%|██████████| 4/4 [00:00<00:00, 31.02it/s, v_num=0, train_loss=0.705]",
    "\rEpoch 2:  0%|          | 0/4 [00:00<00:00, 31.02it/s, v_num=0, train_loss=0.705]",
    "\rEpoch 2:  0%|          | 0/4 [00:00<00:00, 31.02it/s, v_num=0, train_loss=0.712]",
    "\rEpoch 2:  25%|██▌       | 1/4 [00:00<00:00, 31.02it/s, v_num=0, train_loss=0.712]",
    "\rEpoch 2:  25%|██▌       | 1/4 [00:00<00:00, 31.02it/s, v_num=0, train_loss=nan.0]",
    "\rEpoch 2:  50%|█████     | 2/4 [00:00<00:00, 31.02it/s, v_num=0, train_loss=inf.0]",
]


def feed_in_pieces(data: bytes, size: int, metrics: Optional[LogMetrics] = None) -> list[Sample]:
    metrics = metrics if metrics is not None else LogMetrics()
    samples = []
    for start in range(0, len(data), size):
        samples += metrics.feed(data[start : start + size])
    return samples


def samples_of(data: bytes, patterns: tuple[str, ...] = ()) -> list[Sample]:
    return LogMetrics(patterns).feed(data)


def brief(samples: list[Sample]) -> list[tuple[int, dict[str, float], Any, str]]:
    return [(sample.step, sample.values, sample.epoch, sample.source) for sample in samples]


def printed_redraws(log: bytes) -> list[tuple[int, int, float, bool]]:
    """(epoch, batch, printed running-mean loss, ends the epoch) for each redraw of each fit epoch, read here
    with a regex of this test's own, so that the decoding is checked against the log and not against itself."""
    text = re.sub(rb"\x1b\[[0-9;]*m", b"", log).decode("utf-8", "replace")
    redraws = []
    epoch = 0
    for line in text.split("\n"):
        header = re.fullmatch(r"Epoch (\d+)/\d+", line)
        if header:
            epoch = int(header.group(1))
            continue
        for part in re.split(r"[\r\b]+", line):
            bar = re.match(r"\s*(\d+)/(\d+) .* - loss: ([\d.]+)", part)
            if bar and epoch and "val_loss" not in part:
                redraws.append((epoch, int(bar.group(1)), float(bar.group(3)), False))
            elif bar and epoch:
                redraws.append((epoch, int(bar.group(1)), float(bar.group(3)), True))
                epoch = 0  # what follows until the next header is model.evaluate
    return redraws


def curve(name: str) -> tuple[dict[str, Any], list[tuple[int, float]]]:
    lines = (DATA / "curves" / f"{name}.jsonl").read_text().splitlines()
    rows = [json.loads(line) for line in lines[1:]]
    return json.loads(lines[0]), [(row["step"], row["loss"]) for row in rows]


def spikes_of(losses: list[tuple[int, float]], detector: Optional[SpikeDetector] = None) -> list[Spike]:
    detector = detector if detector is not None else SpikeDetector()
    return [spike for step, loss in losses for spike in [detector.add(step, loss)] if spike is not None]


# LogMetrics: Keras


@pytest.mark.parametrize("name", KERAS_LOGS)
def test_keras_logs_give_the_same_samples_in_any_pieces(name: str) -> None:
    log = (DATA / name).read_bytes()
    whole = samples_of(log)
    assert len(whole) > 25
    for size in (1, 97, 4096):
        assert feed_in_pieces(log, size) == whole


@pytest.mark.parametrize("name", KERAS_LOGS)
def test_keras_interval_means_reproduce_every_printed_running_mean(name: str) -> None:
    log = (DATA / name).read_bytes()
    training = [sample for sample in samples_of(log) if "loss" in sample.values]
    redraws = [redraw for redraw in printed_redraws(log) if not redraw[3]]  # the last line repeats the last redraw
    assert len(training) == len(redraws)
    current, previous, total = 0, 0, 0.0
    for sample, (epoch, batch, printed, _) in zip(training, redraws):
        if epoch != current:
            current, previous, total = epoch, 0, 0.0
        total += sample.values["loss"] * (batch - previous)
        previous = batch
        assert sample.epoch == epoch
        # The weighted mean of the decoded intervals since the epoch began is the running mean Keras printed.
        assert total / batch == pytest.approx(printed, abs=1e-9)


@pytest.mark.parametrize("name", ["keras2_fit.log", "keras3_fit.log"])
def test_keras_steps_epochs_and_validation(name: str) -> None:
    log = (DATA / name).read_bytes()
    samples = samples_of(log)
    training = [sample for sample in samples if "loss" in sample.values]
    assert [sample.step for sample in training] == list(range(1, 28))  # 3 epochs of 9, each batch redrawn
    assert [sample.epoch for sample in training] == [1] * 9 + [2] * 9 + [3] * 9
    for sample in training:  # per-batch binary cross-entropy and accuracy of batches of 8, up to Keras's rounding
        assert 0.4 < sample.values["loss"] < 1.0
        assert -0.01 < sample.values["accuracy"] < 1.01
    ends = [sample for sample in samples if "val_loss" in sample.values]
    assert [(sample.step, sample.epoch) for sample in ends] == [(9, 1), (18, 2), (27, 3)]
    finals = [redraw for redraw in printed_redraws(log) if redraw[3]]
    assert len(finals) == 3
    for end, (_, batch, printed, _) in zip(ends, finals):
        assert set(end.values) == {"val_loss", "val_accuracy"}
        assert 0.6 < end.values["val_loss"] < 0.7
        epoch = [sample.values["loss"] for sample in training if sample.epoch == end.epoch]
        assert batch == len(epoch) == 9
        assert statistics.fmean(epoch) == pytest.approx(printed, abs=1e-9)  # the epoch's loss, as printed
    assert samples[-1] is ends[-1]  # model.evaluate's bar after the last epoch is not training


def test_keras_epoch_boundaries_and_global_steps_on_a_longer_run() -> None:
    samples = samples_of((DATA / "keras3_spike.log").read_bytes())
    training = [sample for sample in samples if "loss" in sample.values]
    steps = [sample.step for sample in training]
    assert steps == sorted(set(steps)) and steps[-1] == 150  # 6 epochs of 25 batches
    assert [sample.step for sample in samples if "val_loss" in sample.values] == [25, 50, 75, 100, 125, 150]
    # The printed running mean hides the jump that the decoded interval shows: batch 14 of epoch 5.
    jump = next(sample for sample in training if sample.step == LOG_SPIKE_AT + 1)
    assert jump.epoch == 5 and jump.values["loss"] > 15  # Keras printed 1.6127, the mean of 14 batches


@pytest.mark.parametrize("name", ["keras3_fit.log", "keras3_spike.log", "real/keras3_low_loss.log"])
def test_recovered_keras_losses_are_never_negative(name: str) -> None:
    """Working 4-digit running means back leaves errors of up to 0.0001 * (b1 + b2) / (b2 - b1): on the real
    low-loss run (the loss falls to 0.0059, 160 batches an epoch) 59 of 640 decoded batches came out negative."""
    log = (DATA / name).read_bytes()
    losses = [sample.values["loss"] for sample in samples_of(log) if "loss" in sample.values]
    assert len(losses) >= 27 and min(losses) >= 0
    if name.startswith("real/"):  # one loss a printed redraw (keras3_low_loss.truth.json lists each)
        printed = json.loads((REAL / "keras3_low_loss.truth.json").read_text())["printed"]
        assert len(losses) == len(printed) == 640 and min(losses) == 0.0 and statistics.median(losses) < 0.02


@pytest.mark.parametrize("log", [KERAS2_VERBOSE2, KERAS3_VERBOSE2], ids=["keras2", "keras3"])
def test_keras_verbose_2_gives_one_sample_an_epoch(log: bytes) -> None:
    samples = samples_of(log)
    assert [(sample.step, sample.epoch) for sample in samples] == [(5, 1), (10, 2)]
    assert samples[0].values["loss"] == 0.7556 and samples[0].values["val_loss"] == 0.7542
    assert samples[0].values["accuracy"] == 0.3611 and samples[0].values["val_accuracy"] == 0.5
    assert set(samples[1].values) == {"loss", "accuracy", "val_loss", "val_accuracy"}


def test_keras_unknown_dataset_size() -> None:
    samples = samples_of(KERAS2_UNKNOWN)
    assert [sample.step for sample in samples] == [1, 2, 3, 4, 5, 6, 7, 8]
    assert samples[1].values["loss"] == pytest.approx(2 * 0.7032 - 0.7405)
    assert samples[5].values["loss"] == pytest.approx(6 * 0.7424 - 5 * 0.7448)
    assert samples[6].values == {"loss": 0.7339, "accuracy": 0.375}  # a new epoch: its first batch as printed
    assert [sample.epoch for sample in samples] == [1] * 6 + [2] * 2


def test_keras_bar_interrupted_by_a_warning_on_stderr() -> None:
    samples = samples_of(KERAS3_UNKNOWN)
    assert [(sample.step, sample.epoch) for sample in samples] == [(5, 1), (6, 1), (7, 2), (8, 2)]
    assert samples[1].values["loss"] == pytest.approx(6 * 0.7420 - 5 * 0.7445)  # `0.7420/work/...` still read
    assert samples[3].values["loss"] == pytest.approx(2 * 0.6979 - 0.7329)


# LogMetrics: Lightning, plain prints, numbers


def test_lightning_bar() -> None:
    # Issue #16: one sample a step, its last redraw (this test expected two samples at step 4 before).
    samples = samples_of(LIGHTNING)
    assert [(sample.step, sample.epoch, sample.source) for sample in samples] == [
        (1, 0, "lightning"),
        (2, 0, "lightning"),
        (4, 0, "lightning"),
        (5, 1, "lightning"),
    ]
    assert samples[0].values == {"train_loss_step": 2.31}  # v_num is the run's version, not a metric
    assert samples[2].values == {"train_loss_step": 1.9, "train_loss_epoch": 2.08}  # with the epoch's mean
    assert samples[3].values["train_loss_step"] == 1.7
    # Step 7 is taken once the bar draws another step (or ends its line): its redraws may not be over.
    (nan,) = samples_of(LIGHTNING + LIGHTNING_NAN_REDRAWS[0].encode() + b"\r")[4:]
    assert nan.step == 7 and math.isnan(nan.values["train_loss_step"])


def test_lightning_keeps_the_last_redraw_of_each_step_and_reads_nan_0() -> None:
    """Lightning draws each step twice, first with the previous step's loss; and prints NaN as `nan.0`. A new
    epoch's bar at 0 still shows the last epoch's loss (tests/data/real/lightning_tqdm.log): no step of its own."""
    data = "".join(LIGHTNING_NAN_REDRAWS).encode() + b"\n"
    samples = samples_of(data)
    assert [sample.step for sample in samples] == [8, 9, 10]
    assert samples[0].values["train_loss"] == 0.705  # epoch 1's 4/4, not the 0/4 redraws of epoch 2
    assert math.isnan(samples[1].values["train_loss"]) and math.isinf(samples[2].values["train_loss"])
    for size in (1, 7, 50):
        assert repr(feed_in_pieces(data, size)) == repr(samples)


def test_a_lightning_bar_drawn_again_after_validation_gives_its_step_once() -> None:
    """Each validation opens its bar under the training bar (a newline ends the training bar's line, or a line
    not its own follows a rich bar), and Lightning draws the training bar again at the same step after it, with
    the val_loss (tests/data/real/lightning_tqdm.log, lightning_rich_terminal.log): one sample of that step, as
    its line ended, wherever the chunks are cut."""
    bar = "\rEpoch {}: {:3d}%|#####     | {}/2 [00:01<00:00,  2.00it/s, v_num=0, train_loss={}{}]"
    tqdm = (
        bar.format(0, 50, 1, "5.70", "") + bar.format(0, 100, 2, "5.70", "") + bar.format(0, 100, 2, "5.60", "") + "\n"
        "\rValidation DataLoader 0: 100%|##########| 2/2 [00:00<00:00,  5.05it/s]\x1b[A\n\r          \x1b[A"
        + bar.format(0, 100, 2, "5.60", ", val_loss=5.50")
        + bar.format(1, 50, 1, "5.40", ", val_loss=5.50")
        + "\n"
    ).encode()
    rich_bar = (
        "\x1b[2KEpoch {}/1  \u2501\u2501\u2578 {}/2 0:00:01 \u2022 0:00:01 2.00it/s v_num: 0.000\n  train_loss: {}{}\r"
    )
    rich = (
        rich_bar.format(0, 1, "5.70", "")
        + rich_bar.format(0, 2, "5.60", "")
        + "Validation \u2501\u2501\u2578 1/2 0:00:00 \u2022 -:--:-- 0.00it/s\r"
        + rich_bar.format(0, 2, "5.60", "\n  val_loss: 5.50")
        + rich_bar.format(1, 1, "5.40", "\n  val_loss: 5.50")
        + rich_bar.format(1, 2, "5.30", "\n  val_loss: 5.50")  # step 3 is taken once the bar draws step 4
    ).encode()
    for data, steps in ((tqdm, [1, 2, 3]), (rich, [1, 2, 3])):
        for size in (1, 7, len(data)):
            samples = feed_in_pieces(data, size)
            assert [s.step for s in samples] == steps, (size, samples)
            assert [s.values["train_loss"] for s in samples] == [5.7, 5.6, 5.4]


def test_lightning_bar_without_a_total() -> None:
    bar = "\rEpoch {}: |          | {}/? [00:00<00:00, 30.00it/s, v_num=3, loss={}]"
    data = "".join(bar.format(epoch, batch, loss) for epoch, batch, loss in [(0, 2, 1.5), (0, 3, 1.4), (1, 1, 1.2)])
    samples = samples_of((data + "\n").encode())  # the last step is taken where the bar's line ends
    assert [(sample.step, sample.values["loss"]) for sample in samples] == [(2, 1.5), (3, 1.4), (4, 1.2)]


@pytest.mark.parametrize(
    ("line", "step", "values", "epoch"),
    [
        (b"Epoch 1, Avg Loss: 0.2345", 1, {"avg_loss": 0.2345}, 1),
        (b"step 100 loss=1.23", 100, {"loss": 1.23}, None),
        (b"Step 100: loss = 1.23, lr=0.001", 100, {"loss": 1.23, "lr": 0.001}, None),
        (b"iter 100 | loss 1.2300", 100, {"loss": 1.23}, None),
        (b"[epoch 3] train loss: 0.123", 1, {"train_loss": 0.123}, 3),
        (b"Epoch [2/10], Step [100/600], Loss: 0.2000", 100, {"loss": 0.2}, 2),
        (
            b"global_step=5000 val_loss=0.31 loss=0.25 acc=0.93",
            5000,
            {"val_loss": 0.31, "loss": 0.25, "acc": 0.93},
            None,
        ),
        (
            b"batch 7/50 - Training Loss: 1e-3 - Val Accuracy: 1.2E+02",
            7,
            {"training_loss": 0.001, "val_accuracy": 120.0},
            None,
        ),
        (b"step 3 loss=-inf", 3, {"loss": -math.inf}, None),
        (b"step 3 loss=inf", 3, {"loss": math.inf}, None),
        (b"step 3 loss=Infinity", 3, {"loss": math.inf}, None),
        (b"step 3 loss=inf.0", 3, {"loss": math.inf}, None),
        (b"step 9 loss=.5 lr=2.", 9, {"loss": 0.5, "lr": 2.0}, None),
        # Printed by TF 2.21 and NumPy 2 (.venv): print("step", 5, "loss", tf.constant(0.23)), and
        # print({"loss": np.float32(0.23), "step": 5}); json.dumps() of a dict, as JSON-lines loggers write.
        (b"step 5 loss tf.Tensor(0.23, shape=(), dtype=float32)", 5, {"loss": 0.23}, None),
        (b"{'loss': np.float32(0.23), 'step': 5}", 5, {"loss": 0.23}, None),
        (b'{"step": 7, "loss": 0.25, "lr": 0.001}', 7, {"loss": 0.25, "lr": 0.001}, None),
        # PyTorch's repr of a 0-d tensor (torch/_tensor_str.py), as print(f"... loss: {loss}") shows it.
        (b"epoch 1 step 30 loss: tensor(0.2300, grad_fn=<NllLossBackward0>)", 30, {"loss": 0.23}, 1),
        (b"iter 40: loss tensor(0.2300)", 40, {"loss": 0.23}, None),
        # Logging-style and hand-written loops not in the corpus: a logger's `name/metric` keys, a rate's unit
        # before the loss (`samples/sec loss=`), word_language_model's count before its name.
        (b"{'train/loss': 0.23, 'train/global_step': 100}", 100, {"train/loss": 0.23}, None),
        (b"INFO:root:Epoch[0] Batch [100] Speed: 1000 samples/sec loss=0.52", 100, {"loss": 0.52}, 0),
        (
            b"| epoch   1 |   200/ 2983 batches | lr 20.00 | ms/batch 45.12 | loss  7.63",
            200,
            {"lr": 20.0, "loss": 7.63},
            1,
        ),
        (b"2026-12-01 10:00:00,123 INFO train step=100 loss=0.43", 100, {"loss": 0.43}, None),
        # keras-io's "Writing a training loop from scratch" (its print format strings; see tests/data/real/).
        (b"Training loss (for 1 batch) at step 100: 0.4312", 100, {"training_loss": 0.4312}, None),
        (b"discriminator loss at step 0: 0.68", 0, {"discriminator_loss": 0.68}, None),
        (b"adversarial loss at step 0: 0.69", 0, {"adversarial_loss": 0.69}, None),
        # pytorch/examples mnist/main.py: 'Train Epoch: {} [{}/{} ({:.0f}%)]\tLoss: {:.6f}', counted in samples.
        (b"Train Epoch: 1 [22400/60000 (37%)]\tLoss: 0.230000", 22400, {"loss": 0.23}, 1),
    ],
)
def test_plain_prints(line: bytes, step: int, values: dict[str, float], epoch: Optional[int]) -> None:
    samples = samples_of(line + b"\n")
    assert brief(samples) == [(step, values, epoch, "print")]


def test_tqdm_bars_give_one_sample_a_step_at_their_count() -> None:
    """tqdm redraws a step as often as set_postfix or set_description asks (the first time before the step's
    loss is known): one sample a step, its last redraw; a bar that starts again is the next epoch's."""
    bar = "\r{:3d}%|#####     | {}/4 [00:01<00:00, 40.00it/s, loss={}, lr=0.001]"
    redraws = [(1, "0.90"), (1, "0.80"), (2, "0.80"), (2, "0.70"), (4, "0.60"), (1, "0.50"), (2, "nan")]
    data = "".join(bar.format(25 * n, n, loss) for n, loss in redraws).encode() + b"\n"
    samples = samples_of(data)
    assert [(s.step, s.printed_step, s.values["loss"]) for s in samples[:4]] == [
        (1, 1, 0.8),
        (2, 2, 0.7),
        (4, 4, 0.6),
        (5, 1, 0.5),
    ]
    assert samples[4].step == 6 and math.isnan(samples[4].values["loss"])
    assert {s.source for s in samples} == {"bar"} and samples[0].values["lr"] == 0.001
    described = samples_of(b"\rloss 0.2300:  45%|####5     | 45/100 [00:01<00:02, 25.0it/s]\n")
    assert [(s.step, s.values) for s in described] == [(45, {"loss": 0.23})]
    assert samples_of(b"\r 45%|####5     | 45/100 [00:01<00:02, 25.0it/s]\n") == []  # no metric


def test_a_print_written_over_a_live_bar_takes_the_count_the_bar_is_redrawn_with() -> None:
    """Hugging Face's Trainer (tests/data/real/hf_trainer.log): tqdm.write clears the bar, prints the dict, and
    redraws the bar at the step the dict belongs to. A bar that ended its line (a data-loading bar) is no step
    of the prints after it: those are counted."""
    bar = "\r{:3d}%|#         | {}/75 [00:00<00:34,  2.12it/s]"
    live = "".join(
        bar.format(n, n)
        + "\r"
        + " " * 46
        + "\r"
        + f"{{'loss': '{3.7 - n / 10:.3g}', 'grad_norm': '1.8'}}\n"
        + bar.format(n, n)
        for n in (1, 2, 3)
    )
    samples = samples_of(live.encode() + b"\n")  # the bar closes its line
    assert [(s.step, s.values["loss"]) for s in samples] == [(1, 3.6), (2, 3.5), (3, 3.4)]
    loading = "\rMap: 100%|##########| 1000/1000 [00:00<00:00, 5000 examples/s]\n"
    printed = samples_of((loading + "Epoch 1, loss 0.5\nEpoch 2, loss 0.4\n").encode())
    assert [(s.step, s.epoch) for s in printed] == [(1, 1), (2, 2)]


@pytest.mark.parametrize("text", [b"nan", b"NaN", b"NAN", b"nan.0", b"tensor(nan, grad_fn=<NllLossBackward0>)"])
def test_nan_is_a_value(text: bytes) -> None:
    (sample,) = samples_of(b"step 12 loss: " + text + b"\n")
    assert sample.step == 12 and math.isnan(sample.values["loss"])


def test_plain_print_steps_that_restart_each_epoch_become_global() -> None:
    lines = [b"Epoch [%d/2], Step [%d/600], Loss: 0.5\n" % (epoch, step) for epoch in (1, 2) for step in (300, 600)]
    assert [sample.step for sample in samples_of(b"".join(lines))] == [300, 600, 900, 1200]
    counted = samples_of(b"Epoch 1, Avg Loss: 0.9\nEpoch 2, Avg Loss: 0.7\nEpoch 3, Avg Loss: 0.6\n")
    assert [(sample.step, sample.epoch) for sample in counted] == [(1, 1), (2, 2), (3, 3)]
    after = samples_of(b"step 40 loss=0.5\nepoch 1 done, mean loss: 0.6\n")
    assert [(sample.step, sample.values) for sample in after] == [(40, {"loss": 0.5}), (40, {"mean_loss": 0.6})]


def test_evaluation_lines_are_named_so_and_placed_at_the_last_training_step() -> None:
    """pytorch/examples mnist/main.py's train() and test() prints (their format strings), then a post-training
    `Test loss: ...`: evaluation is never training_loss(), and lands where training got to, not at step 1."""
    log = (
        b"Train Epoch: 1 [0/60000 (0%)]\tLoss: 2.300000\n"
        b"Train Epoch: 1 [59520/60000 (99%)]\tLoss: 0.300000\n"
        b"\nTest set: Average loss: 0.2475, Accuracy: 9213/10000 (92%)\n\n"
        b"Train Epoch: 2 [0/60000 (0%)]\tLoss: 0.250000\n"
        b"Validation loss: 0.2400\n"
        b"Test loss: 0.31\n"
    )
    assert [(sample.step, sample.values) for sample in samples_of(log)] == [
        (0, {"loss": 2.3}),
        (59520, {"loss": 0.3}),
        (59520, {"test_loss": 0.2475}),  # `Accuracy: 9213/10000` is a count, not a value
        (60000, {"loss": 0.25}),  # the samples of epoch 1 come before
        (60000, {"val_loss": 0.24}),
        (60000, {"test_loss": 0.31}),
    ]
    assert [training_loss(sample.values) for sample in samples_of(log)] == [2.3, 0.3, None, 0.25, None, None]
    # nanoGPT's eval print names both: the line is training's and evaluation's at once.
    (both,) = samples_of(b"step 500: train loss 2.1000, val loss 2.2000\n")
    assert (both.step, both.values, training_loss(both.values)) == (500, {"train_loss": 2.1, "val_loss": 2.2}, 2.1)


# Issue 29: every metric at the step training had reached, once. Cut from tests/data/real/hf_trainer_eval.log:
# Trainer's bar (101 steps an epoch) drawn at 99, ended by the evaluation's bar opening under it; the eval dict;
# the log of step 102 written before the bar is drawn again (tqdm draws it at most every 0.1 s).
TRAINER_AFTER_EVAL = (
    b"\r 33%|###3      | 99/303 [00:00<00:01, 135.83it/s]\n\r  0%|          | 0/25 [00:00<?, ?it/s]\x1b[A"
    b"\r                                                 \r\n\r                                      \r\x1b[A"
    b"{'eval_loss': '1.897', 'eval_runtime': '0.1007', 'epoch': '1'}\n"
    b"\r 33%|###3      | 101/303 [00:00<00:01, 135.83it/s]\n\r100%|##########| 25/25 [00:00<00:00, 260.16it/s]\x1b[A\n"
    b"\rWriting model shards: 100%|##########| 1/1 [00:00<00:00, 397.15it/s]\n"
    b"/tmp/venv-torch/lib/python3.11/site-packages/torch/utils/data/dataloader.py:759: UserWarning: 'pin_memory'\n"
    b"\r                                                  \r"
    b"{'loss': '1.899', 'grad_norm': '2.993', 'learning_rate': '0.0003333', 'epoch': '1.01'}\n"
    b"\r 34%|###3      | 102/303 [00:00<00:01, 135.83it/s]\r                                                  \r"
    b"{'loss': '1.882', 'grad_norm': '3.349', 'learning_rate': '0.0003284', 'epoch': '1.04'}\n"
    b"\r 34%|###4      | 105/303 [00:00<00:01, 135.83it/s]"
)
# The end of the run: the last bar at 303/303, and the summary of training after its evaluation.
TRAINER_END = (
    b"\r                                                  \r{'loss': '1.06', 'grad_norm': '4.248', 'epoch': '3'}\n"
    b"\r100%|##########| 303/303 [00:02<00:00, 130.79it/s]\n\r  0%|          | 0/25 [00:00<?, ?it/s]\x1b[A\r\n"
    b"{'eval_loss': '1.079', 'eval_runtime': '0.1025', 'epoch': '3'}\n"
    b"\r100%|##########| 303/303 [00:02<00:00, 130.79it/s]\n\r100%|##########| 25/25 [00:00<00:00, 254.78it/s]\x1b[A\n"
    b"\rWriting model shards: 100%|##########| 1/1 [00:00<00:00, 1068.61it/s]\n\r                      \r"
    b"{'train_runtime': '2.617', 'train_steps_per_second': '115.8', 'train_loss': '1.741', 'epoch': '3'}\n"
    b"\r100%|##########| 303/303 [00:02<00:00, 130.79it/s]\r100%|##########| 303/303 [00:02<00:00, 115.76it/s]\n"
)


def test_a_print_after_an_evaluation_takes_the_step_of_the_bar_drawn_after_it() -> None:
    """Trainer's bar, its line ended by the evaluation's bar, is left before its end: the prints written over it
    take the count it is drawn again with (they were counted, 1 and 2, behind step 99); the summary after the bar's
    end goes to the step training reached."""
    for size in (1, 7, len(TRAINER_AFTER_EVAL)):
        samples = feed_in_pieces(TRAINER_AFTER_EVAL + b"\n", size)
        assert [(s.step, training_loss(s.values)) for s in samples] == [(101, None), (102, 1.899), (105, 1.882)]
        assert samples[0].values["eval_loss"] == 1.897
    metrics = LogMetrics()
    metrics.feed(b"\r 99%|#########9| 300/303 [00:02<00:00, 130.79it/s]")
    summary = TRAINER_END.index(b"'epoch': '3'}\n", TRAINER_END.index(b"train_loss")) + 14
    samples = metrics.feed(TRAINER_END[:summary])
    assert metrics.why == "a print with no step: placed at step 303, where training got to"
    samples += metrics.feed(TRAINER_END[summary:])
    assert [(s.step, sorted(s.values)) for s in samples] == [
        (303, ["grad_norm", "loss"]),
        (303, ["eval_loss"]),
        (303, ["train_loss"]),
    ]


def test_a_summary_with_no_step_goes_to_the_step_training_reached() -> None:
    """Ignite's example (tests/data/real/ignite_mnist.log): its bar ends each epoch at 100/100, `Training Results`
    and `Validation Results` are written over it (tqdm.write), and tqdm draws it again at 100 after each: one
    sample of step 100, and the results there (they were counted: steps 1 and 2)."""
    bar = "\rITERATION - loss: {}: {:3d}%|#         | {}/100 [00:00<00:00, 138.27it/s]"
    epoch = "".join(bar.format(loss, n, n) for loss, n in (("2.32", 50), ("2.17", 100))) + "\n"
    written = "".join(
        f"\r          \r{line}\n" + bar.format("2.17", 100, 100)
        for line in (
            "Training Results - Epoch: {} Avg accuracy: 0.43 Avg loss: 2.14",
            "Validation Results - Epoch: {} Avg accuracy: 0.40 Avg loss: 2.15",
            "EPOCH_COMPLETED took 0.73 seconds",
        )
    )
    log = (epoch + written.format(1, 1) + bar.format("2.17", 0, 0) + bar.format("2.05", 15, 15) + "\n").encode()
    for size in (1, 7, len(log)):
        samples = feed_in_pieces(log, size)
        assert [(s.step, s.values) for s in samples] == [
            (50, {"loss": 2.32}),
            (100, {"loss": 2.17}),
            (100, {"avg_accuracy": 0.43, "avg_loss": 2.14}),
            (100, {"val_accuracy": 0.4, "val_loss": 2.15}),
            (115, {"loss": 2.05}),
        ]


def test_an_evaluation_written_over_a_bar_goes_to_the_count_it_is_drawn_again_with() -> None:
    """tests/data/real/tqdm_write_loop.log: the bar drawn at 23, updated to 25 without a draw (tqdm draws at most
    every 0.1 s), an evaluation written over it, the bar drawn at 25 after it: all at step 25, in step order."""
    bar = "\rEpoch 1: {:3d}%|##        | {}/100 [00:01<00:03, 22.81it/s, loss={}]"
    log = (
        bar.format(23, 23, "2.2906")
        + "\r          \rval_loss: 2.2937  val_acc: 0.128\n"
        + bar.format(25, 25, "2.2923")
        + bar.format(29, 29, "2.2991")
        + "\n"
    ).encode()
    assert [(s.step, s.values) for s in samples_of(log)] == [
        (23, {"loss": 2.2906}),
        (25, {"val_loss": 2.2937, "val_acc": 0.128}),
        (25, {"loss": 2.2923}),
        (29, {"loss": 2.2991}),
    ]


def test_one_sample_a_step_a_metric() -> None:
    """A line printed again gives nothing new; a value that differs at that step is the last the log shows."""
    metrics = LogMetrics()
    assert brief(metrics.feed(b"step 5 loss=0.5 lr=0.1\nstep 5 loss=0.5 lr=0.1\n")) == [
        (5, {"loss": 0.5, "lr": 0.1}, None, "print")
    ]
    assert metrics.why == "step 5 again, with the values it has given already: no new sample"
    assert brief(metrics.feed(b"step 5 loss=0.5 lr=0.2\nstep 5 loss=nan\nstep 5 loss=nan\n"))[0][1] == {"lr": 0.2}
    (nan,) = metrics.feed(b"Validation loss: nan\nValidation loss: nan\n")
    assert nan.step == 5 and math.isnan(nan.values["val_loss"])
    restored = LogMetrics.restore(json.loads(json.dumps(metrics.state(), allow_nan=False)))  # NaN as a name
    assert restored.feed(b"Validation loss: nan\nstep 5 loss=nan lr=0.2\n") == []


def test_prints_with_no_step_are_counted_only_where_no_step_is_known() -> None:
    """TF's walkthrough (tests/data/real/tf_walkthrough.log): two `Step:` lines, then a line an epoch that says no
    step: training went on from step 1 without saying where, so each is counted on from there (the first was at
    step 1 with the `Step: 1` line's loss). A log that never says a step counts its prints."""
    log = b"Step: 0, Initial Loss: 1.91\nStep: 1,         Loss: 1.69\n" + b"".join(
        b"Epoch %03d: Loss: %.3f, Accuracy: 30.000%%\n" % (epoch, 1.4 - epoch / 10) for epoch in (0, 2, 4)
    )
    metrics = LogMetrics()
    assert [(s.step, s.epoch) for s in metrics.feed(log)] == [(0, None), (1, None), (2, 0), (3, 2), (4, 4)]
    assert metrics.why == "a print with no step, its metrics at step 3 already: step 4, counted on"
    counted = LogMetrics()
    assert [s.step for s in counted.feed(b"Epoch 1, Avg Loss: 0.9\n")] == [1]
    assert counted.why == "a print with no step, and none before it gave one: step 1, its count of prints"
    assert [s.step for s in counted.feed(b"Epoch 1, val loss 0.8\nEpoch 2, Avg Loss: 0.7\n")] == [1, 2]


def test_steps_go_on_where_the_log_starts_over() -> None:
    """A second `fit` (or a tutorial's next training loop) prints `Epoch 1/N` again: its steps go on from the
    first's, and --explain says the log starts over."""
    fit = (
        b"Epoch 1/2\n\r2/2 [====] - 0s 3ms/step - loss: 0.5000\nEpoch 2/2\n\r2/2 [====] - 0s 3ms/step - loss: 0.4000\n"
    )
    metrics = LogMetrics()
    assert [s.step for s in metrics.feed(fit)] == [2, 4]
    metrics.feed(b"Epoch 1/2\n")
    assert metrics.why == "Keras: epoch 1 after epoch 2, the log starts over (fit again): its steps go on from step 4"
    assert [s.step for s in metrics.feed(b"\r1/2 [==..] - 0s 3ms/step - loss: 0.3000\n")] == [5]
    bar = "\rEpoch {}: 100%|##########| 2/2 [00:01<00:00,  2.00it/s, v_num=0, train_loss=5.{}]\n"
    lightning = LogMetrics()
    steps = [s.step for s in lightning.feed("".join(bar.format(epoch, epoch) for epoch in (0, 1, 0)).encode())]
    assert "; epoch 0 after a later one: the log starts over, its steps go on;" in lightning.why
    steps += [s.step for s in lightning.feed(bar.format(1, 1).encode())]
    assert steps == [2, 4, 6, 8]  # a second fit: its epoch 1 is no step 4
    printed = LogMetrics()
    lines = b"Epoch [1/2], Step [100/600], Loss: 0.2\nEpoch [2/2], Step [100/600], Loss: 0.2\n"
    assert [s.step for s in printed.feed(lines + b"Epoch [1/2], Step [100/600], Loss: 0.2\n")] == [100, 700, 1300]
    assert printed.why.endswith("epoch 1 after epoch 2: the log starts over, its steps go on")


def test_the_lines_after_a_table_are_read_as_any_others_whatever_the_chunks() -> None:
    """A table's rows hold no marker, so each line is looked at until the table ends; after its end, a line with
    no marker (`Seen so far: 992 samples`) is not looked at, in the block that ended the table as in the next: it
    must not place the print written over the bar, which the bar's redraw does."""
    log = (
        b"epoch     train_loss  valid_loss  time\n0         1.024860    0.693555    00:01\nend of training\n"
        b"\r 10%|#         | 10/100 [00:01<00:09, 9.0it/s]\r          \r{'loss': '0.5'}\nSeen so far: 992 samples\n"
        b"\r 11%|#         | 11/100 [00:01<00:09, 9.0it/s]\n"
    )
    assert [(s.step, s.values) for s in samples_of(log)] == [
        (1, {"train_loss": 1.02486, "valid_loss": 0.693555}),
        (11, {"loss": 0.5}),
    ]
    assert feed_in_pieces(log, 1) == samples_of(log)


def test_explain_shows_a_bar_as_one_shape_whatever_its_count() -> None:
    """`tfrun metrics --explain` shows one line a shape: a tqdm bar's graphic and the padding of its numbers
    change with its count, and were 130 shapes of one bar in tests/data/real/hf_trainer_eval.log."""
    readings, _ = explain(REAL / "hf_trainer_eval.log", [], 100)
    bar = max(readings, key=lambda reading: reading.lines)
    assert "/303 [" in bar.line and bar.lines > 100
    assert bar.why.endswith("the print written over it (tqdm.write) is at step 3, its count")


def test_a_state_saved_before_issue_29_restores() -> None:
    """Counters.given is new: a state saved without it restores, with nothing given at its step yet."""
    metrics = LogMetrics()
    metrics.feed(b"step 5 loss=0.5\n")
    state = json.loads(json.dumps(metrics.state()))
    del state["counters"]["given"]
    restored = LogMetrics.restore(state)
    assert brief(restored.feed(b"step 5 loss=0.5\nstep 6 loss=0.4\nstep 6 loss=0.4\n")) == [
        (5, {"loss": 0.5}, None, "print"),
        (6, {"loss": 0.4}, None, "print"),
    ]


def _read_at_steps(samples: list[Sample], name: str) -> dict[int, float]:
    return {sample.step: sample.values[name] for sample in samples if name in sample.values}


def test_keras_io_custom_training_loop_losses_are_read_at_their_steps() -> None:
    samples = samples_of((REAL / "custom_loop.log").read_bytes())
    truth = json.loads((REAL / "custom_loop.truth.json").read_text())
    # The step restarts each epoch and no epoch length is printed (32 batches, a print every 5): the reader places
    # later epochs as it can (`global` null there), but keeps the steps going up.
    read = [(sample.step, sample.values["training_loss"]) for sample in samples if "training_loss" in sample.values]
    expected = truth["printed"]
    recovered = [
        row
        for row, (step, loss) in zip(expected, read)
        if abs(loss - row["loss"]) <= truth["tolerance"] and row["global"] in (None, step)  # `:.4f`
    ]
    assert len(expected) == 175 and len(read) == len(expected) and len(recovered) >= RECOVERED_SHARE * len(expected)
    assert [step for step, _ in read] == sorted({step for step, _ in read})
    assert all(training_loss(sample.values) is not None for sample in samples)  # accuracy lines are no losses


def test_keras_io_gan_losses_are_read_at_their_steps() -> None:
    samples = samples_of((REAL / "gan_loop.log").read_bytes())
    truth = json.loads((REAL / "gan_loop.truth.json").read_text())
    for name, rows in ((truth["loss_name"], truth["printed"]), ("adversarial_loss", truth["adversarial"])):
        read = _read_at_steps(samples, name)
        recovered = [row for row in rows if abs(read.get(row["global"], math.inf) - row["loss"]) <= truth["tolerance"]]
        assert len(rows) == 48 and len(recovered) >= RECOVERED_SHARE * len(rows)  # `:.2f`


def test_text_without_metrics_gives_nothing() -> None:
    text = (
        b"2026-11-30 07:10:19.888408: I tensorflow/core/platform/cpu_feature_guard.cc:182] This TensorFlow binary is "
        b"optimized\nlossless compression on\nEpoch 3 done in 2.0s\nloss: see below\naccumulation 4 steps\n"
    )
    assert samples_of(text) == []
    # A Keras bar outside `Epoch k/N` ... its last line is model.evaluate or predict, not training.
    assert samples_of(b"\r12/12 [=====] - 0s 3ms/step - loss: 0.7080 - accuracy: 0.4479\n") == []


def test_invalid_utf8_and_colours_do_not_break_reading() -> None:
    log = (DATA / "keras3_fit.log").read_bytes()
    noisy = log.replace(b"Epoch 2/3\n", b"\xff\xfe garbage \xc3\nEpoch 2/3\n").replace(b"\r", b"\x1b[2K\r")
    assert samples_of(noisy) == samples_of(log)
    (sample,) = samples_of(b"\xff\xfe\x1b[1mstep\x1b[0m 9 \x1b[31mloss\x1b[0m=\x1b[1m0.5\x1b[0m \xe2\x94\n")
    assert (sample.step, sample.values) == (9, {"loss": 0.5})


def test_hostile_bars_keep_the_state_small() -> None:
    """What a restart restores stays bounded: bars of ever new totals, a rich bar followed by endless metric lines."""
    metrics = LogMetrics()
    bars = "".join(f"\r{n}/{n + 7} [00:00<00:00, 9.0it/s, loss=0.5]" for n in range(1, 2000)).encode()
    metrics.feed(bars + b"\n")
    metrics.feed("Epoch 0/3  \u2501\u2501\u257a 4/20 0:00:01 \u2022 0:00:07 2.35it/s v_num: 0.000\n".encode())
    metrics.feed(b"    train_loss: 5.692\n" * 100_000)
    assert len(json.dumps(metrics.state())) < 10_000


def test_an_endless_line_is_skipped_without_buffering_it() -> None:
    metrics = LogMetrics()
    assert metrics.feed(b"loss=1 " + b"x" * (MAX_SEGMENT + 10)) == []
    assert len(metrics.pending) == 0
    assert metrics.feed(b"y" * 10 + b" loss=2\nstep 5 loss=0.5\n") == [Sample(5, {"loss": 0.5}, None, "print", 5)]


def test_absurd_counters_are_no_metrics_and_do_not_move_the_steps() -> None:
    """A 5,000-digit step is past Python's int() limit and 10^30 past SQLite's and the protocol's integers:
    neither may stop the reading, nor shift the steps that follow."""
    metrics = LogMetrics([r"^it (?P<step>\d+) mse=(?P<mse>\S+)"])
    data = b"step " + b"9" * 5000 + b" loss=0.7\nstep 10000000000000000000000000000000 loss=0.6\nit " + b"9" * 30
    samples = metrics.feed(data + b" mse=0.5\nstep 6 loss=0.5\nstep 7 loss=0.4\n")
    assert [(s.step, s.values) for s in samples if s.step > 2] == [(6, {"loss": 0.5}), (7, {"loss": 0.4})]
    assert all(s.step < 10**15 for s in samples)


# LogMetrics: user patterns


def test_user_patterns() -> None:
    metrics = LogMetrics([r"^it (?P<step>\d+) \| mse=(?P<mse>\S+)", r"lr=(?P<lr>[0-9.e-]+)"])
    data = b"junk\rit 7 | mse=0.25 | lr=0.001\nit 8 | mse=oops\nit 9 | mse=nan\nno it 10 | mse=1\n"
    samples = metrics.feed(data)
    assert brief(samples[:1]) == [(7, {"mse": 0.25, "lr": 0.001}, None, "pattern")]  # ^ after a \r; two patterns
    assert [sample.step for sample in samples] == [7, 9]  # `oops` is no number; `no it` does not start with it
    assert math.isnan(samples[1].values["mse"])
    # Counted when the pattern names no step; the epoch group is a counter, not a metric.
    counted = LogMetrics([r"epoch (?P<epoch>\d+) score (?P<score>[\d.]+)"]).feed(b"epoch 2 score 0.5\n")
    assert brief(counted) == [(1, {"score": 0.5}, 2, "pattern")]


def test_user_patterns_win_over_the_formats_they_match() -> None:
    metrics = LogMetrics([r"custom=(?P<custom>\d+)"])
    data = b"step 5 loss=0.5 custom=3\nstep 6 loss=0.4 custom=x\n"
    assert brief(metrics.feed(data)) == [(1, {"custom": 3.0}, None, "pattern"), (6, {"loss": 0.4}, None, "print")]


@pytest.mark.parametrize(
    ("pattern", "reason"),
    [
        ("loss=(?P<loss>\\S+", "invalid pattern 'loss=(?P<loss>\\\\S+': missing ): loss=(?P<loss>\\S+"),
        ("(a)\\1(?P<x>b)", "invalid pattern '(a)\\\\1(?P<x>b)': invalid escape sequence: \\1"),
        ("(?<=a)(?P<x>b)", "invalid pattern '(?<=a)(?P<x>b)': invalid perl operator: (?<="),
        ("loss=(\\S+)", "pattern 'loss=(\\\\S+)' names no metric: name a group, e.g. loss=(?P<loss>\\S+)"),
        ("step (?P<step>\\d+)", "pattern 'step (?P<step>\\\\d+)' names no metric"),
    ],
)
def test_bad_user_patterns(pattern: str, reason: str) -> None:
    with pytest.raises(PatternError) as raised:
        LogMetrics(["ok (?P<ok>1)", pattern])
    assert str(raised.value).startswith(reason)
    assert "\n" not in str(raised.value)


# LogMetrics: state


@pytest.mark.parametrize("name", KERAS_LOGS)
def test_state_round_trip_mid_stream(name: str) -> None:
    log = (DATA / name).read_bytes()
    whole = samples_of(log)
    for cut in (len(log) // 3, len(log) // 2 + 7, len(log) - 5):
        first = LogMetrics()
        before = feed_in_pieces(log[:cut], 97, first)
        saved = json.loads(json.dumps(first.state(), allow_nan=False))
        after = feed_in_pieces(log[cut:], 89, LogMetrics.restore(saved))
        assert before + after == whole


def test_state_round_trip_keeps_counters_patterns_and_nan() -> None:
    keras_nan = b"Epoch 1/2\n\r1/4 [=>...] - ETA: 0s - loss: 0.5000\r2/4 [==>..] - loss: nan\r3/4 [===>.] - loss: nan\r"
    prints = b"\nEpoch [1/2], Step [600/600], Loss: 0.5\nit 4 | mse=0.1\nEpoch [2/2], Step [300/600], Loss: 0.4\n"
    data = keras_nan + LIGHTNING + prints
    patterns = (r"^it (?P<step>\d+) \| mse=(?P<mse>\S+)",)
    whole = brief(samples_of(data, patterns))
    for cut in range(0, len(data), 13):
        first = LogMetrics(patterns)
        before = first.feed(data[:cut])
        saved = json.loads(json.dumps(first.state(), allow_nan=False))
        after = LogMetrics.restore(saved, patterns).feed(data[cut:])
        assert repr(brief(before + after)) == repr(whole)  # repr: nan == nan
    assert whole[-1][0] == 900


def test_training_loss_picks_the_loss_to_watch() -> None:
    assert training_loss({"accuracy": 0.9, "loss": 0.2, "val_loss": 0.3}) == 0.2
    assert training_loss({"val_loss": 0.3, "avg_loss": 0.4}) == 0.4
    assert training_loss({"val_loss": 0.3, "accuracy": 0.9}) is None


# SpikeDetector


@pytest.mark.parametrize("name", ["healthy", "noisy"])
def test_no_spike_on_healthy_runs(name: str) -> None:
    about, losses = curve(name)
    assert about["spike_at"] is None and len(losses) >= 600
    assert spikes_of(losses) == []


def test_one_spike_at_the_learning_rate_bump() -> None:
    about, losses = curve("spike")
    detector = SpikeDetector()
    called = next(number for number, (step, loss) in enumerate(losses, 1) if detector.add(step, loss))
    (spike,) = spikes_of(losses[:called])
    assert about["spike_at"] < spike.step <= about["spike_at"] + detector.patience + 3
    assert spike.kind == "ratio" and spike.value > detector.factor * spike.baseline > 0
    assert spike.recent[-1] == spike.value and len(spike.recent) == 10
    # The rest of the run stays diverged: no second alert, and no loss of the incident joins the baseline.
    window = detector.state()["window"]
    assert spikes_of(losses[called:], detector) == []
    assert detector.state()["window"] == window and detector.incident


def test_a_second_incident_fires_only_after_the_loss_came_back() -> None:
    _, healthy = curve("healthy")
    about, spiked = curve("spike")
    at = about["spike_at"]
    incident = [(step, loss) for step, loss in spiked if at <= step < at + 40]
    recovered = [(step + 40, loss) for step, loss in healthy if at <= step < at + 60]
    again = [(step + 100, loss) for step, loss in incident]
    detector = SpikeDetector()
    first = spikes_of([(step, loss) for step, loss in spiked if step < at] + incident, detector)
    assert len(first) == 1
    assert spikes_of(incident, detector) == []  # still the same incident
    second = spikes_of(recovered + again, detector)
    assert len(second) == 1 and at + 100 < second[0].step <= at + 100 + detector.patience + 3


def test_nan_and_inf_fire_at_once_and_once() -> None:
    _, losses = curve("healthy")
    detector = SpikeDetector()
    assert spikes_of(losses[:30], detector) == []
    (nan,) = spikes_of([(31, math.nan), (32, math.nan), (33, math.nan)], detector)
    assert (nan.step, nan.kind) == (31, "nan") and math.isnan(nan.value) and math.isnan(nan.baseline)
    assert nan.recent[:-1] == [loss for _, loss in losses[21:30]]
    (inf,) = spikes_of([(34, 0.9), (35, math.inf), (36, -math.inf)], detector)
    assert (inf.step, inf.kind, inf.value) == (35, "inf", math.inf)


def test_nothing_fires_during_the_warm_up() -> None:
    detector = SpikeDetector(warmup=20)
    assert spikes_of([(step, 1.0) for step in range(1, 15)] + [(step, 50.0) for step in range(15, 21)], detector) == []


def test_detector_state_round_trip() -> None:
    _, losses = curve("spike")
    whole = spikes_of(losses)
    detector = SpikeDetector()
    found = []
    for start in range(0, len(losses), 37):
        found += spikes_of(losses[start : start + 37], detector)
        detector = SpikeDetector.restore(json.loads(json.dumps(detector.state(), allow_nan=False)))
    assert found == whole and len(found) == 1
    detector.add(1000, math.nan)
    assert json.loads(json.dumps(detector.state(), allow_nan=False))["recent"][-1] == "nan"


def test_the_default_statistic_suits_noisy_losses() -> None:
    """The module docstring's reason for a percentile, on the real noisy curve: 2x the median of the last 10
    is often exceeded by noise, four times in a row; 2x their 90th percentile rarely, never twice in a row."""
    _, losses = curve("noisy")
    values = [loss for _, loss in losses]
    window = DEFAULT_WINDOW

    def above(statistic: Any) -> tuple[float, int]:
        flags = [value > 2 * statistic(sorted(values[i - window : i])) for i, value in enumerate(values) if i >= 20]
        runs = "".join("x" if flag else "." for flag in flags).split(".")
        return sum(flags) / len(flags), max(len(run) for run in runs)

    share, longest = above(statistics.median)
    assert window == 10 and share > 0.15 and longest >= 4
    share, longest = above(lambda ordered: ordered[int(0.9 * (len(ordered) - 1))])  # spikes.py's percentile
    assert share < 0.045 and longest == 1


def test_log_metrics_and_detector_on_a_real_keras_spike() -> None:
    log = (DATA / "keras3_spike.log").read_bytes()
    detector = SpikeDetector()
    spikes = []
    for sample in feed_in_pieces(log, 4096):
        loss = training_loss(sample.values)  # None for the epoch's validation values
        if loss is not None:
            spike = detector.add(sample.step, loss)
            spikes += [spike] if spike else []
    (spike,) = spikes
    assert LOG_SPIKE_AT < spike.step <= LOG_SPIKE_AT + detector.patience + 3
    assert max(spike.recent) > 15  # the decoded batch, not Keras's running mean of 1.6


def test_tfrun_metrics_shows_a_step_read_from_the_log_once_its_last_value_winning(tmp_path: Path) -> None:
    """Lines the watch appended at one step (a training loss, then the evaluation placed at the step training got
    to, then that evaluation's value as the log printed it again) are one sample, as a terminal shows the last."""
    from tfrun.runner.metrics.jobmetrics import read_metrics

    lines = [
        {"step": 100, "time": 1.0, "loss": 2.3},
        {"step": 100, "time": 2.0, "eval_loss": 2.5},
        {"step": 100, "time": 3.0, "eval_loss": 2.4},
        {"step": 200, "time": 4.0, "loss": 2.1},
    ]
    (tmp_path / "logmetrics.jsonl").write_text("".join(json.dumps(line) + "\n" for line in lines))
    source, samples = read_metrics(tmp_path, None)
    assert source == "log"
    assert [(s.step, s.values, s.time) for s in samples] == [
        (100, {"loss": 2.3, "eval_loss": 2.4}, 3.0),
        (200, {"loss": 2.1}, 4.0),
    ]
    assert [s.step for s in read_metrics(tmp_path, 1)[1]] == [200]


def test_mmengine_training_lines_give_the_global_step_and_its_evaluation_the_step_reached() -> None:
    """MMEngine's LoggerHook (mmdetection, mmpretrain...): `Epoch(train) [E][N/M]` is batch N of an epoch of M, so
    epoch 2's batch 50 of 469 is step 519, not the seventh print; an `Epoch(val)` line counts its own batches and
    goes to the step training got to; `Iter(train) [N/M]` is the run's iteration."""
    head = "12/03 07:00:00 - mmengine - INFO - "
    lines = [
        f"{head}Epoch(train)  [{epoch}][{batch:3d}/469]  lr: 1.0000e-02  eta: 0:05:12  time: 0.0313  memory: 191  "
        f"loss: {1 / (epoch * batch):.4f}  loss_cls: 0.1000\n"
        for epoch, batch in ((1, 50), (1, 450), (2, 50))
    ]
    lines.insert(2, f"{head}Epoch(val) [1][79/79]    accuracy/top1: 97.2000  loss: 0.3000  data_time: 0.0054\n")
    samples = LogMetrics().feed("".join(lines).encode())
    assert [(s.step, s.epoch, "val_loss" in s.values) for s in samples] == [
        (50, 1, False),
        (450, 1, False),
        (450, None, True),
        (519, 2, False),
    ]
    iterations = LogMetrics().feed(
        b"Iter(train) [  10/1000]  lr: 1e-2  loss: 0.5\nIter(train) [  20/1000]  loss: 0.4\n"
    )
    assert [s.step for s in iterations] == [10, 20]
