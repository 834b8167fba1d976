"""Progress bars: Keras's `model.fit` bar (its running means worked back into the mean of each interval), tqdm's
(Lightning's among them) and Lightning's rich bar, one sample a step, at the step the bar counts."""

from __future__ import annotations

import math
import re
from typing import Optional

from tfrun.numerals import is_digits

from .state import Keras, Reading, Sample, held_sample
from .text import END, NUM, PRINT_PAIR, json_float, metric_name, parse_float

KERAS_HEADER = re.compile(r"\s*Epoch (\d+)/\d+\s*")
KERAS_BAR = re.compile(r"\s*(\d+)/(\d+|Unknown) ")
KERAS_PAIR = re.compile(rf" - ([A-Za-z_][\w./]*): ({NUM}){END}")
# A tqdm bar: `desc:  45%|████▌     | 45/100 [00:01<00:02, 25.0it/s, loss=1.23]`, or `desc: 45it [00:01, ...]`
# without a total; what is in brackets holds a rate (`25.0it/s`, `?it/s`, `1.52s/it`, `3.1batch/s`), which tells it
# from a Keras bar (`5/9 [===>....]`) and from PyTorch's `[22400/60000 (37%)]`. Lightning's desc is `Epoch 0:`.
TQDM = re.compile(
    r"(?P<desc>[^|\[\]]*?)(?:\s*(?:\d+%)?\|[^|]*\|)?\s*(?P<n>\d+)(?:/(?P<total>\d+|\?)|it)\s\["
    r"(?P<info>[^\]]*?(?:\?|\d)(?:[a-zA-Z]+/s|s/[a-zA-Z]+)[^\]]*)\]?"
)
# Lightning's RichProgressBar (rich's bar, its count, elapsed • remaining, rate, metrics), ANSI codes removed:
# `Epoch 0/3  ━━━━╺━━━━ 4/20 0:00:01 • 0:00:07 2.35it/s v_num: 0.000`; the metrics that do not fit follow on
# lines of their own (`          train_loss: 5.692`), before the next redraw.
RICH_CHARS = ("\u2501", "\u2578", "\u257a")  # the bar's own: RICH matches no segment without one
RICH = re.compile(
    r"(?P<desc>[^\u2501\u2578\u257a]*?)\s*[\u2501\u2578\u257a]+\s+(?P<n>\d+)/(?P<total>\d+|\?)\s+"
    r"[\d:-]+\s+\u2022\s+[\d:-]+\s*(?P<rest>.*)"
)
_RICH_PAIR = re.compile(rf"([A-Za-z_][\w./]*): ({NUM}){END}")
# A line of metrics only, under the bar; rich wraps them anywhere (`train_loss:` / `467.306 val_loss:` / `497.969`).
RICH_MORE = re.compile(rf"\s*(?:(?:[A-Za-z_][\w./]*:|{NUM})\s*)+")
_DESC_EPOCH = re.compile(r"(?i)\bepoch\s*(\d+)")
_LIGHTNING_PAIR = re.compile(rf"([A-Za-z_][\w./]*)=({NUM}){END}")


MAX_BARS = 16  # tqdm bars of different totals whose counts are remembered (runner/metrics/state.py bar_counts)


class ProgressBars:
    """The reader's part that reads progress bars, on the reading it shares with the other (state.py)."""

    def __init__(self, reading: Reading) -> None:
        self.reading = reading

    def keras_epoch(self, epoch: int) -> None:
        """`Epoch k/N`: its batches go on from the last epoch's, also where k goes back (fit called again, as
        a tutorial's next training loop does: the log starts over, the steps do not)."""
        keras = self.reading.keras
        self.reading.keras = Keras(
            epoch=epoch, open=True, base=keras.base + (keras.size or keras.batch), signed=keras.signed
        )
        self.reading.why = "Keras: an epoch begins"
        if keras.epoch is not None and epoch <= keras.epoch:
            self.reading.why = (
                f"Keras: epoch {epoch} after epoch {keras.epoch}, the log starts over (fit again): its steps go on"
                f" from step {self.reading.keras.base}"
            )

    def keras_bar(self, batch: int, size: Optional[int], printed: dict[str, float], line_end: bool) -> Optional[Sample]:
        keras = self.reading.keras
        if not keras.open or batch < keras.batch or (size and keras.size and size != keras.size):
            self.reading.why = "Keras: a bar outside an epoch of fit (evaluate or predict): not training"
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
        self.reading.why = f"Keras fit: batch {batch} of epoch {keras.epoch}; " + (
            f"mean of batches {keras.batch + 1}-{batch}, worked back from two running means"
            if keras.means
            else "the running mean since the epoch began"
        )
        keras.means = {name: value for name, value in printed.items() if not name.startswith("val_")}
        keras.batch = batch
        if line_end and keras.size is not None and batch >= keras.size:
            keras.open = False
        return Sample(keras.base + batch, values, keras.epoch, "keras", batch) if values else None

    def tqdm_bar(self, bar: re.Match[str], line_end: bool) -> list[Sample]:
        """The samples of the steps this redraw of a tqdm bar closes: one per step, its last redraw (see
        bar_held). Its step is the bar's count, made global over the bars of earlier epochs: a bar whose desc
        names another epoch, or whose count goes back, is a new epoch's."""
        desc, n, total = bar.group("desc"), int(bar.group("n")), bar.group("total")
        found = _DESC_EPOCH.search(desc)
        epoch = int(found.group(1)) if found else None
        values = {
            name: parse_float(value) for name, value in _LIGHTNING_PAIR.findall(bar.group("info")) if name != "v_num"
        }
        # set_description's metrics: `loss 0.2300:  45%|...`
        for qualifier, name, value in PRINT_PAIR.findall(desc.rstrip().rstrip(":")):
            values.setdefault(metric_name(qualifier.lower(), name.lower(), ""), parse_float(value))
        if not values:  # an evaluation's bar, or one that shows no metric: its count is not training's
            self.reading.why = "a progress bar with no metric in it"
            return []
        if n == 0:
            self.reading.why = "a bar before its first step: its metrics are the last epoch's"
            return []
        counters = self.reading.counters
        new = epoch != counters.bar_epoch if epoch is not None else n < counters.bar_batch
        again = epoch is not None and counters.bar_epoch is not None and epoch < counters.bar_epoch
        if counters.bar_batch and new:
            counters.bar_base += counters.bar_size or counters.bar_batch
        counters.bar_epoch, counters.bar_batch = epoch, n
        counters.bar_size = int(total) if total and is_digits(total) else None
        # Lightning's bar (its `Epoch 0:` desc, the logger's `v_num` in the postfix) counts epochs from 0 and its
        # bars are all as long; a user's own `Epoch 1:` may count from 1.
        lightning = found is not None and desc.lstrip().startswith("Epoch") and "v_num=" in bar.group("info")
        # Lightning's `Epoch 0:` counts from 0 and its bars are all as long: a log read from the middle of a
        # run (a job restarted from a checkpoint) still gives the run's global step; a second fit's epochs, from 0
        # again, go on from the first's.
        step = counters.bar_base
        if lightning and epoch and counters.bar_size:
            step = max(step, epoch * counters.bar_size)
        step += n
        self.reading.why = (
            f"{'Lightning' if lightning else 'tqdm'} bar: step {step}, its count {n}"
            + (f" after {step - n} of earlier epochs" if step != n else "")
            + (f"; epoch {epoch} after a later one: the log starts over, its steps go on" if again else "")
            + "; a step's last redraw is taken when the next is drawn or the line ends"
        )
        held = counters.bar_held
        closed = self._bar_take() if held is not None and held["step"] != step else []
        counters.bar_held = {
            "step": step,
            "values": {name: json_float(value) for name, value in values.items()},
            "epoch": epoch,
            "batch": n,
            "source": "lightning" if lightning else "bar",
        }
        if line_end:  # the bar's line ends: its step is taken now, not when (or if) another step is drawn
            return [*closed, *self._bar_take()]
        return closed

    def _bar_take(self) -> list[Sample]:
        """The held redraw as its step's sample, once: none if that step was taken already. A bar's line may end
        (another bar opens under it) and the bar be drawn again at the same step: Lightning's, after each
        validation, with the val_loss added; a second sample of one step would count its loss twice."""
        held, self.reading.counters.bar_held = self.reading.counters.bar_held, None
        if held is None or held["step"] == self.reading.counters.bar_taken:
            return []
        self.reading.counters.bar_taken = held["step"]
        return [held_sample(held)]

    def rich_bar(self, bar: re.Match[str]) -> list[Sample]:
        """A redraw of a rich bar: the step it shows is held, and its metrics gathered (see rich_held)."""
        desc, n, total = bar.group("desc").strip(), int(bar.group("n")), bar.group("total")
        found = _DESC_EPOCH.search(desc)
        epoch = int(found.group(1)) if found else None
        count = self.bar_count(n, total)
        lightning = epoch is not None and desc.startswith("Epoch") and is_digits(total)
        step = epoch * int(total) + n if lightning and epoch is not None else count
        held = self.reading.counters.rich_held
        released = self.rich_release() if held is not None and (held["step"], held["desc"]) != (step, desc) else []
        self.reading.counters.rich_held = {
            "step": step,
            "text": bar.group("rest").strip(),
            "epoch": epoch,
            "batch": n,
            "source": "lightning" if lightning else "bar",
            "desc": desc,
        }
        self.reading.why = (
            f"a rich bar: step {step}, its count {n}; its metrics follow it, the last redraw of a step is taken"
        )
        return released

    def rich_release(self) -> list[Sample]:
        """The held rich redraw as a sample; none for a bar at 0 (before its first step, its metrics are the last
        epoch's), with no metric, or at the step its bar was taken at already (a bar drawn again at the same step
        after a line not its own, as Lightning's after its validation bar: one sample a step)."""
        held, self.reading.counters.rich_held = self.reading.counters.rich_held, None
        if held is None or not held["batch"]:
            return []
        values = {
            name: json_float(parse_float(v)) for name, v in _RICH_PAIR.findall(held.pop("text")) if name != "v_num"
        }
        taken = self.reading.counters.rich_taken
        if not values or taken.get(held["desc"]) == held["step"]:
            return []
        taken.pop(held["desc"], None)
        taken[held["desc"]] = held["step"]  # the newest last
        while len(taken) > MAX_BARS:
            del taken[next(iter(taken))]
        return [held_sample({**held, "values": values})]

    def bar_count(self, n: int, total: Optional[str]) -> int:
        """A tqdm bar's count made global over epochs (see Counters.bar_counts)."""
        counts = self.reading.counters.bar_counts
        base, last = counts.get(total or "?", (0, -1))
        if n < last:
            base += int(total) if total and is_digits(total) else last
        counts.pop(total or "?", None)
        counts[total or "?"] = [base, n]  # the newest last
        while len(counts) > MAX_BARS:  # a log of bars of ever new totals: the oldest are forgotten
            del counts[next(iter(counts))]
        return base + n


def _interval_mean(batch1: int, mean1: float, batch2: int, mean2: float) -> float:
    """The mean over batches batch1+1..batch2, from the running means after batch1 and batch2."""
    if not (math.isfinite(mean1) and math.isfinite(mean2)):
        return mean2  # NaN or Inf since the epoch began stays so: report it as printed
    return (batch2 * mean2 - batch1 * mean1) / (batch2 - batch1)
