"""Metrics read with the user's own patterns (`--metric`), the reader's state kept across a daemon's restart, and
the samples `tfrun metrics` shows from what the watch appended.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
from harness.metriclogs import KERAS_LOGS, LIGHTNING, brief, feed_in_pieces, samples_of
from harness.paths import DATA

from tfrun.runner.metrics import LogMetrics, PatternError, training_loss
from tfrun.runner.metrics.jobmetrics import pending, read_metrics, recent_losses, unread_bytes
from tfrun.runner.metrics.state import Sample

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


def test_tfrun_metrics_shows_a_step_read_from_the_log_once_its_last_value_winning(tmp_path: Path) -> None:
    """Lines the watch appended at one step (a training loss, then the evaluation placed at the step training got
    to, then that evaluation's value as the log printed it again) are one sample, as a terminal shows the last."""

    lines = [
        {"step": 100, "time": 1.0, "loss": 2.3},
        {"step": 100, "time": 2.0, "eval_loss": 2.5},
        {"step": 100, "time": 3.0, "eval_loss": 2.4},
        {"step": 200, "time": 4.0, "loss": 2.1},
    ]
    (tmp_path / "logmetrics.jsonl").write_text("".join(json.dumps(line) + "\n" for line in lines))
    source, samples, _ = read_metrics(tmp_path, None)
    assert source == "log"
    assert [(s.step, s.values, s.time) for s in samples] == [
        (100, {"loss": 2.3, "eval_loss": 2.4}, 3.0),
        (200, {"loss": 2.1}, 4.0),
    ]
    assert [s.step for s in read_metrics(tmp_path, 1)[1]] == [200]


def test_a_cursor_reads_only_the_lines_written_since_and_never_half_a_line(tmp_path: Path) -> None:
    """A chart's page asks each second: the daemon reads from where its last reply ended (GetMetrics.cursor),
    a line the job is still writing is read again once whole, and a cursor of another file reads from the start."""
    path = tmp_path / "logmetrics.jsonl"
    path.write_text('{"step": 1, "loss": 2.0}\n{"step": 2, "loss": 1.5}\n{"step": 3, "lo')
    _, samples, cursor = read_metrics(tmp_path, None)
    assert [s.step for s in samples] == [1, 2]
    whole = len('{"step": 1, "loss": 2.0}\n{"step": 2, "loss": 1.5}\n')
    assert cursor == f"log@{whole}"
    with open(path, "a") as f:
        f.write('ss": 1.2}\n{"step": 4, "loss": 1.1}\n')
    _, samples, later = read_metrics(tmp_path, None, cursor=cursor)
    assert [(s.step, s.values) for s in samples] == [(3, {"loss": 1.2}), (4, {"loss": 1.1})]
    assert later == f"log@{path.stat().st_size}"
    assert read_metrics(tmp_path, None, cursor=later)[1] == []
    assert unread_bytes(tmp_path, later) == 0 and unread_bytes(tmp_path, cursor) == path.stat().st_size - whole
    for elsewhere in ("callback@10", f"log@{path.stat().st_size + 1}", "log@-5", "nonsense"):
        assert [s.step for s in read_metrics(tmp_path, None, cursor=elsewhere)[1]] == [1, 2, 3, 4], elsewhere


def test_a_live_view_adds_the_samples_not_kept_yet_as_they_will_read_once_kept(tmp_path: Path) -> None:
    """A chart's look, `top` and a jobs page take the samples the watch read and has not written yet from its
    memory (the files take them every KEEP_EVERY_S; a look each second forced a write each second): one a step,
    its later values winning, after the file's own; a job's own metrics.jsonl is preferred, as ever."""
    (tmp_path / "logmetrics.jsonl").write_text('{"step": 1, "loss": 2.0}\n')
    unkept = [Sample(2, {"loss": 1.5}), Sample(2, {"val_loss": 1.7}, epoch=1), Sample(3, {"loss": float("nan")})]
    shown = pending(unkept)
    assert [(s.step, s.epoch) for s in shown] == [(2, 1), (3, None)]
    assert shown[0].values == {"loss": 1.5, "val_loss": 1.7} and math.isnan(shown[1].values["loss"])
    losses = recent_losses(tmp_path, 10, shown)
    assert losses[:2] == [2.0, 1.5] and math.isnan(losses[2]) and len(losses) == 3
    assert recent_losses(tmp_path, 1, shown[:1]) == [1.5]
    (tmp_path / "metrics.jsonl").write_text('{"step": 1, "loss": 9.0}\n')
    assert recent_losses(tmp_path, 10, shown) == [9.0]
