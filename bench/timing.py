"""What the benchmarks share: timing a command, and the median and 90th percentile of the times."""

from __future__ import annotations

import statistics
import subprocess
import time


def timed(command: list[str], env: dict[str, str]) -> float:
    """Seconds `command` took to run to its end, its output thrown away."""
    started = time.perf_counter()
    subprocess.run(command, env=env, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return time.perf_counter() - started


def stats(samples: list[float]) -> tuple[float, float]:
    """The median and the 90th percentile."""
    ordered = sorted(samples)
    return statistics.median(ordered), ordered[min(len(ordered) - 1, int(0.9 * len(ordered)))]
