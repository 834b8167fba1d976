"""Metrics read from Keras's output (runner/metrics/): its progress bars in Keras 2 and 3, verbose=2, datasets of
unknown size, a warning written into a bar; on real `model.fit` runs (harness/metriclogs.py says where each comes
from). Lightning, tqdm and plain prints are in test_metrics_prints.py, the steps a metric goes to in
test_metrics_steps.py, user patterns and the reader's state in test_metrics_state.py, loss spikes in test_spikes.py.
"""

from __future__ import annotations

import json
import re
import statistics

import pytest
from harness.metriclogs import KERAS_LOGS, LOG_SPIKE_AT, feed_in_pieces, samples_of
from harness.paths import DATA, REAL

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
