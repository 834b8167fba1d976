"""Sizes as people write them in config files: `1GB`, `500MB`, `2GiB`, `100kB`, or a number of bytes."""

from __future__ import annotations

import re
from typing import Any, Optional

# Decimal units, as `tfrun df` and the upload notes show sizes; binary ones with an `i`.
_UNITS = {
    "": 1, "b": 1,
    "k": 10**3, "kb": 10**3, "m": 10**6, "mb": 10**6, "g": 10**9, "gb": 10**9, "t": 10**12, "tb": 10**12,
    "kib": 1 << 10, "mib": 1 << 20, "gib": 1 << 30, "tib": 1 << 40,
}  # fmt: skip
_SIZE = re.compile(r"(\d+(?:\.\d+)?)\s*([A-Za-z]*)")


def parse_size(value: Any) -> Optional[int]:
    """Bytes in `value`: a whole number, or text such as 1GB, 500MB, 2GiB, 100kB; None if it is not a size."""
    if isinstance(value, int) and not isinstance(value, bool):
        return value if value >= 0 else None
    if not isinstance(value, str):
        return None
    match = _SIZE.fullmatch(value.strip())
    if match is None or match[2].lower() not in _UNITS:
        return None
    return int(float(match[1]) * _UNITS[match[2].lower()])


def shown(n: float) -> str:
    """Bytes as tfrun shows them everywhere (`tfrun df`, upload notes, the disk-full alert): 512 B, 3.4 kB, 1.2 GB."""
    for unit in ("B", "kB", "MB", "GB", "TB"):
        if n < 1000 or unit == "TB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1000
    raise AssertionError("unreachable")
