"""The step each metric goes to (issue 29: every metric at the step training had reached, once), on output cut
from published training scripts (Hugging Face Trainer, keras.io loops, MMEngine); and text that must give
nothing, or not break the reading: no metrics, invalid UTF-8, hostile bars, endless lines, absurd counters.
"""

from __future__ import annotations

import json
import math

from harness.metriclogs import RECOVERED_SHARE, brief, feed_in_pieces, samples_of
from harness.paths import DATA, REAL

from tfrun.runner.metrics import MAX_SEGMENT, LogMetrics, Sample, training_loss
from tfrun.runner.metrics.explain import explain

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
    assert metrics.why == (
        "a print with no step: placed at step 303, where training got to; its training loss: train_loss"
        " (the training dataset's loss)"
    )
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
    assert counted.why == (
        "a print with no step, and none before it gave one: step 1, its count of prints; its training loss:"
        " avg_loss (the first name ending in loss that is no evaluation's)"
    )
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
