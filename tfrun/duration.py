"""Durations as people write them in options and config files: `90s`, `10m`, `1h30m`, `2d`, `500ms`."""

from __future__ import annotations

import re
from typing import Optional

_UNITS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0, "w": 604800.0}
_PART = re.compile(r"(\d+(?:\.\d+)?)(ms|s|m|h|d|w)")


def parse_duration(text: str) -> Optional[float]:
    """Seconds in `text` such as 90s, 10m, 1h30m, 2d, 500ms; None if it is not a duration."""
    pos, total = 0, 0.0
    for match in _PART.finditer(text):
        if match.start() != pos:
            return None
        total += float(match.group(1)) * _UNITS[match.group(2)]
        pos = match.end()
    return total if pos == len(text) and text else None


def format_duration(seconds: float) -> str:
    """The shortest way `parse_duration` reads back: 1800 -> 30m, 5400 -> 1h30m, 2.5 -> 2.5s."""
    if seconds < 60 or seconds != int(seconds):
        return f"{seconds:g}s"
    parts = []
    rest = int(seconds)
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60), ("s", 1)):
        if rest >= size:
            parts.append(f"{rest // size}{unit}")
            rest %= size
    return "".join(parts)
