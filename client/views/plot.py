"""Loss curves for a terminal (braille dots, 2 x 4 to a character cell) and as a PNG (matplotlib).

Drawn here rather than with a plotting package: a terminal chart of a few series is eighty lines, and
the only package that drew them changed its whole interface between releases.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path

from tfrun.losses import evaluation_name, training_loss_name
from tfrun.protocol.watching import MetricSample

from .styled import Styled

_BLOCKS = "▁▂▃▄▅▆▇█"
_BRAILLE = 0x2800
_DOT = ((0x01, 0x08), (0x02, 0x10), (0x04, 0x20), (0x40, 0x80))  # [row][column] within a cell
STYLES = ("cyan", "magenta", "yellow", "green", "red", "blue")


def sparkline(values: Sequence[float], width: int = 20) -> str:
    """The last `width` finite values as block characters, low to high."""
    finite = [v for v in values if math.isfinite(v)][-width:]
    if not finite:
        return ""
    low, high = min(finite), max(finite)
    span = (high - low) or 1.0
    return "".join(_BLOCKS[min(7, int((v - low) / span * 8))] for v in finite)


def default_names(samples: list[MetricSample]) -> tuple[str, ...]:
    """The curves to draw when none are named: the training loss that `top` and the alerts watch, and its
    validation counterpart (`loss` and `val_loss`; Lightning's `train_loss` and `val_loss`)."""
    names = dict.fromkeys(name for sample in samples for name in sample.values)
    loss = training_loss_name(names) or "loss"
    return (loss, evaluation_name(loss))


def series(samples: list[MetricSample], names: Sequence[str]) -> dict[str, tuple[list[float], list[float]]]:
    """(steps, values) of each metric in `names` that the samples hold, finite values only."""
    out: dict[str, tuple[list[float], list[float]]] = {}
    for name in names:
        points = [(float(s.step), s.values[name]) for s in samples if math.isfinite(s.values.get(name, math.nan))]
        if points:
            out[name] = ([x for x, _ in points], [y for _, y in points])
    return out


def chart(curves: dict[str, tuple[list[float], list[float]]], width: int = 72, height: int = 16) -> list[Styled]:
    """A line chart of `curves` in braille, with the y range on the left and the step range below (dim, the
    curves too: as rich drew it, a line's style lies under what is appended to it)."""
    xs = [x for steps, _ in curves.values() for x in steps]
    ys = [y for _, values in curves.values() for y in values]
    x0, x1, y0, y1 = min(xs), max(xs), min(ys), max(ys)
    if y1 == y0:
        y0, y1 = y0 - 1, y1 + 1
    if x1 == x0:
        x1 = x0 + 1
    cells = [[0] * width for _ in range(height)]
    owner = [[-1] * width for _ in range(height)]
    for index, (steps, values) in enumerate(curves.values()):
        dots = [
            (round((x - x0) / (x1 - x0) * (width * 2 - 1)), round((y1 - y) / (y1 - y0) * (height * 4 - 1)))
            for x, y in zip(steps, values)
        ]
        for (ax, ay), (bx, by) in zip(dots, dots[1:] or dots):
            for dx, dy in _segment(ax, ay, bx, by):
                cells[dy // 4][dx // 2] |= _DOT[dy % 4][dx % 2]
                owner[dy // 4][dx // 2] = index
    labels = [f"{y1:.4g}", f"{(y0 + y1) / 2:.4g}", f"{y0:.4g}"]
    pad = max(len(label) for label in labels)
    lines = []
    for row in range(height):
        label = labels[0] if row == 0 else labels[2] if row == height - 1 else labels[1] if row == height // 2 else ""
        line = Styled(f"{label:>{pad}} ┤", "dim")
        for col in range(width):
            char = chr(_BRAILLE + cells[row][col]) if cells[row][col] else " "
            line.append(char, style=STYLES[owner[row][col] % len(STYLES)] if owner[row][col] >= 0 else "")
        lines.append(line)
    first, last = f"step {x0:g}", f"step {x1:g}"
    lines.append(Styled(" " * pad + " └" + first + last.rjust(max(1, width - len(first))), "dim"))
    legend = Styled(" " * (pad + 2))
    for index, name in enumerate(curves):
        legend.append(f"━ {name}  ", style=STYLES[index % len(STYLES)])
    lines.append(legend)
    return lines


def _segment(ax: int, ay: int, bx: int, by: int) -> list[tuple[int, int]]:
    """The dots of a straight line between two dots (Bresenham)."""
    points = []
    dx, dy = abs(bx - ax), -abs(by - ay)
    sx, sy = (1 if ax < bx else -1), (1 if ay < by else -1)
    err = dx + dy
    while True:
        points.append((ax, ay))
        if ax == bx and ay == by:
            return points
        twice = 2 * err
        if twice >= dy:
            err += dy
            ax += sx
        if twice <= dx:
            err += dx
            ay += sy


def save_png(path: Path, curves: dict[str, tuple[list[float], list[float]]], title: str) -> None:
    """The curves as a PNG to share; matplotlib is an optional extra (`pip install 'tfrun[png]'`)."""
    import matplotlib

    matplotlib.use("Agg")  # no display needed: this runs over SSH and in scripts
    from matplotlib import pyplot

    figure, axes = pyplot.subplots(figsize=(9, 4.5), dpi=120)
    for name, (steps, values) in curves.items():
        axes.plot(steps, values, label=name, linewidth=1.2)
    axes.set_xlabel("step")
    axes.set_title(title)
    axes.grid(alpha=0.3)
    axes.legend()
    figure.tight_layout()
    figure.savefig(path)
    pyplot.close(figure)
