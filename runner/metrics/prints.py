"""Plain prints (`step 100 loss=1.23`, `Train Epoch: 1 [22400/60000 (37%)]\tLoss: 0.23`, dicts, JSON lines) and
tables (fastai's), with the step each says, made global over epochs, or counted where it says none."""

from __future__ import annotations

import re
from typing import Optional

from tfrun.losses import EVALUATION_PREFIXES
from tfrun.runner.metrics.state import MAX_COUNTER_DIGITS, Reader, Sample
from tfrun.runner.metrics.text import (
    NUM,
    NUMBER,
    PRINT_PAIR,
    WRAPPED,
    WRAPPERS,
    eval_kind,
    json_float,
    metric_name,
    parse_float,
)

# A table's header (fastai's `epoch     train_loss  valid_loss  accuracy  time`): names only, one a loss; the
# rows under it are its values, aligned (`0         1.024860    0.693555    0.512500  00:00`).
_TABLE_HEADER = re.compile(r"\s*(?:[A-Za-z_][\w@/.]*\s+)+[A-Za-z_][\w@/.]*\s*")
_TABLE_CELL = re.compile(rf"{NUM}|\d+(?::\d\d)+|#na#")  # a number, a time (`00:01`), fastai's no-value
# `step 100`, `Epoch [2/10]`, `'epoch': 3`, `'train/global_step': 100`; not `ms/batch 45.12` (a rate) nor
# `'epoch': 0.05` (a fraction).
_COUNTER = re.compile(
    r"(?i)\b(global_step|step|iteration|iter|batch|epoch)s?\b['\"]?\s*[\[(#:=]?\s*(\d+)(?:\s*/\s*(\d+))?(?!\.?\d)"
)
# A count before its name: word_language_model's `|   200/ 2983 batches |`.
_COUNTED = re.compile(r"(?i)(?<![\d.])(\d+)\s*/\s*(\d+)\s+(?:batch|step|iteration|iter)(?:es|s)?\b")
_SEEN = re.compile(r"\[\s*(\d+)\s*/\s*(\d+)\s*\(\s*\d+(?:\.\d*)?%\)\s*\]")  # PyTorch's `[22400/60000 (37%)]`


class Prints(Reader):
    """The reader's part that reads prints and tables."""

    def _print(self, segment: str) -> Optional[Sample]:
        if any(wrapper in segment for wrapper in WRAPPERS):  # a few byte searches, not a regex a line
            segment = WRAPPED.sub(r"\1", segment)
        pairs = [
            (qualifier.lower(), name.lower(), parse_float(value))
            for qualifier, name, value in PRINT_PAIR.findall(segment)
        ]
        kind = eval_kind(segment, pairs)
        values: dict[str, float] = {}
        for qualifier, name, value in pairs:
            values.setdefault(metric_name(qualifier, name, kind), value)
        counters = self.counters
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
            if printed is None and counted and len(counted.group(1)) <= MAX_COUNTER_DIGITS:
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
            counters.waiting = {"values": {name: json_float(v) for name, v in values.items()}, "epoch": epoch}
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
            elif NUMBER.fullmatch(cell):
                values[metric_name("", name.lower(), "")] = parse_float(cell)
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

    def _counted_step(self) -> int:
        """The step of a print that says none: its count of such prints, or the last step printed where that is
        further (`epoch 1 done, loss 0.6` after `step 40`: at 40)."""
        counters = self.counters
        counters.prints += 1
        printed_before = 0 if counters.print_last is None else counters.print_offset + counters.print_last
        return max(counters.prints, printed_before)

    def _release(self, step: Optional[int]) -> list[Sample]:
        """The waiting print, if any, at `step` (the bar's count), or counted when the bar was not redrawn."""
        waiting, self.counters.waiting = self.counters.waiting, None
        if waiting is None:
            return []
        values = {name: float(value) for name, value in waiting["values"].items()}
        return [Sample(self._counted_step() if step is None else step, values, waiting["epoch"], "print")]
