"""Which of a job's metrics is its training loss: one rule for the daemon (spike alerts, `tfrun top`, the
`done` alert's last losses) and the client (`tfrun metrics --plot`'s default curves), so that they always
show the same curve."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Optional

# Metrics measured on held-out data: never the training loss, whatever else their name says.
EVALUATION_PREFIXES = ("val", "test", "eval")


def training_loss_name(names: Iterable[str]) -> Optional[str]:
    """`loss` if there is one, else the first `...loss` that is not an evaluation's (Lightning's `train_loss`,
    a GAN's `d_loss`), else None."""
    candidates = list(names)
    if "loss" in candidates:
        return "loss"
    return next(
        (name for name in candidates if name.endswith("loss") and not name.startswith(EVALUATION_PREFIXES)), None
    )


def evaluation_name(loss: str) -> str:
    """The validation counterpart of a training loss's name: `loss` -> `val_loss`, `train_loss` -> `val_loss`."""
    return "val_" + loss.removeprefix("train_")
