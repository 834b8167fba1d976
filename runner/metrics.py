"""Metrics read from a job's raw output, for the alert rules of a script that does not use tfrun.jobs.

The daemon hands over output.log as it grows, in chunks cut anywhere. The unit here is a segment: the text
between two of \\r, \\n and \\b, which is one redraw of a progress bar or one printed line; a segment cut by
the end of a chunk waits for the next. Recognised, in this order (ANSI colour removed, bad UTF-8 replaced):

- the user's patterns (RE2, named groups), which win over the formats below where they find a metric;
- Keras 2 and 3 `model.fit` (verbose 1 and 2): `Epoch 3/10`, then `5/9 [===>...] - ETA: 0s - loss: 0.7428`;
- a tqdm bar with metrics in its postfix or description, Lightning's among them:
  `Epoch 0:  45%|████▌     | 45/100 [00:01<00:02, 25.0it/s, v_num=0, loss=1.23]`. One sample a step: a bar
  redraws a step more than once (Lightning twice, the first time with the previous step's loss), so a step is
  taken, as its last redraw, when the bar draws the next step or ends its line; a bar at 0 (a new epoch's, still
  showing the last epoch's loss) is no step;
- Lightning's rich bar, `Epoch 0/3  ━━━╺━━━ 4/20 0:00:01 • 0:00:07 2.35it/s v_num: 0.000`, its metrics on the
  lines under it, wrapped anywhere; again the last redraw of each step;
- a table: a header of names, one a loss (fastai's `epoch  train_loss  valid_loss  accuracy  time`), then its
  rows of numbers;
- a plain print with a loss: `Epoch 1, Avg Loss: 0.2345`, `step 100 loss=1.23`, `iter 100 | loss 1.2300`,
  `Training loss (for 1 batch) at step 100: 0.4312`, `{'loss': 0.23, 'step': 5}`, Hugging Face's
  `{'loss': '3.718', 'grad_norm': '1.875', ...}`, JSON lines. Values in any float notation, `nan`, `nan.0`,
  `inf.0`, `Infinity`, and tensors and NumPy scalars (`tensor(0.23, grad_fn=<...>)`,
  `tf.Tensor(0.23, shape=(), dtype=float32)`, `np.float32(0.23)`).

The step of a print is the one it says: `step N`, `iter N`, `| 200/ 2983 batches |`, and `[N/M (p%)]`
(PyTorch's examples), which counts samples, not batches. The batch size cannot be read from those prints (the
gap between two is the log interval times the batch size, and the percentage is N/M again), so that step is
the sample count: a step the line shows, where an alert points to. A printed step that restarts each epoch is
made global, by the epoch's length where the line prints it (`Step [100/600]`), else by the last step printed;
the line's own counter stays in Sample.printed_step, with the epoch (from the line, or from the last line that
named one alone: `Start of epoch 3`), for the alert to quote. A print with no step written over a tqdm bar
(tqdm.write, Hugging Face's Trainer) takes the count the bar is redrawn with right after it; any other is
counted. An evaluation's line (`Test set: Average loss: 0.2475`, `Validation loss: 0.31`, `Test loss: 0.31` after
training) is named `test_loss`, `val_loss` or `eval_loss`, which training_loss() never takes, and placed at the
step training got to when it says none.

tests/data/real/ holds the output of 14 training scripts, 13 of them published, and what each computed;
tests/test_corpus.py checks this reader on all of it (the README has the table).

Keras prints the running mean of each metric since the start of the epoch. An alert needs what the model does
now, so each redraw gives the mean over the batches since the previous redraw, decoded from two running means
(b batches, mean m): (b2*m2 - b1*m1) / (b2 - b1). That is exact up to Keras's rounding to 4 digits, which this
multiplies by about (b2 + b1) / (b2 - b1): late in a long epoch redrawn at every batch, an interval mean is only
good to a few hundredths (tfrun.jobs writes exact losses, and the daemon prefers them). Where that error passes
the interval mean itself (a loss near 0), decoding can give a negative mean: each interval mean is then clamped to
what the printed precision allows, [max(0, lo), hi] around it, for a metric never printed negative. The decoded
value is the middle of [lo, hi] (its bounds are its error either side), so the clamp is max(0, decoded): a
non-negative loss cannot have a negative interval mean, and 0 is the bound nearest to what was decoded. A fall
back to the printed running mean was not taken: it can lie above hi, which the printed means rule out. Values
printed once an epoch (val_*, and any that appear only on the epoch's last line) are taken as printed.

A daemon reads every job's whole output, up to tens of MB/s: a block with no "loss", "epoch" or tqdm rate in
it (nor a match of a user pattern) costs a few byte searches, and only the segments that hold one are looked at
(every segment while a table is printed: its rows hold none).
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field, fields
from typing import Any, Optional

from tfrun.constants import MAX_INT64
from tfrun.losses import EVALUATION_PREFIXES, training_loss_name

MAX_SEGMENT = 1 << 16  # longer segments are not metrics: skipped, and never buffered whole
# loss, Loss, LOSS, epoch, Epoch, EPOCH: every format has one; and a tqdm bar's rate, whose count is the step of
# the prints written over it
_MARKERS = (b"oss", b"OSS", b"poch", b"POCH", b"it/s", b"s/it")
_FLAT = bytes.maketrans(b"\r\b", b"\n\n")
_NEWLINE = re.compile(b"\n")
_ANSI = re.compile(rb"\x1b\[[0-9;?]*[ -/]*[@-~]|\x1b[@-Z\\-_]")
# Any float notation (`1e-3`, `.5`, `2.`), and NaN and Inf as Python, NumPy, JSON and Lightning (`nan.0`) print them.
_NUM = r"[-+]?(?:(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?|(?i:nan|inf(?:inity)?)(?:\.0)?)"
_END = r"(?![\w.:])"  # a number ends here: not `0s` (an ETA), not `1:02`, not `1.2.3`
_PRINT_END = r"(?![\w.:/])"  # in a print, not `9213/10000` either (a count, such as `Accuracy: 9213/10000`)
_NUMBER = re.compile(_NUM)
_KERAS_HEADER = re.compile(r"\s*Epoch (\d+)/\d+\s*")
_KERAS_BAR = re.compile(r"\s*(\d+)/(\d+|Unknown) ")
_KERAS_PAIR = re.compile(rf" - ([A-Za-z_][\w./]*): ({_NUM}){_END}")
# A tqdm bar: `desc:  45%|████▌     | 45/100 [00:01<00:02, 25.0it/s, loss=1.23]`, or `desc: 45it [00:01, ...]`
# without a total; what is in brackets holds a rate (`25.0it/s`, `?it/s`, `1.52s/it`, `3.1batch/s`), which tells it
# from a Keras bar (`5/9 [===>....]`) and from PyTorch's `[22400/60000 (37%)]`. Lightning's desc is `Epoch 0:`.
_TQDM = re.compile(
    r"(?P<desc>[^|\[\]]*?)(?:\s*(?:\d+%)?\|[^|]*\|)?\s*(?P<n>\d+)(?:/(?P<total>\d+|\?)|it)\s\["
    r"(?P<info>[^\]]*?(?:\?|\d)(?:[a-zA-Z]+/s|s/[a-zA-Z]+)[^\]]*)\]?"
)
# A table's header (fastai's `epoch     train_loss  valid_loss  accuracy  time`): names only, one a loss; the
# rows under it are its values, aligned (`0         1.024860    0.693555    0.512500  00:00`).
_TABLE_HEADER = re.compile(r"\s*(?:[A-Za-z_][\w@/.]*\s+)+[A-Za-z_][\w@/.]*\s*")
_TABLE_CELL = re.compile(rf"{_NUM}|\d+(?::\d\d)+|#na#")  # a number, a time (`00:01`), fastai's no-value
# Lightning's RichProgressBar (rich's bar, its count, elapsed • remaining, rate, metrics), ANSI codes removed:
# `Epoch 0/3  ━━━━╺━━━━ 4/20 0:00:01 • 0:00:07 2.35it/s v_num: 0.000`; the metrics that do not fit follow on
# lines of their own (`          train_loss: 5.692`), before the next redraw.
_RICH = re.compile(
    r"(?P<desc>[^\u2501\u2578\u257a]*?)\s*[\u2501\u2578\u257a]+\s+(?P<n>\d+)/(?P<total>\d+|\?)\s+"
    r"[\d:-]+\s+\u2022\s+[\d:-]+\s*(?P<rest>.*)"
)
_RICH_PAIR = re.compile(rf"([A-Za-z_][\w./]*): ({_NUM}){_END}")
# A line of metrics only, under the bar; rich wraps them anywhere (`train_loss:` / `467.306 val_loss:` / `497.969`).
_RICH_MORE = re.compile(rf"\s*(?:(?:[A-Za-z_][\w./]*:|{_NUM})\s*)+")
_DESC_EPOCH = re.compile(r"(?i)\bepoch\s*(\d+)")
_LIGHTNING_PAIR = re.compile(rf"([A-Za-z_][\w./]*)=({_NUM}){_END}")
# `step 100`, `Epoch [2/10]`, `'epoch': 3`, `'train/global_step': 100`; not `ms/batch 45.12` (a rate) nor
# `'epoch': 0.05` (a fraction).
_COUNTER = re.compile(
    r"(?i)\b(global_step|step|iteration|iter|batch|epoch)s?\b['\"]?\s*[\[(#:=]?\s*(\d+)(?:\s*/\s*(\d+))?(?!\.?\d)"
)
# A count before its name: word_language_model's `|   200/ 2983 batches |`.
_COUNTED = re.compile(r"(?i)(?<![\d.])(\d+)\s*/\s*(\d+)\s+(?:batch|step|iteration|iter)(?:es|s)?\b")
_SEEN = re.compile(r"\[\s*(\d+)\s*/\s*(\d+)\s*\(\s*\d+(?:\.\d*)?%\)\s*\]")  # PyTorch's `[22400/60000 (37%)]`
# A value printed as a tensor or a NumPy scalar: `tensor(0.2300, grad_fn=<NllLossBackward0>)`,
# `tf.Tensor(0.23, shape=(), dtype=float32)`, `np.float32(0.23)`; read as the number inside.
_WRAPPED = re.compile(
    rf"\b(?:tf\.Tensor|Tensor|tensor|(?:np|numpy)\.float(?:16|32|64)|array)\(\s*({_NUM})"
    r"(?:\s*,[^()]*(?:\([^()]*\)[^()]*)*)?\)"
)
_WRAPPERS = ("ensor(", "float", "array(")  # in every text _WRAPPED matches
# The one word before a metric's name: a qualifier (`train loss`, `Average loss`) or a model's part
# (`discriminator loss at step 0: 0.68`); none of the words that only join a sentence.
_JOINING_WORDS = frozenset({"a", "an", "and", "at", "for", "in", "is", "of", "on", "the", "to", "with"})
_EVAL_KINDS = {
    "val": "val",
    "valid": "val",
    "validation": "val",
    "test": "test",
    "testing": "test",
    "eval": "eval",
    "evaluation": "eval",
}
_EVAL_WORD = re.compile(rf"(?i)(?<![a-z])({'|'.join(_EVAL_KINDS)})(?![a-z])")
_PLAIN_QUALIFIERS = frozenset({"avg", "average", "mean", "total", "running"})  # dropped where the line names a kind
# `name: value`, `name=value`, `name value`, `'name': value` (dict reprs, JSON), `name │ value` (rich tables),
# and `name (anything) at step N: value` (keras-io's custom-loop guide).
_PRINT_PAIR = re.compile(
    r"(?i)(?<![\w./])(?:([a-z]+) )?((?:[a-z_]+/)*[a-z_]*(?:loss|accuracy|acc)(?:_\w*)?|lr|learning_rate|[a-z_]*grad_norm\w*)['\"]?"
    r"(?:\s*\([^()]*\))?(?:\s+at\s+(?:step|iteration|iter|batch|epoch)\s+\d+)?"
    rf"\s*(?:[:=\u2502|]\s*|\s)['\"]?({_NUM}){_PRINT_END}"
)


class PatternError(ValueError):
    """A user pattern that cannot be used; str() is a one-line reason."""


@dataclass
class Sample:
    """Metrics of one moment of training."""

    step: int  # global training step (batches since the start of training), best known
    values: dict[str, float]  # e.g. {"loss": 0.2345, "accuracy": 0.91}; NaN and Inf kept
    epoch: Optional[int] = None  # as printed: 1-based for Keras ("Epoch 3/10" is 3), 0-based for Lightning
    source: str = "keras"  # "keras", "lightning", "print" or "pattern" (a user pattern)
    printed_step: Optional[int] = None  # the line's own counter (a bar's batch, `step 100` of epoch 2), if any


_MAX_COUNTER_DIGITS = 15  # a printed step or epoch longer than this is no training's count


def plausible(step: Any, epoch: Any = None) -> bool:
    """Whether `step` (and `epoch`, if any) can be a training counter: integers from 0 to what SQLite and
    the protocol hold. A job's output is input like any other: a line with `step 10^30` is no metric."""
    counters = (step,) if epoch is None else (step, epoch)
    return all(type(c) is int and 0 <= c <= MAX_INT64 for c in counters)


def training_loss(values: Mapping[str, float]) -> Optional[float]:
    """The loss to watch among a sample's values (tfrun/losses.py says which, for the client's charts too)."""
    name = training_loss_name(values)
    return None if name is None else values[name]


@dataclass
class _Keras:
    """Where model.fit is: the epoch, and the running means of its last redraw."""

    epoch: Optional[int] = None
    open: bool = False  # between `Epoch k/N` and the epoch's last line; other bars (evaluate) are not training
    size: Optional[int] = None  # batches an epoch, once Keras knows it
    batch: int = 0  # the batch of the last redraw
    means: dict[str, float] = field(default_factory=dict)  # its running means
    base: int = 0  # batches of the epochs before this one
    signed: list[str] = field(default_factory=list)  # metrics printed negative at least once: never clamped


@dataclass
class _Counters:
    """Steps of the formats that do not say them whole."""

    bar_epoch: Optional[int] = None  # of a tqdm bar (Lightning's, or any with a metric), as its desc says
    bar_batch: int = 0  # its count
    bar_size: Optional[int] = None  # its total
    bar_base: int = 0  # batches of the epochs before
    # The last redraw of the bar's current step, as JSON (step, values, epoch, batch, source): a bar redraws a
    # step more than once (Lightning twice, the first time with the previous step's loss), so a step is taken
    # when the next one is drawn or the bar's line ends.
    bar_held: Optional[dict[str, Any]] = None
    header_epoch: Optional[int] = None  # the epoch of a line that names one and no metric (`Start of epoch 3`)
    # Each tqdm bar's [base, last count], by its total: a bar of the same total whose count goes back is the next
    # epoch's (base grows by the total); a bar of another total is another bar (an evaluation's).
    bar_counts: dict[str, list[int]] = field(default_factory=dict)
    bar_live: bool = False  # a tqdm bar is being redrawn: its last redraw ended with \r, not its line
    # A training print with no step written over a tqdm bar (tqdm.write, Hugging Face's Trainer's `{'loss': ...}`),
    # as JSON (values, epoch): tqdm redraws the bar right after it, with the count the print belongs to.
    waiting: Optional[dict[str, Any]] = None
    table: Optional[list[str]] = None  # the columns of the table being printed, until a line that is no row
    # The last redraw of a rich bar, as JSON (step, values, epoch, batch, source, desc), its metrics growing with
    # the lines under it: taken when the bar is redrawn at another step, or a line that is not its own comes.
    rich_held: Optional[dict[str, Any]] = None
    prints: int = 0  # samples from plain prints
    print_last: Optional[int] = None  # the last step counter printed
    print_offset: int = 0  # added to printed steps that restart at each epoch
    print_epoch: Optional[int] = None  # the last epoch counter printed
    patterns: int = 0  # samples from user patterns
    last_step: int = 0  # the step of the last sample: where an evaluation that says no step is placed


class LogMetrics:
    """Feed it the raw bytes of a job's output in order; it answers the metric samples in them."""

    def __init__(self, patterns: Sequence[str] = ()) -> None:
        """`patterns`: user regexes with named groups; each named group that matches a number is a metric,
        groups named `step` / `epoch` are counters. RE2, so that no pattern can stall the daemon."""
        self.patterns = [_compile(pattern) for pattern in patterns]
        self.pending = b""  # the segment cut by the end of the last chunk
        self.skipping = False  # inside a segment longer than MAX_SEGMENT, until its end
        self.keras = _Keras()
        self.counters = _Counters()
        self.why = ""  # how the last segment looked at was read, in a few words: `tfrun metrics --explain`

    def feed(self, data: bytes) -> list[Sample]:
        """Samples found in this chunk (a partial segment at the end is kept for the next call)."""
        if self.skipping:
            ends = [cut for cut in (data.find(b"\n"), data.find(b"\r"), data.find(b"\b")) if cut >= 0]
            if not ends:
                return []
            data, self.skipping = data[min(ends) :], False
        block = self.pending + data if self.pending else data
        cut = max(block.rfind(b"\n"), block.rfind(b"\r"), block.rfind(b"\b")) + 1
        self.pending = block[cut:]
        if len(self.pending) > MAX_SEGMENT:
            self.pending, self.skipping = b"", True
        return self._scan(block[:cut]) if cut else []

    def _scan(self, block: bytes) -> list[Sample]:
        text = _ANSI.sub(b"", block) if b"\x1b" in block else block
        self.why = "not looked at: no `loss` or `epoch` in it, and no --metric pattern matches"
        table = self.counters.table is not None  # its rows hold no marker: every segment is looked at
        if not self.patterns and not table and not any(marker in text for marker in _MARKERS):
            return []
        flat = text.translate(_FLAT)  # every segment a line: one search per segment, ^ and $ at its ends
        segments = _segments(flat, every=table)
        matched = self._pattern_matches(flat, segments)
        samples = []
        for start in sorted(segments):
            end = segments[start]
            if end - start > MAX_SEGMENT:
                continue
            try:
                sample = self._pattern_sample(matched[start]) if start in matched else None
                found = [sample] if sample is not None else []
                if sample is None:
                    found = self._parse(flat[start:end].decode("utf-8", "replace"), text[end] == ord("\n"))
            except (ValueError, OverflowError):  # a count of 4,300+ digits: no training printed that
                found, self.why = [], "a number too long to be a metric or a count"
            for sample in found:
                if not plausible(sample.step, sample.epoch):
                    self.why = f"step {sample.step} or epoch {sample.epoch} is no training's count: dropped"
                else:
                    samples.append(sample)
                    self.counters.last_step = sample.step
            if not table and self.counters.table is not None:  # a table's header: its rows may follow in this block
                return samples + self._scan(text[end + 1 :])
        return samples

    def _pattern_matches(self, flat: bytes, segments: dict[int, int]) -> dict[int, dict[bytes, Optional[bytes]]]:
        """The named groups of the user patterns in each segment that one matches, by the segment's start;
        those segments are added to `segments`."""
        matched: dict[int, dict[bytes, Optional[bytes]]] = {}
        for pattern in self.patterns:
            found = pattern.search(flat)
            while found is not None:
                start = flat.rfind(b"\n", 0, found.start()) + 1
                end = flat.find(b"\n", found.start())
                segments[start] = end
                groups = matched.setdefault(start, {})
                for name, value in found.groupdict().items():
                    groups.setdefault(name, value)
                found = pattern.search(flat, end + 1)
        return matched

    def _pattern_sample(self, groups: Mapping[bytes, Optional[bytes]]) -> Optional[Sample]:
        counters: dict[str, int] = {}
        values: dict[str, float] = {}
        for raw_name, raw in groups.items():
            name, text = raw_name.decode(), (raw or b"").decode("utf-8", "replace").strip()
            if name in ("step", "epoch"):
                if text.isdigit():
                    counters[name] = int(text)
            elif _NUMBER.fullmatch(text):
                values[name] = _float(text)
        if not values:
            self.why = "a --metric pattern matched, but none of its named groups holds a number"
            return None
        self.counters.patterns += 1
        self.why = "a --metric pattern" + (
            " (its `step` group)" if "step" in counters else "; no `step` group: counted"
        )
        return Sample(counters.get("step", self.counters.patterns), values, counters.get("epoch"), "pattern")

    def _parse(self, segment: str, line_end: bool) -> list[Sample]:
        if self.counters.table is not None:
            row = self._table_row(segment)
            if row is not None:
                return [row]
            if line_end and segment.strip():
                self.counters.table = None  # a line that is no row: the table is over
        rich = _RICH.match(segment)
        if rich:
            return self._rich(rich)
        held = self.counters.rich_held
        if held is not None and _RICH_MORE.fullmatch(segment):
            held["text"] += " " + segment.strip()
            self.why = f"a metric of the rich bar above: step {held['step']}"
            return []
        released = self._rich_release()
        if released:
            return [*released, *self._parse(segment, line_end)]
        header = _KERAS_HEADER.fullmatch(segment)
        if header:
            self._keras_epoch(int(header.group(1)))
            self.why = "Keras: an epoch begins"
            return []
        bar = _KERAS_BAR.match(segment)
        sample: Optional[Sample]
        if bar:
            pairs = {name: _float(value) for name, value in _KERAS_PAIR.findall(segment, bar.end())}
            if pairs:
                size = int(bar.group(2)) if bar.group(2).isdigit() else None
                sample = self._keras_bar(int(bar.group(1)), size, pairs, line_end)
                return [sample] if sample is not None else []
        tqdm = _TQDM.match(segment)
        if tqdm:
            count = self._bar_count(int(tqdm.group("n")), tqdm.group("total"))
            self.counters.bar_live = not line_end
            return [*self._release(count), *self._bar(tqdm, line_end)]
        released = self._release(None)  # not the bar: the waiting print is counted
        sample = self._print(segment)
        return [*released, sample] if sample is not None else released

    def _rich(self, bar: re.Match[str]) -> list[Sample]:
        """A redraw of a rich bar: the step it shows is held, and its metrics gathered (see rich_held)."""
        desc, n, total = bar.group("desc").strip(), int(bar.group("n")), bar.group("total")
        found = _DESC_EPOCH.search(desc)
        epoch = int(found.group(1)) if found else None
        count = self._bar_count(n, total)
        lightning = epoch is not None and desc.startswith("Epoch") and total.isdigit()
        step = epoch * int(total) + n if lightning and epoch is not None else count
        held = self.counters.rich_held
        released = self._rich_release() if held is not None and (held["step"], held["desc"]) != (step, desc) else []
        self.counters.rich_held = {
            "step": step,
            "text": bar.group("rest").strip(),
            "epoch": epoch,
            "batch": n,
            "source": "lightning" if lightning else "bar",
            "desc": desc,
        }
        self.why = f"a rich bar: step {step}, its count {n}; its metrics follow it, the last redraw of a step is taken"
        return released

    def _rich_release(self) -> list[Sample]:
        """The held rich redraw as a sample; none for a bar at 0 (before its first step, its metrics are the last
        epoch's) or with no metric."""
        held, self.counters.rich_held = self.counters.rich_held, None
        if held is None or not held["batch"]:
            return []
        values = {name: _json_float(_float(v)) for name, v in _RICH_PAIR.findall(held.pop("text")) if name != "v_num"}
        return [_held_sample({**held, "values": values})] if values else []

    def _bar_count(self, n: int, total: Optional[str]) -> int:
        """A tqdm bar's count made global over epochs (see _Counters.bar_counts)."""
        counts = self.counters.bar_counts
        base, last = counts.get(total or "?", (0, -1))
        if n < last:
            base += int(total) if total and total.isdigit() else last
        counts[total or "?"] = [base, n]
        return base + n

    def _release(self, step: Optional[int]) -> list[Sample]:
        """The waiting print, if any, at `step` (the bar's count), or counted when the bar was not redrawn."""
        waiting, self.counters.waiting = self.counters.waiting, None
        if waiting is None:
            return []
        values = {name: float(value) for name, value in waiting["values"].items()}
        return [Sample(self._counted_step() if step is None else step, values, waiting["epoch"], "print")]

    def _counted_step(self) -> int:
        """The step of a print that says none: its count of such prints, or the last step printed where that is
        further (`epoch 1 done, loss 0.6` after `step 40`: at 40)."""
        counters = self.counters
        counters.prints += 1
        printed_before = 0 if counters.print_last is None else counters.print_offset + counters.print_last
        return max(counters.prints, printed_before)

    def _keras_epoch(self, epoch: int) -> None:
        keras = self.keras
        self.keras = _Keras(epoch=epoch, open=True, base=keras.base + (keras.size or keras.batch), signed=keras.signed)

    def _keras_bar(
        self, batch: int, size: Optional[int], printed: dict[str, float], line_end: bool
    ) -> Optional[Sample]:
        keras = self.keras
        if not keras.open or batch < keras.batch or (size and keras.size and size != keras.size):
            self.why = "Keras: a bar outside an epoch of fit (evaluate or predict): not training"
            return None
        keras.size = size or keras.size
        values = {}
        for name, value in printed.items():
            if value < 0 and name not in keras.signed:
                keras.signed.append(name)
            if name.startswith("val_") or name not in keras.means:
                values[name] = value  # once an epoch, or the first redraw (a mean since the epoch began)
            elif batch > keras.batch:
                mean = _interval_mean(keras.batch, keras.means[name], batch, value)
                values[name] = mean if name in keras.signed else max(mean, 0.0)
        self.why = f"Keras fit: batch {batch} of epoch {keras.epoch}; " + (
            f"mean of batches {keras.batch + 1}-{batch}, worked back from two running means"
            if keras.means
            else "the running mean since the epoch began"
        )
        keras.means = {name: value for name, value in printed.items() if not name.startswith("val_")}
        keras.batch = batch
        if line_end and keras.size is not None and batch >= keras.size:
            keras.open = False
        return Sample(keras.base + batch, values, keras.epoch, "keras", batch) if values else None

    def _bar(self, bar: re.Match[str], line_end: bool) -> list[Sample]:
        """The samples of the steps this redraw of a tqdm bar closes: one per step, its last redraw (see
        bar_held). Its step is the bar's count, made global over the bars of earlier epochs: a bar whose desc
        names another epoch, or whose count goes back, is a new epoch's."""
        desc, n, total = bar.group("desc"), int(bar.group("n")), bar.group("total")
        found = _DESC_EPOCH.search(desc)
        epoch = int(found.group(1)) if found else None
        values = {name: _float(value) for name, value in _LIGHTNING_PAIR.findall(bar.group("info")) if name != "v_num"}
        # set_description's metrics: `loss 0.2300:  45%|...`
        for qualifier, name, value in _PRINT_PAIR.findall(desc.rstrip().rstrip(":")):
            values.setdefault(_metric_name(qualifier.lower(), name.lower(), ""), _float(value))
        if not values:  # an evaluation's bar, or one that shows no metric: its count is not training's
            self.why = "a progress bar with no metric in it"
            return []
        if n == 0:
            self.why = "a bar before its first step: its metrics are the last epoch's"
            return []
        counters = self.counters
        new = epoch != counters.bar_epoch if epoch is not None else n < counters.bar_batch
        if counters.bar_batch and new:
            counters.bar_base += counters.bar_size or counters.bar_batch
        counters.bar_epoch, counters.bar_batch = epoch, n
        counters.bar_size = int(total) if total and total.isdigit() else None
        # Lightning's bar (its `Epoch 0:` desc, the logger's `v_num` in the postfix) counts epochs from 0 and its
        # bars are all as long; a user's own `Epoch 1:` may count from 1.
        lightning = found is not None and desc.lstrip().startswith("Epoch") and "v_num=" in bar.group("info")
        # Lightning's `Epoch 0:` counts from 0 and its bars are all as long: a log read from the middle of a
        # run (a job restarted from a checkpoint) still gives the run's global step.
        step = epoch * counters.bar_size if lightning and epoch and counters.bar_size else counters.bar_base
        step += n
        self.why = (
            f"{'Lightning' if lightning else 'tqdm'} bar: step {step}, its count {n}"
            + (f" after {step - n} of earlier epochs" if step != n else "")
            + "; a step's last redraw is taken when the next is drawn or the line ends"
        )
        held = counters.bar_held
        closed = [_held_sample(held)] if held is not None and held["step"] != step else []
        current = {
            "step": step,
            "values": {name: _json_float(value) for name, value in values.items()},
            "epoch": epoch,
            "batch": n,
            "source": "lightning" if lightning else "bar",
        }
        if line_end:  # the bar's last redraw, closed with a newline: no redraw of this step follows
            counters.bar_held = None
            return [*closed, _held_sample(current)]
        counters.bar_held = current
        return closed

    def _print(self, segment: str) -> Optional[Sample]:
        if any(wrapper in segment for wrapper in _WRAPPERS):  # a few byte searches, not a regex a line
            segment = _WRAPPED.sub(r"\1", segment)
        pairs = [
            (qualifier.lower(), name.lower(), _float(value)) for qualifier, name, value in _PRINT_PAIR.findall(segment)
        ]
        kind = _eval_kind(segment, pairs)
        values: dict[str, float] = {}
        for qualifier, name, value in pairs:
            values.setdefault(_metric_name(qualifier, name, kind), value)
        counters = self.counters
        step: Optional[int] = None
        printed: Optional[int] = None
        total: Optional[str] = None
        epoch: Optional[int] = None
        for counter in _COUNTER.finditer(segment):
            if len(counter.group(2)) > _MAX_COUNTER_DIGITS:  # not a count: it must not move the step along
                continue
            if counter.group(1).lower() == "epoch":
                epoch = epoch if epoch is not None else int(counter.group(2))
            elif printed is None:
                printed, total = int(counter.group(2)), counter.group(3)
        if not any("loss" in name for name in values):
            self.why = "no name with `loss` and a number after it"
            if not values and _TABLE_HEADER.fullmatch(segment) and "loss" in segment.lower():
                self.counters.table = segment.split()
                self.why = "a table's header: the rows under it are its values"
                return None
            if epoch is not None and printed is None:  # `Start of epoch 3`: the epoch of the prints that follow
                counters.header_epoch = epoch
                self.why = f"epoch {epoch} begins: the epoch of the prints that follow"
            return None
        if epoch is None:
            epoch = counters.header_epoch
        for counted in (_SEEN.search(segment), _COUNTED.search(segment)) if printed is None else ():
            if printed is None and counted and len(counted.group(1)) <= _MAX_COUNTER_DIGITS:
                printed, total = int(counted.group(1)), counted.group(2)
        if printed is not None:
            step = self._print_step(printed, total, epoch)
            self.why = f"a print: step {step}, from its counter {printed}" + (
                f" after {step - printed} of earlier epochs" if step != printed else ""
            )
        evaluation = all(name.startswith(EVALUATION_PREFIXES) for name in values if "loss" in name)
        if step is None and evaluation:
            step = counters.last_step  # after the training it evaluates, not a training print of its own
            self.why = f"an evaluation's print: placed at step {step}, where training got to"
        elif step is None and counters.bar_live:
            counters.waiting = {"values": {name: _json_float(v) for name, v in values.items()}, "epoch": epoch}
            self.why = "a print with no step, over a tqdm bar: its step is the count the bar is redrawn with next"
            return None
        elif step is None:
            step = self._counted_step()
            self.why = f"a print with no step in it: step {step}, " + (
                "its count of such prints" if step == counters.prints else "the last step printed"
            )
        counters.print_epoch = epoch if epoch is not None else counters.print_epoch
        return Sample(step, values, epoch, "print", printed)

    def _table_row(self, segment: str) -> Optional[Sample]:
        """A row under a table's header, as a sample: its `epoch` column the epoch, its step counted."""
        columns, cells = self.counters.table or [], segment.split()
        if len(cells) != len(columns) or not all(_TABLE_CELL.fullmatch(cell) for cell in cells):
            return None
        values: dict[str, float] = {}
        epoch: Optional[int] = None
        for name, cell in zip(columns, cells):
            if name.lower() == "epoch" and cell.isdigit():
                epoch = int(cell)
            elif _NUMBER.fullmatch(cell):
                values[_metric_name("", name.lower(), "")] = _float(cell)
        self.counters.prints += 1
        self.why = f"a row of the table {' '.join(columns)}: step {self.counters.prints}, its count of rows"
        return Sample(self.counters.prints, values, epoch, "print") if values else None

    def _print_step(self, printed: int, total: Optional[str], epoch: Optional[int]) -> int:
        """A printed step made global: one that goes back (or repeats in a new epoch) restarted with an epoch."""
        counters = self.counters
        last = counters.print_last
        new_epoch = epoch is not None and epoch != counters.print_epoch
        if last is not None and (printed < last or (printed == last and new_epoch)):
            counters.print_offset += int(total) if total else last + 1
        counters.print_last = printed
        return counters.print_offset + printed

    def state(self) -> dict[str, Any]:
        """Where reading has got to, as JSON, so that a restarted daemon goes on where it stopped."""
        keras = asdict(self.keras)
        keras["means"] = {name: _json_float(value) for name, value in self.keras.means.items()}
        return {
            "pending": self.pending.decode("latin-1"),  # any bytes, one code point each
            "skipping": self.skipping,
            "keras": keras,
            "counters": asdict(self.counters),
        }

    @classmethod
    def restore(cls, state: dict[str, Any], patterns: Sequence[str] = ()) -> LogMetrics:
        metrics = cls(patterns)
        metrics.pending = state["pending"].encode("latin-1")
        metrics.skipping = bool(state["skipping"])
        keras = dict(state["keras"])
        keras["means"] = {name: float(value) for name, value in keras["means"].items()}
        metrics.keras = _Keras(**keras)
        known = {counter.name for counter in fields(_Counters)}  # a state saved before a counter was added or dropped
        metrics.counters = _Counters(**{name: value for name, value in state["counters"].items() if name in known})
        return metrics


def _compile(pattern: str) -> Any:
    """A user pattern as RE2 over bytes, for one segment at a time; PatternError if it cannot be one."""
    import re2  # google-re2: linear time whatever the pattern

    options = re2.Options()
    options.log_errors = False
    options.never_nl = True  # segments are lines of the flattened block: a match never spans two
    try:
        re2.compile(pattern.encode(), options)  # first as written, so that an error quotes only the user's text
    except re2.error as exc:
        reason = exc.args[0] if exc.args else ""
        text = reason.decode("utf-8", "replace") if isinstance(reason, bytes) else str(reason)
        raise PatternError(f"invalid pattern {pattern!r}: {text}") from None
    compiled = re2.compile(f"(?m){pattern}".encode(), options)  # ^ and $ at the ends of each segment
    if not set(compiled.groupindex) - {b"step", b"epoch"}:
        raise PatternError(f"pattern {pattern!r} names no metric: name a group, e.g. loss=(?P<loss>\\S+)")
    return compiled


def _segments(flat: bytes, every: bool = False) -> dict[int, int]:
    """Start and end of each segment (line of `flat`) that holds a marker, found with one search each; of every
    segment with `every`."""
    if every:
        ends = [found.start() for found in _NEWLINE.finditer(flat)]
        return dict(zip([0, *(end + 1 for end in ends[:-1])], ends))
    segments: dict[int, int] = {}
    for marker in _MARKERS:
        at = flat.find(marker)
        while at >= 0:
            start = flat.rfind(b"\n", 0, at) + 1
            end = flat.find(b"\n", at)
            segments[start] = end
            at = flat.find(marker, end)
    return segments


def _eval_kind(segment: str, pairs: list[tuple[str, str, float]]) -> str:
    """`val`, `test` or `eval` when the line is an evaluation's and its names do not say so themselves
    (`Test set: Average loss: 0.2475`, `Validation loss: 0.31`); "" for a training line, or one whose names
    tell training and evaluation apart already (`loss=0.25 val_loss=0.31`, `train loss 2.1, val loss 2.2`)."""
    if any(qualifier in _EVAL_KINDS or name.startswith(EVALUATION_PREFIXES) for qualifier, name, _ in pairs):
        return ""
    found = _EVAL_WORD.search(segment)
    return _EVAL_KINDS[found.group(1).lower()] if found else ""


def _metric_name(qualifier: str, name: str, kind: str) -> str:
    """A printed name as a metric's: `Training loss` is `training_loss`, `Validation loss` `val_loss`, and on
    an evaluation's line (`kind`) `Average loss` is `test_loss`, so that training_loss() never takes it."""
    qualifier = "" if qualifier in _JOINING_WORDS else _EVAL_KINDS.get(qualifier, qualifier)
    if kind:
        qualifier = kind if not qualifier or qualifier in _PLAIN_QUALIFIERS else f"{kind}_{qualifier}"
    return f"{qualifier}_{name}" if qualifier else name


def _held_sample(held: Mapping[str, Any]) -> Sample:
    """A bar's redraw kept in _Counters.bar_held as the sample it is."""
    values = {name: float(value) for name, value in held["values"].items()}
    return Sample(held["step"], values, held["epoch"], held["source"], held["batch"])


def _float(text: str) -> float:
    """A number as printed: Lightning's tqdm postfix prints NaN and Inf as `nan.0` and `inf.0`, which float()
    refuses, and a NaN read as no value is a NaN that raises no alert."""
    return float(text[:-2] if text.endswith(".0") and text[-3:-2].isalpha() else text)


def _interval_mean(batch1: int, mean1: float, batch2: int, mean2: float) -> float:
    """The mean over batches batch1+1..batch2, from the running means after batch1 and batch2."""
    if not (math.isfinite(mean1) and math.isfinite(mean2)):
        return mean2  # NaN or Inf since the epoch began stays so: report it as printed
    return (batch2 * mean2 - batch1 * mean1) / (batch2 - batch1)


def _json_float(value: float) -> Any:
    """JSON has no NaN or Inf: those as their names, which float() reads back."""
    return value if math.isfinite(value) else str(value)
