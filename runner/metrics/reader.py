"""LogMetrics: a job's output, fed as it grows in chunks cut anywhere, read into metric samples (the package's
docstring says what it reads and how)."""

from __future__ import annotations

import re
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import fields, replace
from itertools import islice
from typing import Any, Optional

from tfrun.numerals import is_digits

from .bars import (
    KERAS_BAR,
    KERAS_HEADER,
    KERAS_PAIR,
    RICH,
    RICH_CHARS,
    RICH_MORE,
    TQDM,
    ProgressBars,
)
from .prints import Prints
from .state import Counters, Keras, PatternError, Reading, Sample, plausible
from .tables import Tables, is_box_rule
from .text import NUMBER, json_float, parse_float

MAX_SEGMENT = 1 << 16  # longer segments are not metrics: skipped, and never buffered whole
MAX_GIVEN = 64  # metric names remembered at the last step (Counters.given), kept in the state a restart restores
# Lines that are no row a table may have between two rows (a library's warning on stderr, its two lines): more,
# and the table is over, its rows no longer looked for in every segment.
MAX_TABLE_STRAYS = 4
MAX_RICH_TEXT = 4096  # what a rich bar's metric lines may add up to, kept in the state a restart restores
# loss, Loss, LOSS, epoch, Epoch, EPOCH: most formats have one; a tqdm bar's rate, whose count is the step of
# the prints written over it; a boosting round (`[10]\t`); and the rule that opens a box of metrics (`-----`)
_MARKERS = (b"oss", b"OSS", b"poch", b"POCH", b"it/s", b"s/it", b"]\t", b"-----")
_TEXT_MARKERS = tuple(marker.decode() for marker in _MARKERS)
_GLUED = ("oss", "OSS")  # after a tqdm bar's redraw on its line: a print's loss glued to it
_FLAT = bytes.maketrans(b"\r\b", b"\n\n")
_NEWLINE = re.compile(b"\n")
_ANSI = re.compile(rb"\x1b\[[0-9;?]*[ -/]*[@-~]|\x1b[@-Z\\-_]")


class LogMetrics:
    """Feed it the raw bytes of a job's output in order; it answers the metric samples in them."""

    def __init__(self, patterns: Sequence[str] = ()) -> None:
        """`patterns`: user regexes with named groups; each named group that matches a number is a metric,
        groups named `step` / `epoch` are counters. RE2, so that no pattern can stall the daemon."""
        self.patterns = [_compile(pattern) for pattern in patterns]
        self.pending = b""  # the segment cut by the end of the last chunk
        self.skipping = False  # inside a segment longer than MAX_SEGMENT, until its end
        self.reading = Reading()  # where reading stands, shared by its two parts
        self.bars = ProgressBars(self.reading)  # Keras's, tqdm's and rich's bars
        self.prints = Prints(self.reading)  # printed lines
        self.tables = Tables(self.reading, self.prints.print_step, self.prints.placed_step)  # column tables and boxes

    @property
    def why(self) -> str:
        """How the last segment looked at was read, in a few words: `tfrun metrics --explain`."""
        why: str = self.reading.why
        return why

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
        counters = self.reading.counters
        self.reading.why = "not looked at: no `loss` or `epoch` in it, and no --metric pattern matches"
        table = self._in_table()  # its rows hold no marker: every segment is looked at
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
            ended = table and not self._in_table() and start not in matched
            if ended and not any(marker in flat[start:end] for marker in _MARKERS):
                continue  # the table ended in this block: the segments after it are looked at as in any other
            try:
                sample = self._pattern_sample(matched[start]) if start in matched else None
                segment = flat[start:end].decode("utf-8", "replace")
                found = iter([sample]) if sample is not None else self._parse(segment, text[end] == ord("\n"))
                for sample in found:  # each kept before the segment is read on: a print may be placed at its step
                    if not plausible(sample.step, sample.epoch):
                        self.reading.why = f"step {sample.step} or epoch {sample.epoch} is no training's count: dropped"
                        continue
                    new = self._new_values(sample)
                    if new is not None:
                        samples.append(new)
            except (ValueError, OverflowError):  # a count of 4,300+ digits: no training printed that
                self.reading.why = "a number too long to be a metric or a count"
            if not table and (counters.table is not None or counters.box is not None) and end + 1 < len(text):
                return samples + self._scan(text[end + 1 :])  # a table's header or a box's rule: its rows may follow
        return samples

    def _table_line(self, segment: str, line_end: bool) -> tuple[bool, list[Sample]]:
        """A segment while a box or a table is open: (whether it was the box's or the table's, its samples). A
        line that is neither ends them, and is read as any other."""
        if self.reading.counters.box is not None:
            boxed, closed = self.tables.box_line(segment)
            if boxed:
                return True, [] if closed is None else [closed]
        if self.reading.counters.table is not None:
            row = self.tables.table_row(segment)
            if row is not None:
                self.reading.counters.table_strays = 0
                return True, [row]
            if self.tables.table_line(segment):
                return True, []
            if line_end and segment.strip():  # a line that is no row: after a few, the table is over
                counters = self.reading.counters
                counters.table_strays += 1
                if counters.table_strays > MAX_TABLE_STRAYS:
                    counters.table, counters.table_strays = None, 0
            if not any(marker in segment for marker in _TEXT_MARKERS):
                return True, []  # looked at only as a row: out of a table, it would not be
        return False, []

    def _in_table(self) -> bool:
        """Whether a table or a box is being printed: its rows hold no marker, so every segment is looked at."""
        return self.reading.counters.table is not None or self.reading.counters.box is not None

    def _new_values(self, sample: Sample) -> Optional[Sample]:
        """The sample less the values its step has given already (a bar redrawn where it was after tqdm.write,
        a line printed again): one sample a step a metric, as a terminal shows one value; None if nothing is
        new. A value that differs from the one given is kept: the last the log shows."""
        counters = self.reading.counters
        if sample.step != counters.last_step:  # a new step: every value is new
            counters.last_step = sample.step
            values = sample.values
            counters.given = dict(values) if len(values) <= MAX_GIVEN else dict(islice(values.items(), MAX_GIVEN))
            return sample
        given = counters.given
        values = {name: value for name, value in sample.values.items() if not _same(given.get(name), value)}
        if not values:
            self.reading.why = f"step {sample.step} again, with the values it has given already: no new sample"
            return None
        if len(given) < MAX_GIVEN:
            given.update(values)
        return sample if len(values) == len(sample.values) else replace(sample, values=values)

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
                if is_digits(text):
                    counters[name] = int(text)
            elif NUMBER.fullmatch(text):
                values[name] = parse_float(text)
        if not values:
            self.reading.why = "a --metric pattern matched, but none of its named groups holds a number"
            return None
        self.reading.counters.patterns += 1
        self.reading.why = "a --metric pattern" + (
            " (its `step` group)" if "step" in counters else "; no `step` group: counted"
        )
        return Sample(counters.get("step", self.reading.counters.patterns), values, counters.get("epoch"), "pattern")

    def _parse(self, segment: str, line_end: bool) -> Iterator[Sample]:
        """The samples of one segment, in order; a generator, so that each is kept (_new_values) before the
        segment is read on: a print released by the next segment, or a rich bar taken when a line not its own
        comes, is the step a print in that segment may be placed at."""
        counters = self.reading.counters
        if counters.table is not None or counters.box is not None:
            taken, rows = self._table_line(segment, line_end)
            yield from rows
            if taken:
                return
        # Each bar's regex only where the characters it cannot match without are in the segment: a plain print
        # (most metric lines) skips all three, a third of its parse.
        rich = RICH.match(segment) if any(char in segment for char in RICH_CHARS) else None
        if rich:
            yield from self.bars.rich_bar(rich)
            return
        held = self.reading.counters.rich_held
        if held is not None and RICH_MORE.fullmatch(segment):
            if len(held["text"]) < MAX_RICH_TEXT:  # a bar's metrics: a few lines; more is no bar's, and kept no more
                held["text"] += " " + segment.strip()
            self.reading.why = f"a metric of the rich bar above: step {held['step']}"
            return
        released = self.bars.rich_release()
        if released:
            yield from released
            yield from self._parse(segment, line_end)
            return
        slash = "/" in segment  # in every Keras header and bar, and in a tqdm bar's rate
        header = KERAS_HEADER.fullmatch(segment) if slash else None
        if header:
            self.bars.keras_epoch(int(header.group(1)))
            return
        bar = KERAS_BAR.match(segment) if slash else None
        sample: Optional[Sample]
        if bar:
            pairs = {name: parse_float(value) for name, value in KERAS_PAIR.findall(segment, bar.end())}
            if pairs:
                size = int(bar.group(2)) if is_digits(bar.group(2)) else None
                sample = self.bars.keras_bar(int(bar.group(1)), size, pairs, line_end)
                if sample is not None:
                    yield sample
                return
        tqdm = TQDM.match(segment) if slash and "[" in segment else None
        if tqdm:
            # A print glued to the redraw (the bar on stderr, a print on stdout: `...?it/s]training loss: 5.56`):
            # the line's end is the print's, and the bar is still drawn.
            glued = segment[tqdm.end() :] if any(marker in segment[tqdm.end() :] for marker in _GLUED) else ""
            bar_end = line_end and not glued
            count = self.bars.bar_count(int(tqdm.group("n")), tqdm.group("total"))
            self.reading.counters.bar_live, self.reading.counters.bar_quiet = not bar_end, False
            released = self.prints.release(count)
            samples = self.bars.tqdm_bar(tqdm, bar_end)
            if released:
                self.reading.why += f"; the print written over it (tqdm.write) is at step {released[0].step}, its count"
            # the steps this redraw closes come before the print written over it, at the count it shows
            yield from sorted([*released, *samples], key=lambda sample: sample.step) if released else samples
            if glued:
                why = self.reading.why
                sample = self.prints.print_line(glued)
                self.reading.why = f"{why}; then a print glued to it: {self.reading.why}"
                if sample is not None:
                    yield sample
            return
        yield from self.prints.release(None)  # not the bar: the waiting print is placed as one with no bar
        if "-----" in segment and is_box_rule(segment):
            self.tables.open_box()
            return
        sample = self.prints.print_line(segment)
        if sample is not None:
            yield sample

    def state(self) -> dict[str, Any]:
        """Where reading has got to, as JSON, so that a restarted daemon goes on where it stopped. Shallow
        copies, not dataclasses.asdict (which deep-copies each field: a tenth of the watch's cost a save),
        for the caller to serialise at once."""
        keras = dict(vars(self.reading.keras))
        keras["means"] = {name: json_float(value) for name, value in self.reading.keras.means.items()}
        counters = dict(vars(self.reading.counters))
        counters["given"] = {name: json_float(value) for name, value in self.reading.counters.given.items()}
        return {
            "pending": self.pending.decode("latin-1"),  # any bytes, one code point each
            "skipping": self.skipping,
            "keras": keras,
            "counters": counters,
        }

    @classmethod
    def restore(cls, state: dict[str, Any], patterns: Sequence[str] = ()) -> LogMetrics:
        metrics = cls(patterns)
        metrics.pending = state["pending"].encode("latin-1")
        metrics.skipping = bool(state["skipping"])
        keras = dict(state["keras"])
        keras["means"] = {name: float(value) for name, value in keras["means"].items()}
        metrics.reading.keras = Keras(**keras)
        known = {counter.name for counter in fields(Counters)}  # a state saved before a counter was added or dropped
        counters = Counters(**{name: value for name, value in state["counters"].items() if name in known})
        counters.given = {name: float(value) for name, value in counters.given.items()}
        metrics.reading.counters = counters
        return metrics


def _same(given: Optional[float], value: float) -> bool:
    """Whether a value is the one given already, NaN the same as NaN."""
    return given is not None and (given == value or (given != given and value != value))


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
