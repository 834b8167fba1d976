"""What the metric reader answers (Sample) and what it keeps between chunks (Keras, Counters): the state a
restarted daemon restores from JSON, so its fields only grow (an older state lacks the newer ones)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Optional

from tfrun.constants import MAX_INT64
from tfrun.losses import training_loss_name


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


MAX_COUNTER_DIGITS = 15  # a printed step or epoch longer than this is no training's count


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
class Keras:
    """Where model.fit is: the epoch, and the running means of its last redraw."""

    epoch: Optional[int] = None
    open: bool = False  # between `Epoch k/N` and the epoch's last line; other bars (evaluate) are not training
    size: Optional[int] = None  # batches an epoch, once Keras knows it
    batch: int = 0  # the batch of the last redraw
    means: dict[str, float] = field(default_factory=dict)  # its running means
    base: int = 0  # batches of the epochs before this one
    signed: list[str] = field(default_factory=list)  # metrics printed negative at least once: never clamped


@dataclass
class Counters:
    """Steps of the formats that do not say them whole."""

    bar_epoch: Optional[int] = None  # of a tqdm bar (Lightning's, or any with a metric), as its desc says
    bar_batch: int = 0  # its count
    bar_size: Optional[int] = None  # its total
    bar_base: int = 0  # batches of the epochs before
    # The last redraw of the bar's current step, as JSON (step, values, epoch, batch, source): a bar redraws a
    # step more than once (Lightning twice, the first time with the previous step's loss), so a step is taken
    # when the next one is drawn or the bar's line ends.
    bar_held: Optional[dict[str, Any]] = None
    # The step the bar's last sample was taken at: a bar redrawn at that step after its line ended (Lightning's,
    # after each validation, with val_loss) gives no second sample of it.
    bar_taken: Optional[int] = None
    header_epoch: Optional[int] = None  # the epoch of a line that names one and no metric (`Start of epoch 3`)
    # Each tqdm bar's [base, last count], by its total: a bar of the same total whose count goes back is the next
    # epoch's (base grows by the total); a bar of another total is another bar (an evaluation's).
    bar_counts: dict[str, list[int]] = field(default_factory=dict)
    bar_live: bool = False  # a tqdm bar is being redrawn: its last redraw ended with \r, not its line
    # A print with no step written over a tqdm bar (tqdm.write, Hugging Face's Trainer's `{'loss': ...}`), as JSON
    # (values, epoch): tqdm redraws the bar right after it, with the count the print belongs to.
    waiting: Optional[dict[str, Any]] = None
    # A print waited for a bar that was not drawn again (a bar left for good): the prints after it wait no more,
    # until a bar is drawn.
    bar_quiet: bool = False
    table: Optional[list[str]] = None  # the columns of the table being printed, until a line that is no row
    table_strays: int = 0  # lines since its last row that are none (a warning on stderr): a few do not end it
    # A box of `| name | value |` rows being printed (runner/metrics/tables.py), as JSON: its section, values
    # and counters so far, and its rows; read when its closing rule comes.
    box: Optional[dict[str, Any]] = None
    # The last redraw of a rich bar, as JSON (step, values, epoch, batch, source, desc), its metrics growing with
    # the lines under it: taken when the bar is redrawn at another step, or a line that is not its own comes.
    rich_held: Optional[dict[str, Any]] = None
    # The step each rich bar (by its desc, the newest last) was last taken at: a bar redrawn at that step after a
    # line not its own (Lightning's validation bar) gives no second sample of it.
    rich_taken: dict[str, int] = field(default_factory=dict)
    prints: int = 0  # prints (and table rows) counted for a step: none said one, or training went on unsaid
    print_last: Optional[int] = None  # the last step counter printed
    print_offset: int = 0  # added to printed steps that restart at each epoch
    print_epoch: Optional[int] = None  # the last epoch counter printed
    patterns: int = 0  # samples from user patterns
    last_step: int = 0  # the step of the last sample: where a print that says no step is placed
    # The metrics given at last_step, by name (in the state as JSON, NaN and Inf as their names): a redraw or a
    # repeat of that step with the same values is no new sample (one sample a step a metric), and a print with no
    # step that has one of them is a later step's.
    given: dict[str, float] = field(default_factory=dict)


def held_sample(held: Mapping[str, Any]) -> Sample:
    """A bar's redraw kept in Counters.bar_held as the sample it is."""
    values = {name: float(value) for name, value in held["values"].items()}
    return Sample(held["step"], values, held["epoch"], held["source"], held["batch"])


class Reading:
    """Where reading a job's output stands, shared by the reader's two parts (runner/metrics/bars.py, prints.py):
    Keras's epoch and means, the counters, and its account of the last segment read (`tfrun metrics --explain`)."""

    def __init__(self) -> None:
        self.keras = Keras()
        self.counters = Counters()
        self.why = ""

    def reached(self) -> int:
        """The step training got to: the last sample's, or a bar's step held for its last redraw."""
        counters = self.counters
        held: list[int] = [held["step"] for held in (counters.bar_held, counters.rich_held) if held is not None]
        return max([counters.last_step, *held])
