"""Issues 49 and 51: metrics printed in shapes rather than in one library's format, each read at the step the log
states, evaluation figures kept apart, and the training loss chosen by one rule (tfrun/losses.py), which
`tfrun metrics --explain` shows. tests/test_corpus.py holds the same to real runs of the libraries that print them."""

from __future__ import annotations

import json
import math
from pathlib import Path

from harness.metriclogs import brief, feed_in_pieces, samples_of

from tfrun.losses import training_loss_name
from tfrun.runner.metrics import LogMetrics, training_loss
from tfrun.runner.metrics.explain import explain

LIGHTGBM = (
    b"[10]\ttraining's l1: 0.342535\ttraining's l2: 0.163113\tvalid_1's l1: 0.329053\tvalid_1's l2: 0.148966\n"
    b"[20]\ttraining's l1: 0.30\ttraining's l2: inf\tvalid_1's l1: 0.31\tvalid_1's l2: 0.14\n"
    b"[30]\ttraining's l1: inf\ttraining's l2: inf\tvalid_1's l1: 0.31\tvalid_1's l2: 0.14\n"
)
SB3_BOX = (
    b"---------------------------------\n"
    b"| rollout/            |          |\n"
    b"|    ep_len_mean      | 22.4     |\n"
    b"| time/               |          |\n"
    b"|    episodes         | 4        |\n"
    b"|    total_timesteps  | 75       |\n"
    b"| train/              |          |\n"
    b"|    entropy_loss     | -0.512   |\n"
    b"|    loss             | 0.549    |\n"
    b"|    n_updates        | 12       |\n"
    b"---------------------------------\n"
)
SKORCH = (
    b"  epoch    train_loss    valid_acc    valid_loss     dur\n"
    b"-------  ------------  -----------  ------------  ------\n"
    b"      1        \x1b[36m0.6858\x1b[0m       \x1b[32m0.5725\x1b[0m        \x1b[35m0.6826\x1b[0m  0.0154\n"
    b"      2        0.6712       0.5800        0.6701  0.0150\n"
)
SKLEARN_GB = (
    b"      Iter       Train Loss   Remaining Time \n"
    b"         1           1.2095            0.49s\n"
    b"         2           1.1001            0.47s\n"
    b"        10           0.5000            1.02m\n"
)
SPACY = (
    b"E    #       LOSS TOK2VEC  LOSS NER  ENTS_F  ENTS_P  ENTS_R  SCORE \n"
    b"---  ------  ------------  --------  ------  ------  ------  ------\n"
    b"  0       0          0.00     49.00    0.00    0.00    0.00    0.00\n"
    b"  2     200         12.00     30.00   40.00   41.00   39.00    0.40\n"
)


def values_at(data: bytes) -> list[tuple[int, dict[str, float]]]:
    return [(sample.step, sample.values) for sample in samples_of(data)]


def test_a_boosting_round_is_read_at_its_round_with_each_dataset_apart() -> None:
    """LightGBM's `dataset's metric:` pairs were not read at all; the training loss is the training dataset's
    first error metric (no name says loss), and its `inf` is alerted as any loss's."""
    samples = samples_of(LIGHTGBM)
    assert [sample.step for sample in samples] == [10, 20, 30]
    assert samples[0].values == {
        "training_l1": 0.342535,
        "training_l2": 0.163113,
        "valid_1_l1": 0.329053,
        "valid_1_l2": 0.148966,
    }
    assert [training_loss(sample.values) for sample in samples] == [0.342535, 0.30, math.inf]
    assert feed_in_pieces(LIGHTGBM, 7) == samples


def test_xgboost_names_its_datasets_with_a_hyphen_whatever_the_metric() -> None:
    samples = samples_of(b"[3]\teval-rmse:0.51\ttrain-rmse:0.42\n[4]\tvalidation_0-cox-nloglik:2.1\n")
    assert brief(samples) == [
        (3, {"eval_rmse": 0.51, "train_rmse": 0.42}, None, "print"),
        (4, {"validation_0_cox-nloglik": 2.1}, None, "print"),
    ]
    assert training_loss_name(samples[0].values) == "train_rmse"
    assert training_loss_name(samples[1].values) is None  # an evaluation's metric only


def test_a_score_that_grows_is_never_the_training_loss() -> None:
    """An AUC or an accuracy rising as the model learns would be alerted as a loss spike."""
    [sample] = samples_of(b"[10]\ttraining's auc: 0.91\tvalid_0's auc: 0.88\n")
    assert sample.values == {"training_auc": 0.91, "valid_0_auc": 0.88}
    assert training_loss(sample.values) is None
    assert training_loss_name(["train_accuracy", "train_ndcg@5", "train_map"]) is None
    assert training_loss_name(["training_auc", "training_binary_error"]) == "training_binary_error"


def test_a_box_of_rows_is_one_sample_at_its_timesteps() -> None:
    """stable-baselines3's box: its losses were read at a count of prints (step 73 where the run was at 3034)."""
    [sample] = samples_of(SB3_BOX)
    assert sample.step == 75 and sample.printed_step == 75
    assert sample.values == {"rollout/ep_len_mean": 22.4, "train/entropy_loss": -0.512, "train/loss": 0.549}
    assert training_loss_name(sample.values) == "train/loss"  # the sum, not the first part of it
    nan_box = SB3_BOX.replace(b"0.549   ", b"nan     ").replace(b"75      ", b"3034    ")
    two = samples_of(SB3_BOX + b"some other output\n" + nan_box)
    assert [(s.step, math.isnan(s.values["train/loss"])) for s in two] == [(75, False), (3034, True)]
    for size in (1, 7, 33):  # repr: NaN is no NaN's equal
        assert repr(feed_in_pieces(SB3_BOX + nan_box, size)) == repr(samples_of(SB3_BOX + nan_box))


def test_a_restarted_daemon_reads_the_rest_of_an_open_box() -> None:
    for cut in (40, len(SB3_BOX) // 2, len(SB3_BOX) - 5):
        first = LogMetrics()
        samples = first.feed(SB3_BOX[:cut])
        samples += LogMetrics.restore(json.loads(json.dumps(first.state()))).feed(SB3_BOX[cut:])
        assert samples == samples_of(SB3_BOX)


def test_a_rule_followed_by_other_lines_is_no_box() -> None:
    log = b"-" * 40 + b"\nstep 5 loss=0.3\n| a | b |\n" + b"-" * 40 + b"\nstep 6 loss=0.2\n"
    assert values_at(log) == [(5, {"loss": 0.3}), (6, {"loss": 0.2})]


def test_a_print_glued_to_a_bar_s_redraw_is_read_at_the_bar_s_next_count() -> None:
    """A tqdm bar on stderr and a print on stdout interleaved on one line of the file: the print was dropped as
    "a progress bar with no metric in it"."""
    log = (
        b"\rtraining:   0%|          | 0/200 [00:00<?, ?it/s]training loss: 5.566705703735352\n"
        b"\rtraining:   0%|          | 1/200 [00:00<01:25,  2.32it/s]training loss: 5.41\n"
        b"\rtraining:   1%|          | 2/200 [00:00<00:59,  3.35it/s]training loss: nan\n"
        b"\rtraining:   2%|          | 3/200 [00:01<00:49,  3.96it/s]\r"
    )
    samples = samples_of(log)
    assert [s.step for s in samples] == [1, 2, 3]
    assert [s.values["training_loss"] for s in samples][:2] == [5.566705703735352, 5.41]
    assert math.isnan(samples[2].values["training_loss"])
    assert repr(feed_in_pieces(log, 5)) == repr(samples)


def test_words_of_evaluation_qualify_the_figures_they_name_only() -> None:
    """A loop printing training loss and accuracies of three splits on one line was read as one evaluation: its
    losses became `val_loss` samples at step 0, and a NaN loss alerted nothing."""
    log = (
        b"Epoch: 001, Loss: 2.0000, Train: 0.3100, Val: 0.2850, Test: 0.2450\n"
        b"Epoch: 002, Loss: nan, Train: 0.1000, Val: 0.1000, Test: 0.1000\n"
    )
    samples = samples_of(log)
    assert [(s.step, s.epoch) for s in samples] == [(1, 1), (2, 2)]
    assert samples[0].values == {"loss": 2.0, "train": 0.31, "val": 0.285, "test": 0.245}
    assert math.isnan(training_loss(samples[1].values) or 0.0)
    [tabnet] = samples_of(b"epoch 4  | loss: 0.65    | train_auc: 0.71  | valid_auc: 0.69  |  0:00:01s\n")
    assert (tabnet.epoch, tabnet.values) == (4, {"loss": 0.65, "train_auc": 0.71, "valid_auc": 0.69})
    # a word that names no figure still qualifies the line's unnamed ones
    assert values_at(b"Test set: Average loss: 0.2475, Accuracy: 9213/10000 (92%)\n")[0][1] == {"test_loss": 0.2475}
    [validation] = samples_of(b"step 10 loss=0.5\nValidation | loss: 0.31 | val_acc: 0.9\n")[1:]
    assert validation.values == {"val_loss": 0.31, "val_acc": 0.9}


def test_column_tables_are_read_by_column() -> None:
    """skorch's (a rule under the header, colour codes around each best value), scikit-learn's gradient boosting
    (names of two words, an `Iter` column, times with units), spaCy's (`E`, `#`, `LOSS NER`)."""
    assert [(s.step, s.epoch, s.values) for s in samples_of(SKORCH)] == [
        (1, 1, {"train_loss": 0.6858, "valid_acc": 0.5725, "valid_loss": 0.6826, "dur": 0.0154}),
        (2, 2, {"train_loss": 0.6712, "valid_acc": 0.58, "valid_loss": 0.6701, "dur": 0.015}),
    ]
    assert values_at(SKLEARN_GB) == [
        (1, {"train_loss": 1.2095}),
        (2, {"train_loss": 1.1001}),
        (10, {"train_loss": 0.5}),
    ]
    spacy = samples_of(SPACY)
    assert [(s.step, s.epoch) for s in spacy] == [(0, 0), (200, 2)]
    assert spacy[1].values == {
        "tok2vec_loss": 12.0,
        "ner_loss": 30.0,
        "ents_f": 40.0,
        "ents_p": 41.0,
        "ents_r": 39.0,
        "score": 0.4,
    }
    assert training_loss_name(spacy[1].values) == "tok2vec_loss"
    for log in (SKORCH, SKLEARN_GB, SPACY):
        assert feed_in_pieces(log, 3) == samples_of(log)


def test_a_table_ends_where_its_shape_does_and_comes_back_with_its_header() -> None:
    log = SKORCH + b"Re-initializing module.\nstep 40 loss=0.25\n" + SKORCH.replace(b"0.6858", b"nan   ")
    samples = samples_of(log)
    # rows that say no step: placed where training got to, as any print that says none (then counted on)
    assert [s.step for s in samples] == [1, 2, 40, 40, 41]
    assert math.isnan(samples[3].values["train_loss"])


def test_several_fits_keep_their_steps_going_forward() -> None:
    """Each fit's table counts its iterations from 1 again: the second fit goes on from the first."""
    assert [step for step, _ in values_at(SKLEARN_GB + SKLEARN_GB)] == [1, 2, 10, 11, 12, 20]
    boxes = SB3_BOX + SB3_BOX.replace(b"75      ", b"150     ") + SB3_BOX  # learn() again, its timesteps reset
    assert [s.step for s in samples_of(boxes)] == [75, 150, 225]


def test_a_counter_that_starts_again_at_1_counts_from_1() -> None:
    """`Step 1..3` then `Step 1` again: the new epoch's first step is step 4 (it was 5, as if counted from 0)."""
    log = b"".join(
        b"".join(b"Step %d, Loss: 0.%d\n" % (step, step + epoch) for step in (1, 2, 3))
        + b"Epoch %d, Avg Loss: 0.5\n" % epoch
        for epoch in (1, 2)
    )
    first, second = [(1, None), (2, None), (3, None), (3, 1)], [(4, None), (5, None), (6, None), (6, 2)]
    assert [(s.step, s.epoch) for s in samples_of(log)] == [*first, *second]
    assert [s.step for s in samples_of(b"step 0 loss=1\nstep 1 loss=1\nstep 0 loss=1\n")] == [0, 1, 2]


def test_explain_shows_each_shape_and_which_figure_is_the_training_loss(tmp_path: Path) -> None:
    log = tmp_path / "output.log"
    log.write_bytes(LIGHTGBM + SB3_BOX + SKLEARN_GB + b"Epoch: 001, Loss: 2.0000, Train: 0.3100, Val: 0.2850\n")
    readings, _ = explain(log, [], 50)
    by_line = {reading.line.split()[0]: reading for reading in readings if reading.values}
    boosting = by_line["[#]"] if "[#]" in by_line else next(r for r in readings if r.line.startswith("[10]"))
    assert boosting.step == 10 and boosting.why.endswith(
        "its training loss: training_l1 (no name says loss: the training dataset's first error metric)"
    )
    box = next(reading for reading in readings if reading.values and "train/loss" in reading.values)
    assert box.step == 75 and "its `total_timesteps`; its training loss: train/loss" in box.why
    row = next(reading for reading in readings if reading.values and "train_loss" in reading.values)
    assert "a row of the table Iter | Train Loss | Remaining Time: step 76, its step column 1" in row.why
    mixed = next(reading for reading in readings if reading.line.startswith("Epoch: 001"))
    assert mixed.values == {"loss": 2.0, "train": 0.31, "val": 0.285} and "evaluation" not in mixed.why


def test_a_job_s_output_cannot_make_a_table_or_a_box_without_bounds() -> None:
    """The reader's state is saved with every look: a box of endless rows, a header of thousands of names or a
    name of a megabyte is no table's, and is not kept."""
    endless = b"-" * 40 + b"\n" + b"".join(b"| name%d | %d |\n" % (i, i) for i in range(5000)) + b"-" * 40 + b"\n"
    metrics = LogMetrics()
    assert metrics.feed(endless + b"step 1 loss=0.5\n") == samples_of(b"step 1 loss=0.5\n")
    assert len(json.dumps(metrics.state())) < 20_000
    wide = b" ".join(b"loss%d" % i for i in range(5000)) + b"\n" + b" ".join(b"1" for _ in range(5000)) + b"\n"
    long_name = b"loss " + b"x" * 1_000 + b"\n1 2\n"
    for header in (wide, long_name):
        metrics = LogMetrics()
        assert metrics.feed(header) == []
        assert metrics.reading.counters.table is None
