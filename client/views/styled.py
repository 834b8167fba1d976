"""Styled lines to stdout without rich's console: the verbs that print lines and tables (`ps`, `status`, `gpus`,
`alerts`, `metrics`, `doctor`, ...) run many times a day, and `rich.console` alone is a quarter of their start.

A `Styled` is text in pieces, each with a style of a few words ("bold", "dim", "red", "bold red"); `Output`
writes such lines with SGR codes when colour is wanted and with no escape code at all when it is not. Widths
are counted in terminal cells by `rich.cells` (a small module: CJK and emoji take two cells), so a table's
columns line up and a row cut to the terminal stays inside it. rich's `Console` is left to `tfrun top`.
"""

from __future__ import annotations

import contextlib
import os
import sys
from collections.abc import Mapping
from typing import Union

# What rich's Text dropped from what it was given, and so what these lines drop: bell, backspace, vertical
# tab, form feed, carriage return (text a job or a box wrote could move the cursor with them).
_DROPPED = dict.fromkeys((7, 8, 11, 12, 13))
_TAB = 8
_ATTRIBUTES = {"bold": "1", "dim": "2"}
_COLORS = {"black": "30", "red": "31", "green": "32", "yellow": "33", "blue": "34", "magenta": "35", "cyan": "36",
           "white": "37"}  # fmt: skip


def wants_color(choice: str, terminal: bool, environ: Mapping[str, str]) -> bool:
    """Whether to write colour: --color always or never decides; with auto, NO_COLOR (set, not empty) says no
    (no-color.org), then FORCE_COLOR (set, not empty, not 0) says yes (force-color.org); else a terminal
    gets colour and a pipe or file none. --color beats both variables: it is the more deliberate choice."""
    if choice != "auto":
        return choice == "always"
    if environ.get("NO_COLOR"):
        return False
    if environ.get("FORCE_COLOR", "") not in ("", "0"):
        return True
    return terminal


def combine(base: str, style: str) -> str:
    """`style` over `base`: the words of both, as rich combined them ("bold" over "red" is "red bold")."""
    return f"{base} {style}" if base and style else base or style


def sgr(style: str) -> str:
    """The SGR parameters of `style` ("1;31" for "bold red"): attributes, then the last colour named."""
    words = style.split()
    codes = [code for name, code in _ATTRIBUTES.items() if name in words]
    colors = [_COLORS[word] for word in words if word in _COLORS]
    return ";".join(codes + colors[-1:])


class Styled:
    """Text in styled pieces, with a style over all of it, as rich's Text: `Styled("a", "bold") + "b"` is
    bold throughout, and a piece appended with "red" to a "dim" line is dim red."""

    __slots__ = ("pieces", "style")

    def __init__(self, text: str = "", style: str = "") -> None:
        self.style = style
        self.pieces: list[tuple[str, str]] = []  # (text, the piece's own style), without the line's
        self.append(text)

    def append(self, text: str, style: str = "") -> Styled:
        text = text.translate(_DROPPED)
        if text:
            self.pieces.append((text, style))
        return self

    def append_styled(self, other: Styled) -> Styled:
        self.pieces += [(text, combine(other.style, style)) for text, style in other.pieces]
        return self

    def __add__(self, other: Union[Styled, str]) -> Styled:
        joined = Styled(style=self.style)
        joined.pieces = list(self.pieces)
        return joined.append_styled(other) if isinstance(other, Styled) else joined.append(other)

    def __iadd__(self, other: Union[Styled, str]) -> Styled:
        return self.append_styled(other) if isinstance(other, Styled) else self.append(other)

    @property
    def plain(self) -> str:
        return "".join(text for text, _ in self.pieces)

    @property
    def cell_len(self) -> int:
        """Its width on a terminal, in cells."""
        from rich.cells import cell_len

        return cell_len(self.plain)

    def rstrip(self) -> None:
        """Drop the whitespace at its end."""
        self._resize(self.plain.rstrip())

    def truncate(self, width: int) -> None:
        """Cut to `width` cells with … at the end, as rich's Text.truncate(overflow="ellipsis") did: a wide
        character cut in two becomes a space, and each character keeps the style of the one at its place."""
        from rich.cells import cell_len, set_cell_size

        plain = self.plain
        if cell_len(plain) > width:
            self._resize(set_cell_size(plain, width - 1) + "…")

    def _resize(self, plain: str) -> None:
        """Hold `plain` (this text, changed at its end) with the styles at the same offsets."""
        pieces, start = [], 0
        for text, style in self.pieces:
            part = plain[start : start + len(text)]
            if part:
                pieces.append((part, style))
            start += len(text)
        if start < len(plain):  # longer than it was: the rest takes the last piece's style
            pieces.append((plain[start:], self.pieces[-1][1] if self.pieces else ""))
        self.pieces = pieces


Line = Union[Styled, str]  # a line to write: styled, or plain text


class Output:
    """Where a verb writes lines: stdout, in colour or not as `wants_color` says (--color, NO_COLOR and
    FORCE_COLOR), whole in a pipe and, where asked, cut to the width of a terminal. Whether stdout is a
    terminal is read once, here. Nothing is wrapped: a pipe gets one record a line, however long."""

    def __init__(self, choice: str = "auto") -> None:
        self.terminal = sys.stdout.isatty()
        self.color = wants_color(choice, self.terminal, os.environ)

    @property
    def width(self) -> int:
        """The terminal's width in cells, as rich's console measured it: COLUMNS, else the size of the
        terminal on stdout, stdin or stderr (in a pipe, `metrics --plot | less` fits the terminal it is read
        on), else 80."""
        import shutil

        columns = shutil.get_terminal_size((0, 0)).columns
        for fd in (0, 2):
            if columns > 0:
                break
            with contextlib.suppress(OSError, ValueError):
                columns = os.get_terminal_size(fd).columns
        return columns if columns > 0 else 80

    def write(self, *lines: Line, style: str = "", cut: bool = False) -> None:
        """Write `lines`, each with `style` over it, then flush. With `cut`, a line longer than the terminal is
        cut with … (in a pipe lines stay whole). A reader that went away (`| head`) ends the verb quietly."""
        width = self.width if cut and self.terminal else 0
        out = []
        for line in lines:
            styled = Styled(line, style) if isinstance(line, str) else Styled(style=style).append_styled(line)
            if width:
                styled.truncate(width)
            out.append(self._render(styled))
        try:
            sys.stdout.write("".join(out))
            sys.stdout.flush()
        except BrokenPipeError:  # as rich did: no "Exception ignored" from the flush at exit, and status 1
            devnull = os.open(os.devnull, os.O_WRONLY)
            os.dup2(devnull, sys.stdout.fileno())
            raise SystemExit(1) from None

    def _render(self, line: Styled) -> str:
        """`line` as written, a newline after each of its lines: tabs as spaces to the next multiple of 8
        cells (as rich expanded them), and in colour each run of one style between SGR codes."""
        rows: list[list[tuple[str, str]]] = [[]]
        column = 0  # where on its line the next piece starts, in cells: counted only for a tab's stop
        tabs = any("\t" in text for text, _ in line.pieces)
        for text, style in line.pieces:
            style = combine(line.style, style) if self.color else ""
            for i, part in enumerate(text.split("\n")):
                if i:
                    rows.append([])
                    column = 0
                if not tabs:
                    rows[-1].append((part, style))
                    continue
                from rich.cells import cell_len

                for j, chunk in enumerate(part.split("\t")):
                    if j:  # a tab: a space, then spaces up to the next tab stop
                        spaces = 1 + (-(column + 1) % _TAB)
                        rows[-1].append((" " * spaces, style))
                        column += spaces
                    rows[-1].append((chunk, style))
                    column += cell_len(chunk)
        return "".join(_sgr_runs(row) + "\n" for row in rows)


def _sgr_runs(pieces: list[tuple[str, str]]) -> str:
    """The pieces of one line, each run of one style between its SGR code and a reset."""
    out: list[str] = []
    last = None
    for text, style in pieces:
        if not text:
            continue
        codes = sgr(style)
        if codes and codes == last:
            out[-1] = out[-1][: -len("\x1b[0m")] + text + "\x1b[0m"
        else:
            out.append(f"\x1b[{codes}m{text}\x1b[0m" if codes else text)
        last = codes
    return "".join(out)
