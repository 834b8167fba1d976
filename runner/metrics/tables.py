"""Tables of metrics, read into samples at the step their own counters give:

- a column table: a header that names the columns, one of them a loss, then rows of bare numbers, one a step or an
  epoch, until a line of another shape; the header may come again, a rule of dashes may follow it, names may be of
  several words (columns apart by two spaces or more), and a cell may be a time (`00:01`, `0.49s`):
  ```
    epoch    train_loss    valid_acc    valid_loss     dur          (skorch)
  -------  ------------  -----------  ------------  ------
        1        0.6858       0.5725        0.6826  0.0154
  E    #       LOSS TOK2VEC  LOSS NER  ENTS_F  ENTS_P  ENTS_R  SCORE  (spaCy)
        Iter       Train Loss   Remaining Time                       (scikit-learn's gradient boosting)
  ```
  A `#`, `step` or `iter` column is the row's step (made global as a print's counter is, so that a second fit's
  rows go on from the first's), an `epoch` or `E` column its epoch; with no step column, the rows are counted.
  `LOSS NER` is `ner_loss`, `Train Loss` `train_loss`.
- a box of `| name | value |` rows between two rules, in sections (stable-baselines3's, every few episodes):
  ```
  ---------------------------------
  | time/               |         |
  |    total_timesteps  | 75      |
  | train/              |         |
  |    loss             | 0.549   |
  ---------------------------------
  ```
  one sample a box, its values named `section/name` (`train/loss`), at the step of its first counter of
  _BOX_STEPS (`time/total_timesteps`), which is no value.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any, Optional

from tfrun.losses import loss_rule
from tfrun.numerals import is_digits

from .state import MAX_COUNTER_DIGITS, Reading, Sample
from .text import NUM, NUMBER, json_float, parse_float

# A header: names only (`#` among them), the line's words; one of them says loss (runner/metrics/prints.py asks).
_HEADER = re.compile(r"\s*(?:[A-Za-z_#][\w@/.#]*\s+)+[A-Za-z_#][\w@/.#]*\s*")
_COLUMNS_APART = re.compile(r"\s{2,}")
# A cell: a number, a time (`00:01`, `0.49s`, `1.2m`), fastai's no-value.
_CELL = re.compile(rf"{NUM}|\d+(?::\d\d)+|{NUM}(?:ms|s|m|h)|#na#")
_TABLE_RULE = re.compile(r"\s*-{3,}(?:\s+-{3,})*\s*")  # `-------  ------------`, a run of dashes a column
_BOX_RULE = re.compile(r"\s*-{10,}\s*")  # a box's top or bottom: one run
_BOX_ROW = re.compile(r"\s*\|\s*([^|]*?)\s*\|\s*([^|]*?)\s*\|\s*")
_STEP_COLUMNS = frozenset({"#", "step", "steps", "global_step", "iter", "iters", "iteration", "it"})
_EPOCH_COLUMNS = frozenset({"epoch", "e", "ep"})
# A box's counters, in the order one is taken for its step (stable-baselines3 prints timesteps, updates, episodes,
# iterations: the timesteps are the run's own count); none of them is a metric.
_BOX_STEPS = (
    "total_timesteps",
    "timesteps",
    "num_timesteps",
    "global_step",
    "steps",
    "step",
    "n_updates",
    "updates",
    "iterations",
    "iteration",
    "episodes",
)
_BOX_EPOCHS = frozenset({"epochs", "epoch"})
MAX_BOX_ROWS = 256  # a box longer is no metrics box: it is dropped, and kept no more in the state
MAX_COLUMNS = 64  # a header of more names is no table's: the reader's state holds its columns
MAX_NAME_CHARS = 100  # a column's or a row's name longer is no metric's (a job's output is input like any other)
PrintStep = Callable[[int, Optional[str], Optional[int]], int]  # a printed counter made global (Prints.print_step)
PlacedStep = Callable[[dict[str, float]], int]  # the step of metrics that say none (Prints.placed_step)


def table_columns(segment: str) -> Optional[list[str]]:
    """The columns a header names, or None for a line that is no header: names only; apart by two spaces or
    more where the line has such gaps (`Iter       Train Loss   Remaining Time`), else by one."""
    if len(segment) > MAX_COLUMNS * MAX_NAME_CHARS or not _HEADER.fullmatch(segment):
        return None
    columns = _COLUMNS_APART.split(segment.strip())
    columns = columns if len(columns) > 1 else segment.split()
    if len(columns) > MAX_COLUMNS or any(len(column) > MAX_NAME_CHARS for column in columns):
        return None
    return columns


def column_metric(column: str) -> str:
    """A column's name as a metric's: lowercase, its words joined by `_`; `LOSS NER` (the loss of the NER
    component, as spaCy heads its columns) is `ner_loss`."""
    words = column.lower().split()
    if len(words) > 1 and words[0] == "loss":
        words = [*words[1:], "loss"]
    return "_".join(words)


def is_box_rule(segment: str) -> bool:
    return bool(_BOX_RULE.fullmatch(segment))


class Tables:
    """The reader's part that reads column tables and boxes, on the reading it shares with the others."""

    def __init__(self, reading: Reading, print_step: PrintStep, placed_step: PlacedStep) -> None:
        self.reading = reading
        self.print_step = print_step
        self.placed_step = placed_step

    def table_row(self, segment: str) -> Optional[Sample]:
        """A row under a table's header, as a sample, or None for a line that is no row of it."""
        columns, cells = self.reading.counters.table or [], segment.split()
        if len(cells) != len(columns) or not all(_CELL.fullmatch(cell) for cell in cells):
            return None
        values: dict[str, float] = {}
        epoch: Optional[int] = None
        printed: Optional[int] = None
        for column, cell in zip(columns, cells):
            name = column_metric(column)
            if name in _EPOCH_COLUMNS and is_digits(cell) and len(cell) <= MAX_COUNTER_DIGITS:
                epoch = int(cell)
            elif name in _STEP_COLUMNS and is_digits(cell) and len(cell) <= MAX_COUNTER_DIGITS:
                printed = int(cell)
            elif NUMBER.fullmatch(cell):
                values[name] = parse_float(cell)
        counters = self.reading.counters
        shown = " | ".join(columns)
        if printed is not None:
            step = self.print_step(printed, None, epoch)
            counters.print_epoch = epoch if epoch is not None else counters.print_epoch
            self.reading.why = f"a row of the table {shown}: step {step}, its step column {printed}"
        else:  # a print that says no step: placed where training got to, or counted
            step = self.placed_step(values)
            self.reading.why = f"a row of the table {shown}, with no step column; as {self.reading.why}"
        self.reading.why += loss_rule(values)
        return Sample(step, values, epoch, "print", printed) if values else None

    def table_line(self, segment: str) -> bool:
        """Whether a line that is no row still belongs to the table: its rule (`-------  ------`)."""
        if _TABLE_RULE.fullmatch(segment):
            self.reading.why = "the rule under a table's header"
            return True
        return False

    def box_line(self, segment: str) -> tuple[bool, Optional[Sample]]:
        """A line while a box is open: (whether it is the box's, the box's sample where it closes it). A line that
        is neither a row nor a rule ends the box unread: it was no metrics box."""
        counters = self.reading.counters
        box = counters.box
        if box is None:
            return False, None
        if is_box_rule(segment):
            counters.box = None
            return True, self._box_sample(box) if box["values"] or box["counters"] else None
        row = _BOX_ROW.fullmatch(segment) if len(segment) <= 2 * MAX_NAME_CHARS else None
        if row is None or box["rows"] >= MAX_BOX_ROWS or len(row.group(1)) > MAX_NAME_CHARS:
            counters.box = None
            return False, None
        box["rows"] += 1
        name, cell = row.group(1), row.group(2)
        if name.endswith("/") and not cell:  # `| train/ |  |`: the rows under it are its
            box["section"] = name
        elif NUMBER.fullmatch(cell):
            key = name.lower()
            if key in _BOX_STEPS or key in _BOX_EPOCHS:
                if is_digits(cell) and len(cell) <= MAX_COUNTER_DIGITS:
                    box["counters"].setdefault(key, int(cell))
            else:
                box["values"][box["section"] + name] = json_float(parse_float(cell))
        self.reading.why = "a row of a box of metrics: read when the box closes"
        return True, None

    def open_box(self) -> None:
        """A rule: a box of rows may follow (one that does not is no box, and is dropped at its first line)."""
        self.reading.counters.box = {"section": "", "values": {}, "counters": {}, "rows": 0}
        self.reading.why = "a rule: a box of `| name | value |` rows may follow"

    def _box_sample(self, box: dict[str, Any]) -> Optional[Sample]:
        """A closed box as a sample, at its first counter's step (made global), else counted."""
        found: dict[str, int] = box["counters"]
        values = {name: float(value) for name, value in box["values"].items()}
        if not values:
            return None
        epoch = next((found[key] for key in _BOX_EPOCHS if key in found), None)
        key = next((key for key in _BOX_STEPS if key in found), None)
        if key is not None:
            step = self.print_step(found[key], None, None)
            self.reading.why = f"a box of metrics: step {step}, its `{key}`"
        else:
            step = self.placed_step(values)
            self.reading.why = f"a box of metrics with no counter; as {self.reading.why}"
        self.reading.why += loss_rule(values)
        return Sample(step, values, epoch, "print", found.get(key) if key else None)
