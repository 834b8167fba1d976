"""Loss spikes: a NaN or Inf loss, or a loss that jumps far above where it has been and stays there.

A NaN or Inf loss is a spike at once. Otherwise, after a warm-up of 20 losses, a loss is too high above 2x the
90th percentile of the last 10 losses, and 5 such losses in a row are a spike, reported once: the detector
re-arms after 5 losses in a row back under the threshold. Factor and patience follow llm-foundry's KillLossSpike
(2x, more than 4 in a row; Lightning's SpikeDetection takes 2x the mean of 10).

The statistic is a high percentile rather than the mean or the median because per-batch losses are noisy: on a
real run with batches of 4 (tests/data/curves/noisy.jsonl) 19% of the losses are above 2x the median of the last
10, four in a row, but 4% above 2x their 90th percentile and never two in a row. Like a median, a percentile
barely moves for a few extreme losses and never trips on a falling loss; and no loss of an incident joins the
window, so a spike cannot raise its own baseline (a run above the threshold that ends before it is a spike was
noise, and joins the window then).

The window is the last 10 losses, not KillLossSpike's 100, because the corpus of real runs (tests/data/real/)
showed what 100 misses: a log printed once an epoch holds the whole run in 100 losses, so the high losses of the
first epochs stay in the baseline and a learning rate x1000 that triples the loss late in training (fastai's
per-epoch table, a Keras convnet that dies at chance level, 3x its last loss but below its first) is never 2x
it. Over 10 losses the baseline is where training is now; the noise numbers above are those of 10.
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass
from typing import Any, Optional

DEFAULT_FACTOR = 2.0
DEFAULT_WINDOW = 10
DEFAULT_WARMUP = 20
DEFAULT_PATIENCE = 5
QUANTILE = 0.9  # the running statistic: this quantile of the window
RECENT = 10  # losses quoted in an alert


@dataclass
class Spike:
    """One incident: the loss that made it one, what it was compared with, and the losses before it."""

    step: int
    value: float
    baseline: float  # the running statistic `value` was compared with; nan for a NaN or Inf loss
    kind: str  # "nan", "inf" or "ratio"
    recent: list[float]  # the last RECENT losses, this one last


class SpikeDetector:
    """Feed it each training loss in order; it answers a Spike once per incident."""

    def __init__(
        self,
        factor: float = DEFAULT_FACTOR,
        window: int = DEFAULT_WINDOW,
        warmup: int = DEFAULT_WARMUP,
        patience: int = DEFAULT_PATIENCE,
    ) -> None:
        if factor <= 1 or window < 1 or warmup < 1 or patience < 1:
            raise ValueError("a spike detector needs factor > 1 and a window, warm-up and patience of at least 1")
        self.factor = factor
        self.window: deque[float] = deque(maxlen=window)
        self.warmup = warmup
        self.patience = patience
        self.seen = 0  # finite losses so far, for the warm-up
        self.over: list[float] = []  # the losses above the threshold in a row, while no spike is called
        self.incident = False  # a spike was called and the loss has not yet come back
        self.under = 0  # losses back under the threshold in a row during an incident
        self.not_finite = False  # the last loss was NaN or Inf (already reported)
        self.recent: deque[float] = deque(maxlen=RECENT)

    def add(self, step: int, loss: float) -> Optional[Spike]:
        """The spike this loss completes, if any."""
        self.recent.append(loss)
        if not math.isfinite(loss):
            return self._not_finite(step, loss)
        self.not_finite = False
        self.seen += 1
        baseline = self._baseline()
        if baseline is None or baseline <= 0:  # warming up; a ratio to a loss of 0 or less means nothing
            self.window.append(loss)
            return None
        if loss > self.factor * baseline:
            return self._high(step, loss, baseline)
        self._normal(loss)
        return None

    def _not_finite(self, step: int, loss: float) -> Optional[Spike]:
        """A NaN model stays NaN: the first NaN or Inf of a run of them is the incident."""
        if self.not_finite:
            return None
        self.not_finite = True
        return Spike(step, loss, math.nan, "nan" if math.isnan(loss) else "inf", list(self.recent))

    def _baseline(self) -> Optional[float]:
        if self.seen <= self.warmup:
            return None
        ordered = sorted(self.window)
        return ordered[int(QUANTILE * (len(ordered) - 1))]

    def _high(self, step: int, loss: float, baseline: float) -> Optional[Spike]:
        self.under = 0
        if self.incident:
            return None
        self.over.append(loss)
        if len(self.over) < self.patience:
            return None
        self.over.clear()  # a spike: these losses never join the window
        self.incident = True
        return Spike(step, loss, baseline, "ratio", list(self.recent))

    def _normal(self, loss: float) -> None:
        if self.incident:  # the baseline stays that of before the spike until the loss is back for good
            self.under += 1
            self.incident = self.under < self.patience
            return
        self.window.extend(self.over)  # a run too short to be a spike: noise, part of the baseline
        self.over.clear()
        self.window.append(loss)

    def state(self) -> dict[str, Any]:
        """Everything needed to go on after a daemon restart, as JSON (NaN and Inf as strings)."""
        return {
            "factor": self.factor,
            "window_size": self.window.maxlen,
            "warmup": self.warmup,
            "patience": self.patience,
            "window": list(self.window),
            "seen": self.seen,
            "over": self.over,
            "incident": self.incident,
            "under": self.under,
            "not_finite": self.not_finite,
            "recent": [value if math.isfinite(value) else str(value) for value in self.recent],
        }

    @classmethod
    def restore(cls, state: dict[str, Any]) -> SpikeDetector:
        detector = cls(state["factor"], state["window_size"], state["warmup"], state["patience"])
        detector.window.extend(float(value) for value in state["window"])
        detector.seen = int(state["seen"])
        detector.over = [float(value) for value in state["over"]]
        detector.incident = bool(state["incident"])
        detector.under = int(state["under"])
        detector.not_finite = bool(state["not_finite"])
        detector.recent.extend(float(value) for value in state["recent"])
        return detector
