"""Training output as a person sees it in a terminal, and the filters of `tfrun logs`.

Keras redraws its progress bar with `\\r` and `\\b` and ends the line only at the end of an epoch, Keras 3
adds ANSI colour, scripts print invalid UTF-8 or one line of 100 MB. A line here is what a terminal
shows once the line is finished: `\\r` returns to the start of the line and `\\b` one column back, later
text overwriting earlier text, so a Keras epoch is one line in its final state. Matching ignores ANSI
sequences; bytes that are not UTF-8 are shown escaped (`\\xff`), never dropped. A line longer than
MAX_LINE_BYTES keeps its start and says how much more the log holds, so memory stays bounded.

Patterns are RE2 (google-re2): the syntax of `grep -E` in time linear in the input, so no pattern, however
pathological, can stall the daemon for its other clients.
"""

from __future__ import annotations

import re
from collections import deque
from dataclasses import dataclass
from typing import Any, Optional

MAX_LINE_BYTES = 1 << 20
FILTERED_TAIL_BYTES = 64 << 20  # the most a filtered --tail holds (Tail)
_LINE_COST = 48  # what a line takes in memory besides its bytes: its bytes object, its place in the deque
_CONTROL = re.compile(rb"[\r\n\b]")
_ANSI = re.compile(r"\x1b\[[0-9;?]*[ -/]*[@-~]|\x1b[@-Z\\-_]")


class TerminalLines:
    """Feed bytes in; get back the finished lines (without their newline), as a terminal renders them."""

    def __init__(self) -> None:
        self.line = bytearray()
        self.col = 0
        self.dropped = 0  # bytes of the current line beyond MAX_LINE_BYTES

    def feed(self, data: bytes) -> list[bytes]:
        done: list[bytes] = []
        start = 0
        for match in _CONTROL.finditer(data):
            self._text(data[start : match.start()])
            char = match.group()
            if char == b"\n":
                done.append(self._finish())
            elif char == b"\r":
                self.col = 0
            elif self.col > 0:  # \b
                self.col -= 1
            start = match.end()
        self._text(data[start:])
        return done

    def unfinished_line_ends(self, data: bytes) -> int:
        """How much of `data` belongs to the line already begun (through its newline); 0 if none is begun."""
        if not self.line and not self.dropped:
            return 0
        end = data.find(b"\n")
        return len(data) if end < 0 else end + 1

    def pending(self) -> Optional[bytes]:
        """The unfinished last line, if any (for a log whose job has ended without a final newline)."""
        return self._finish() if self.line or self.dropped else None

    def _text(self, run: bytes) -> None:
        if not run:
            return
        end = self.col + len(run)
        if end > MAX_LINE_BYTES:
            keep = max(0, MAX_LINE_BYTES - self.col)
            self.dropped += len(run) - keep
            run, end = run[:keep], MAX_LINE_BYTES
        self.line[self.col : end] = run
        self.col = end

    def _finish(self) -> bytes:
        line = bytes(self.line)
        if self.dropped:
            line += f" [tfrun: line cut here, {self.dropped} more bytes in the log]".encode()
        self.line = bytearray()
        self.col = 0
        self.dropped = 0
        return line


def display(line: bytes) -> str:
    """The line as text: UTF-8, with any byte that is not shown as \\xNN."""
    return line.decode("utf-8", "backslashreplace")


def plain(text: str) -> str:
    """The text without ANSI colour and cursor sequences: what a pattern is matched against."""
    return _ANSI.sub("", text) if "\x1b" in text else text


class PatternError(ValueError):
    """A pattern RE2 cannot compile; the message says which and why."""


@dataclass(frozen=True)
class LineFilter:
    """grep's choices: patterns ORed (-e), inverted (-v), ignoring case (-i), fixed strings (-F)."""

    patterns: tuple[str, ...] = ()
    invert: bool = False
    ignore_case: bool = False
    fixed: bool = False

    def compile(self) -> Optional[Any]:
        """The compiled pattern, None when there is none; PatternError for a pattern RE2 refuses."""
        if not self.patterns:
            return None
        import re2  # google-re2: linear time whatever the pattern

        options = re2.Options()
        options.log_errors = False
        options.case_sensitive = not self.ignore_case
        parts = [re2.escape(p) if self.fixed else p for p in self.patterns]
        for part in parts:
            try:
                re2.compile(part, options)
            except re2.error as exc:
                raise PatternError(f"invalid pattern {part!r}: {_reason(exc)}") from None
        return _compile_together(re2, "|".join(f"(?:{p})" for p in parts), options)


def _compile_together(re2: Any, pattern: Any, options: Any) -> Any:
    """All the patterns as one RE2, or PatternError: patterns that each compile may still be too large
    together for RE2's memory budget."""
    try:
        return re2.compile(pattern, options)
    except re2.error as exc:
        raise PatternError(f"the patterns together are too large: {_reason(exc)}") from None


def _reason(exc: Exception) -> str:
    text = str(exc.args[0] if exc.args else exc)
    if text.startswith("b'") or text.startswith('b"'):
        text = text[2:-1]
    return text


class Selector:
    """grep's choice of lines: those that match (or not, with -v), with -A/-B lines of context around
    them and `--` between groups that are not next to each other in the log, as grep prints them."""

    SEPARATOR = "--"

    def __init__(self, compiled: Optional[Any], invert: bool, after: int = 0, before: int = 0) -> None:
        self.compiled = compiled
        self.invert = invert
        self.after = after
        self.context = after > 0 or before > 0
        self.before: deque[str] = deque(maxlen=before or None) if before else deque(maxlen=0)
        self.after_left = 0
        self.printed = False
        self.unprinted = 0  # lines passed over since the last one printed

    def select(self, texts: list[str], stamps: Optional[list[str]] = None) -> list[str]:
        """The lines to print among `texts`, each after its stamp (e.g. a time) when `stamps` is given.

        A stamp is never matched against: `^step` still finds lines that start with "step".
        """
        out: list[str] = []
        for i, text in enumerate(texts):
            shown = text if stamps is None else stamps[i] + text
            hit = self.compiled is None or self.compiled.search(plain(text)) is not None
            if hit != self.invert:
                if self.context and self.printed and self.unprinted > len(self.before):
                    out.append(self.SEPARATOR)
                out.extend(self.before)
                self.before.clear()
                out.append(shown)
                self.after_left = self.after
                self.printed = True
                self.unprinted = 0
            elif self.after_left > 0:
                out.append(shown)
                self.after_left -= 1
            else:
                self.before.append(shown)
                self.unprinted += 1
        return out


class Tail:
    """The last `n` lines seen that pass a filter, for --tail with one (without, the log is read from where
    its last `n` lines begin: runner/logs/logstream.py), held until the end of the log. `n` may be any count;
    what is held is at most the lines that passed, and at most FILTERED_TAIL_BYTES of them: past that the oldest
    go, and the lines sent start by saying how many were left out. A filter that passes most of a log of
    gigabytes would otherwise hold it all in the daemon's memory."""

    def __init__(self, n: int) -> None:
        self.n = n
        self.lines: deque[bytes] = deque()
        self.bytes = 0  # the memory `lines` take, each line's object counted
        self.left_out = 0  # lines of the tail dropped to keep within FILTERED_TAIL_BYTES

    def add(self, lines: list[bytes]) -> None:
        if len(lines) > self.n:
            lines = lines[len(lines) - self.n :]
        for _ in range(min(len(self.lines), len(self.lines) + len(lines) - self.n)):
            self._drop()
        self.lines.extend(lines)
        self.bytes += sum(map(len, lines)) + _LINE_COST * len(lines)
        while self.bytes > FILTERED_TAIL_BYTES and len(self.lines) > 1:
            self._drop()
            self.left_out += 1

    def _drop(self) -> None:
        self.bytes -= len(self.lines.popleft()) + _LINE_COST

    def release(self) -> list[bytes]:
        """The lines held, after a note of those left out, if any."""
        most = FILTERED_TAIL_BYTES >> 20
        note = f"[tfrun: {self.left_out} earlier lines of the tail left out: it holds at most {most} MB]"
        return [note.encode(), *self.lines] if self.left_out else list(self.lines)


_REGEX_SYNTAX = frozenset(".^$*+?()[]{}\\|")


class BlockMatcher:
    """The matching lines of a whole block of plain lines, found with one search per match, not per line.

    The per-line path (TerminalLines, then Selector) costs microseconds a line; a 100 MB log of a million
    lines is read as fast as `grep` only when most lines are never looked at one by one. A block qualifies
    when it holds only finished lines of valid UTF-8 without \\r, \\b or ESC, so that each line is already
    what a terminal shows and the pattern can run over the raw block. Patterns that are plain strings
    (-F, or no regex syntax, or alternatives of such: `loss|step`) are searched for as grep does it, with
    a literal search (Python's re over literals cannot backtrack); anything else with RE2 over the bytes,
    never letting a match cross a newline.
    """

    def __init__(self, line_filter: LineFilter) -> None:
        self.ignore_case = line_filter.ignore_case
        self.literal: Optional[re.Pattern[bytes]] = None
        self.regex: Optional[Any] = None
        literals = _literals(line_filter)
        if literals is not None and self.ignore_case and not all(text.isascii() for text in literals):
            literals = None  # Unicode case folding (K matches the Kelvin sign): RE2's rules, below
        if literals is not None:
            wanted = [text.lower() if self.ignore_case else text for text in literals]
            self.literal = re.compile(b"|".join(re.escape(text.encode()) for text in wanted))
        elif line_filter.patterns:
            import re2

            options = re2.Options()
            options.log_errors = False
            options.never_nl = True
            options.case_sensitive = not line_filter.ignore_case
            joined = "|".join(f"(?:{p})" for p in line_filter.patterns)
            self.regex = _compile_together(re2, f"(?m){joined}".encode(), options)

    def lines(self, block: bytes) -> Optional[list[bytes]]:
        """The matching lines of `block` (lines that each end in \\n), or None if it needs the per-line path."""
        if len(block) > MAX_LINE_BYTES or b"\r" in block or b"\b" in block or b"\x1b" in block:
            return None
        ascii_only = block.isascii()
        if not ascii_only:
            try:
                block.decode("utf-8")
            except UnicodeDecodeError:
                return None
        if self.regex is not None:
            return _matching_lines(self.regex.search, block)
        if self.literal is None:
            return block.split(b"\n")[:-1]
        if not self.ignore_case:
            return _matching_lines(self.literal.search, block)
        if not ascii_only:
            return None  # Unicode case folding: the per-line path, with RE2's rules
        lowered = block.lower()  # ASCII: the same length, so the lines found are cut from the original
        return [block[start:stop] for start, stop in _matching_spans(self.literal.search, lowered)]


def _literals(line_filter: LineFilter) -> Optional[list[str]]:
    """The plain strings that the patterns amount to, or None if some pattern is a real expression."""
    if line_filter.fixed:
        return list(line_filter.patterns)
    literals: list[str] = []
    for pattern in line_filter.patterns:
        for piece in pattern.split("|"):
            if _REGEX_SYNTAX.intersection(piece) or not piece.isprintable():
                return None
            literals.append(piece)
    return literals or None


def _matching_lines(search: Any, block: bytes) -> list[bytes]:
    """Each line of `block` (lines ending in \\n) in which `search` finds a match, without its newline."""
    return [block[start:stop] for start, stop in _matching_spans(search, block)]


def _matching_spans(search: Any, block: bytes) -> list[tuple[int, int]]:
    """(start, end without the newline) of each line of `block` in which `search` finds a match."""
    found = []
    pos, end = 0, len(block)
    while pos < end:
        match = search(block, pos)
        if match is None:
            break
        start = block.rfind(b"\n", 0, match.start()) + 1
        stop = block.find(b"\n", match.start())
        found.append((start, stop))
        pos = stop + 1
    return found
