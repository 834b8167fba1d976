"""Which of a job's metrics is its training loss: one rule for the daemon (spike alerts, `tfrun top`, the
`done` alert's last losses) and the client (`tfrun metrics --plot`'s default curves), so that they always
show the same curve."""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from typing import Optional

_GRADIENT_NORM = "grad_norm"  # Hugging Face's `grad_norm`, Lightning's `grad_norm_2.0_norm_total`, `grad_norm`
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


class TrainingLoss:
    """The training loss of one job's samples, followed as one metric from sample to sample.

    A script may print several losses on separate lines (a GAN's `discriminator loss` and `adversarial loss`,
    nanoGPT's evaluation `train loss` beside its `iter N: loss`): taking each line's own training_loss_name()
    would interleave them into one curve, and the spike rule would compare one network's loss with the other's.
    So the first name chosen is kept, except that a plain `loss`, once seen, is the one followed from then on.
    """

    def __init__(self, name: Optional[str] = None) -> None:
        self.name = name  # the metric followed; None until a sample has a training loss
        self.cause = name  # the name of the last value answered: the loss, or a NaN gradient norm beside it

    def of(self, values: Mapping[str, float]) -> Optional[float]:
        """This sample's value of the followed loss, or None when it has none (another loss, or no loss).
        A NaN or Inf gradient norm beside a finite loss is answered instead: the step went NaN, whatever the
        loss printed says (Hugging Face's Trainer prints `'loss': '0'` for a NaN step, and `'grad_norm': 'nan'`)."""
        if self.name != "loss":
            if "loss" in values:
                self.name = "loss"
            elif self.name is None:
                self.name = training_loss_name(values)
        loss = None if self.name is None else values.get(self.name)
        self.cause = self.name
        if loss is not None and math.isfinite(loss):
            bad = next((n for n, v in values.items() if _GRADIENT_NORM in n and not math.isfinite(v)), None)
            if bad is not None:
                self.cause, loss = bad, values[bad]
        return loss
