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
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, Optional

MAX_LINE_BYTES = 1 << 20
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
        return re2.compile("|".join(f"(?:{p})" for p in parts), options)


def _reason(exc: Exception) -> str:
    text = str(exc.args[0] if exc.args else exc)
    if text.startswith("b'") or text.startswith('b"'):
        text = text[2:-1]
    return text


def select(lines: list[str], compiled: Optional[Any], invert: bool) -> Iterator[str]:
    """The lines that pass the filter."""
    for text in lines:
        hit = compiled is None or compiled.search(plain(text)) is not None
        if hit != invert:
            yield text


class Tail:
    """The last `n` lines seen, for --tail."""

    def __init__(self, n: int) -> None:
        self.lines: deque[str] = deque(maxlen=n)

    def add(self, lines: Iterator[str]) -> None:
        self.lines.extend(lines)
