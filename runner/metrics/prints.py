"""Plain prints (`step 100 loss=1.23`, `Train Epoch: 1 [22400/60000 (37%)]\tLoss: 0.23`, dicts, JSON lines, a
boosting round's `[10]\ttraining's l1: 0.34\tvalid_1's l1: 0.33`), with the step each says, made global over
epochs, or counted where it says none; and a table's header (its rows: runner/metrics/tables.py)."""

from __future__ import annotations

import re
from typing import Optional

from tfrun.losses import EVALUATION_PREFIXES, loss_rule
from tfrun.numerals import is_digits

from .state import MAX_COUNTER_DIGITS, Reading, Sample
from .tables import table_columns
from .text import WRAPPED, WRAPPERS, figures, json_float, metric_name

# `step 100`, `Epoch [2/10]`, `'epoch': 3`, `'train/global_step': 100`; not `ms/batch 45.12` (a rate) nor
# `'epoch': 0.05` (a fraction).
_COUNTER = re.compile(
    r"(?i)\b(global_step|step|iteration|iter|batch|epoch)s?\b['\"]?\s*[\[(#:=]?\s*(\d+)(?:\s*/\s*(\d+))?(?!\.?\d)"
)
# A count before its name: word_language_model's `|   200/ 2983 batches |`.
_COUNTED = re.compile(r"(?i)(?<![\d.])(\d+)\s*/\s*(\d+)\s+(?:batch|step|iteration|iter)(?:es|s)?\b")
_SEEN = re.compile(r"\[\s*(\d+)\s*/\s*(\d+)\s*\(\s*\d+(?:\.\d*)?%\)\s*\]")  # PyTorch's `[22400/60000 (37%)]`
# MMEngine's LoggerHook (mmdetection, mmpretrain, mmsegmentation...), training lines only (an evaluation's counts
# its own batches): `Epoch(train)  [2][ 50/469]`, the epoch then the batch in it of the epoch's length, and
# `Iter(train) [ 100/1000]`, the run's iteration.
_MM_EPOCH = re.compile(r"\bEpoch\(train\)\s*\[\s*(\d+)\s*\]\s*\[\s*(\d+)\s*/\s*(\d+)\s*\]")
_MM_ITER = re.compile(r"\bIter\(train\)\s*\[\s*(\d+)\s*/\s*\d+\s*\]")
# A boosting round at the line's start, as XGBoost and LightGBM print each: `[3]\ttrain-logloss:0.30000`,
# `[10]\ttraining's l1: 0.342535\tvalid_1's l1: 0.329053`: its figures are metrics whatever their names.
_ROUND = re.compile(r"\[(\d+)\]\t")


class Prints:
    """The reader's part that reads prints and tables, on the reading it shares with the other (state.py)."""

    def __init__(self, reading: Reading) -> None:
        self.reading = reading

    def print_line(self, segment: str) -> Optional[Sample]:
        if any(wrapper in segment for wrapper in WRAPPERS):  # a few byte searches, not a regex a line
            segment = WRAPPED.sub(r"\1", segment)
        boosting = _ROUND.match(segment) if "]\t" in segment else None
        pairs, kind = figures(segment, boosting is not None)
        values: dict[str, float] = {}
        for pair in pairs:
            values.setdefault(metric_name(pair.qualifier, pair.name, kind), pair.value)
        counters = self.reading.counters
        step: Optional[int] = None
        printed: Optional[int] = None
        total: Optional[str] = None
        epoch: Optional[int] = None
        for counter in _COUNTER.finditer(segment):
            if len(counter.group(2)) > MAX_COUNTER_DIGITS:  # not a count: it must not move the step along
                continue
            if counter.group(1).lower() == "epoch":
                epoch = epoch if epoch is not None else int(counter.group(2))
            elif printed is None:
                printed, total = int(counter.group(2)), counter.group(3)
        if not (boosting and values) and not any("loss" in name for name in values):
            self.reading.why = "no name with `loss` and a number after it"
            columns = table_columns(segment) if not values and "loss" in segment.lower() else None
            if columns is not None:  # fastai's `epoch  train_loss  valid_loss  accuracy  time`, and others'
                self.reading.counters.table = columns
                self.reading.why = "a table's header: the rows under it are its values"
                return None
            if epoch is not None and printed is None:  # `Start of epoch 3`: the epoch of the prints that follow
                counters.header_epoch = epoch
                self.reading.why = f"epoch {epoch} begins: the epoch of the prints that follow"
            return None
        mmengine = _mmengine_counter(segment) if printed is None and "(train)" in segment else None
        if mmengine is not None:
            epoch, printed, total = mmengine[0] if mmengine[0] is not None else epoch, mmengine[1], mmengine[2]
        if epoch is None:
            epoch = counters.header_epoch
        for counted in (_SEEN.search(segment), _COUNTED.search(segment)) if printed is None else ():
            if printed is None and counted and len(counted.group(1)) <= MAX_COUNTER_DIGITS:
                printed, total = int(counted.group(1)), counted.group(2)
        if boosting is not None and printed is None and len(boosting.group(1)) <= MAX_COUNTER_DIGITS:
            printed = int(boosting.group(1))
        if printed is not None:
            last_epoch = counters.print_epoch
            step = self.print_step(printed, total, epoch)
            self.reading.why = f"a print: step {step}, from its counter {printed}" + (
                f" after {step - printed} of earlier epochs" if step != printed else ""
            )
            if epoch is not None and last_epoch is not None and epoch < last_epoch:
                self.reading.why += f"; epoch {epoch} after epoch {last_epoch}: the log starts over, its steps go on"
        if step is None and not counters.bar_quiet and (counters.bar_live or self._bar_open()):
            counters.waiting = {"values": {name: json_float(v) for name, v in values.items()}, "epoch": epoch}
            self.reading.why = (
                "a print with no step, over a tqdm bar: its step is the count the bar is redrawn with next"
            )
            return None
        if step is None:
            step = self.placed_step(values)
        counters.print_epoch = epoch if epoch is not None else counters.print_epoch
        if "loss" not in values:  # which is the training loss, where no name is `loss` itself
            self.reading.why += loss_rule(values)
        return Sample(step, values, epoch, "print", printed)

    def print_step(self, printed: int, total: Optional[str], epoch: Optional[int]) -> int:
        """A printed step made global: one that goes back (or repeats in a new epoch) restarted with an epoch."""
        counters = self.reading.counters
        last = counters.print_last
        new_epoch = epoch is not None and epoch != counters.print_epoch
        if last is not None and (printed < last or (printed == last and new_epoch)):
            # a counter that starts again at 1 (`Step 1` after `Step 3`) counts from 1: the new epoch's first step
            # is the one after `last`; one that starts again at 0 counts from 0
            counters.print_offset += int(total) if total else last + (printed == 0)
        counters.print_last = printed
        return counters.print_offset + printed

    def placed_step(self, values: dict[str, float]) -> int:
        """The step of a training print that says none (`Epoch 3, Avg Loss: 0.23`, ignite's `Training Results -
        Epoch: 1 ... Avg loss: 2.29`, Trainer's last `{'train_loss': ...}`): the step training got to, as
        whatever gave steps before it says. Where nothing did, or where that step has this print's metric
        already (a loop that prints one line an epoch after a `Step: 1` line), training has gone on without
        saying where: the print is counted, on from that step."""
        counters = self.reading.counters
        reached = self.reading.reached()
        if all(name.startswith(EVALUATION_PREFIXES) for name in values if "loss" in name):
            self.reading.why = f"an evaluation's print: placed at step {reached}, where training got to"
            return reached  # after the training it evaluates, not a training print of its own
        known = bool(counters.given) or reached > 0  # something before it gave a step
        given = counters.given if reached == counters.last_step else {}
        if known and not given.keys() & values.keys():
            self.reading.why = f"a print with no step: placed at step {reached}, where training got to"
            return reached
        counters.prints += 1
        if not known:
            self.reading.why = (
                f"a print with no step, and none before it gave one: step {counters.prints}, its count of prints"
            )
            return counters.prints
        step = max(counters.prints, reached + 1)
        self.reading.why = f"a print with no step, its metrics at step {reached} already: step {step}, counted on"
        return step

    def _bar_open(self) -> bool:
        """Whether a tqdm bar was left before its end (Trainer's, under an evaluation's bar that ended its
        line): it is drawn again, at the step reached, right after a print written over it."""
        return any(
            last < int(total) for total, (_, last) in self.reading.counters.bar_counts.items() if is_digits(total)
        )

    def release(self, step: Optional[int]) -> list[Sample]:
        """The waiting print, if any, at `step` (the bar's count), or placed (_placed_step) when the bar was not
        redrawn; never behind the step training got to (a bar of another total, an evaluation's, counts its own)."""
        waiting, self.reading.counters.waiting = self.reading.counters.waiting, None
        if waiting is None:
            return []
        values = {name: float(value) for name, value in waiting["values"].items()}
        self.reading.counters.bar_quiet = step is None
        step = self.placed_step(values) if step is None else max(step, self.reading.reached())
        return [Sample(step, values, waiting["epoch"], "print")]


def _mmengine_counter(segment: str) -> Optional[tuple[Optional[int], int, Optional[str]]]:
    """(epoch, step, the epoch's length) of an MMEngine training line: `Epoch(train) [2][ 50/469]` gives
    (2, 50, "469"), `Iter(train) [ 100/1000]` (None, 100, None): the run's iteration, global already."""
    found = _MM_EPOCH.search(segment) or _MM_ITER.search(segment)
    if found is None or any(len(digits) > MAX_COUNTER_DIGITS for digits in found.groups()):
        return None
    if found.re is _MM_EPOCH:
        return int(found.group(1)), int(found.group(2)), found.group(3)
    return None, int(found.group(1)), None
