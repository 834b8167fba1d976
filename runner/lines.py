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
    """The last `n` lines seen, for --tail."""

    def __init__(self, n: int) -> None:
        self.lines: deque[str] = deque(maxlen=n)

    def add(self, lines: list[str]) -> None:
        self.lines.extend(lines)
