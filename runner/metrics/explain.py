"""`tfrun metrics JOB --explain`: how the daemon reads a job's output, line by line, so that a user sees why a
loss is missed (and what `--metric` pattern would catch it) or why it lands at the step it does.

The log is read again from its start with a fresh reader (runner/metrics/), one segment (a line, or one redraw
of a progress bar) at a time, and each segment's reading is kept with the reader's own account of it. A log has
thousands of lines of a few shapes, so one line of each shape (its digits, spacing and a bar's graphic aside) is
shown, with how many lines have that shape: the first that gave a metric, or the first that gave a training loss
where an earlier one gave none. When there are more shapes than the limit, those that gave a metric
are chosen first, then those with a metric's word that gave none (the misses), then the rest; the chosen ones are
shown in the order the log first shows them.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from tfrun.losses import training_loss_name
from tfrun.protocol.watching import LineReading
from tfrun.shorten import shorten

from ..logs.lines import display, plain
from . import LogMetrics, Sample

EXPLAIN_LIMIT_BYTES = 8 << 20  # read this much of the log, from its start: enough for every shape it prints
MAX_SHAPES = 10_000  # distinct shapes remembered; a log of more is mostly noise
MAX_SHOWN_CHARS = 160
_SEGMENT = re.compile(rb"[^\r\n\b]*[\r\n\b]")
_DIGIT = re.compile(r"\d")
_NUMBERS = re.compile(r"\d+(?:\.\d+)?(?:[eE][-+]?\d+)?")
_BAR_GRAPHIC = re.compile(r"\|[ #\u2588-\u258f]*\|")  # a tqdm bar's `|███▌      |`, which grows with its count
_SPACES = re.compile(r"\s+")  # and the padding of its numbers (`  3%`, ` 12%`)
_METRIC_WORD = re.compile(r"(?i)loss|acc|epoch|step|iter|lr\b")


@dataclass
class _Shape:
    first: int  # the index of its first line
    reading: LineReading
    has_metric_word: bool


def explain(path: Path, patterns: Sequence[str], limit: int) -> tuple[list[LineReading], bool]:
    """Up to `limit` readings, one a shape, and whether the log was longer than what was read."""
    with open(path, "rb") as f:
        data = f.read(EXPLAIN_LIMIT_BYTES + 1)
    cut = len(data) > EXPLAIN_LIMIT_BYTES
    metrics = LogMetrics(patterns)
    shapes: dict[str, _Shape] = {}
    for index, found in enumerate(_SEGMENT.finditer(data[:EXPLAIN_LIMIT_BYTES])):
        segment = found.group()
        samples = metrics.feed(segment)
        text = plain(display(segment[:-1])).strip()
        if not samples and not _DIGIT.search(text):  # a line with no number holds no metric, but a box's rule
            continue  # gives the box's
        shape = _SPACES.sub(" ", _NUMBERS.sub("#", _BAR_GRAPHIC.sub("|", text)))[:MAX_SHOWN_CHARS]
        known = shapes.get(shape)
        if known is not None:
            known.reading.lines += 1
            if samples and _shows_more(known.reading, samples[-1]):
                known.reading = _reading(text, samples, metrics.why, known.reading.lines)
            continue
        if len(shapes) < MAX_SHAPES:
            shapes[shape] = _Shape(index, _reading(text, samples, metrics.why, 1), bool(_METRIC_WORD.search(text)))
    ordered = sorted(shapes.values(), key=lambda s: (not s.reading.values, not s.has_metric_word, s.first))
    chosen = sorted(ordered[:limit], key=lambda s: s.first)
    return [shape.reading for shape in chosen], cut


def _shows_more(shown: LineReading, sample: Sample) -> bool:
    """Whether a line of a shape shows more than the one shown: a metric where it showed none, or the training
    loss where it showed none (a box of stable-baselines3's before its learning starts has no loss)."""
    if not shown.values:
        return True
    return training_loss_name(shown.values) is None and training_loss_name(sample.values) is not None


def _reading(text: str, samples: list[Sample], why: str, lines: int) -> LineReading:
    """One shown line: what was read from it (the last sample it gave) and why."""
    shown = shorten(text, MAX_SHOWN_CHARS)
    if not samples:
        return LineReading(line=shown, lines=lines, why=why)
    last = samples[-1]
    return LineReading(line=shown, lines=lines, why=why, values=dict(last.values), step=last.step, epoch=last.epoch)
