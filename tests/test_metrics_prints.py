"""Metrics read from PyTorch Lightning's and tqdm's bars and from plain prints (runner/metrics/): redraws, NaN and
Inf, numbers as frameworks write them, steps that restart each epoch, evaluation lines.
"""

from __future__ import annotations

import math
from typing import Optional

import pytest
from harness.metriclogs import LIGHTNING, brief, feed_in_pieces, samples_of

from tfrun.runner.metrics import training_loss

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
        # XGBoost's EvaluationMonitor (xgb.train with evals): the round, then each evaluation set's metric.
        (
            b"[3]\ttrain-logloss:0.30000\teval-logloss:0.31000",
            3,
            {"train_logloss": 0.3, "eval_logloss": 0.31},
            None,
        ),
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
