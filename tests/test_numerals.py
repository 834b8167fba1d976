"""Whole numbers in text from a user, a job or another program are ASCII digits (tfrun/numerals.py): `str.isdigit`
says yes to "²", which `int` refuses, so each place that read one crashed on it (found in the UI's URLs and
GetMetrics' cursor, then everywhere `isdigit` guarded an `int`; tests/test_codebase.py keeps `isdigit` out)."""

from __future__ import annotations

from pathlib import Path

import pytest
from harness.metriclogs import brief

from tfrun.client.ui.compare import BadJobs, named, resumed_from
from tfrun.numerals import is_digits
from tfrun.protocol.fields import is_job_id
from tfrun.runner.metrics import LogMetrics
from tfrun.runner.metrics.jobmetrics import read_metrics, unread_bytes

ODD = ["²", "١٢", "12²", "", "-1", "1.5", " 1"]


def test_only_ascii_digits_are_a_number() -> None:
    assert is_digits("0") and is_digits("123") and is_job_id("42")
    assert not any(is_digits(text) or is_job_id(text) for text in ODD)


def test_a_job_s_pattern_capturing_a_superscript_step_reads_on() -> None:
    """A user's pattern whose step group caught "²" (a job's own text): the line's metric is read, counted, and
    the watch goes on (it raised ValueError, and the job's look failed each time)."""
    metrics = LogMetrics([r"^it (?P<step>\S+) \| mse=(?P<mse>\S+)"])
    assert brief(metrics.feed(b"it \xc2\xb2 | mse=0.5\nit 3 | mse=0.25\n")) == [
        (1, {"mse": 0.5}, None, "pattern"),
        (3, {"mse": 0.25}, None, "pattern"),
    ]


def test_a_table_s_epoch_cell_of_a_superscript_is_no_epoch() -> None:
    metrics = LogMetrics()
    rows = metrics.feed(b"epoch     train_loss  valid_loss  time\n\xc2\xb2         0.5         0.6         00:01\n")
    assert all(sample.epoch is None for sample in rows)


def test_a_cursor_or_a_compare_url_of_odd_digits_is_refused_or_ignored_in_words(tmp_path: Path) -> None:
    (tmp_path / "logmetrics.jsonl").write_text('{"step": 1, "loss": 2.0}\n')
    for cursor in ("log@²", "log@١٢"):
        assert [s.step for s in read_metrics(tmp_path, None, cursor=cursor)[1]] == [1]
        assert unread_bytes(tmp_path, cursor) == (tmp_path / "logmetrics.jsonl").stat().st_size
    with pytest.raises(BadJobs, match="is not BOX:ID"):
        named("local:²", {"local": object()})  # type: ignore[dict-item]
    assert resumed_from("3.²", 2) == [0, 0]
