"""Which of a job's metrics is its training loss: one rule for the daemon (spike alerts, `tfrun top`, the
`done` alert's last losses) and the client (`tfrun metrics --plot`'s default curves), so that they always
show the same curve."""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Iterable, Mapping
from typing import Optional

_GRADIENT_NORM = "grad_norm"  # Hugging Face's `grad_norm`, Lightning's `grad_norm_2.0_norm_total`, `grad_norm`
# Metrics measured on held-out data: never the training loss, whatever else their name says.
EVALUATION_PREFIXES = ("val", "test", "eval")


def training_loss_name(names: Iterable[str]) -> Optional[str]:
    """Which metric is the training loss, by the first rule of _RULES that names one, else None:
    1. `loss`;
    2. the training dataset's `loss` (`train_loss`, `training_loss`, stable-baselines3's `train/loss`), before a
       part of it (`train/value_loss`);
    3. the first name ending in `loss` that is no evaluation's (a GAN's `d_loss`, spaCy's `ner_loss`, XGBoost's
       `train_logloss`);
    4. where no name says loss (a boosting library names its metric: `training_l1`, `train_rmse`): the first
       metric of a training dataset (`train`, `training`, `learn`) that measures an error (l1, l2, mae, mse, rmse,
       error, deviance, nloglik...), never a score that grows as the model learns (auc, accuracy, ndcg)."""
    candidates = list(names)
    return next((name for rule in _RULES for name in candidates if rule[0](name)), None)


def loss_rule(names: Iterable[str]) -> str:
    """`; its training loss: NAME (why)` for `tfrun metrics --explain`, where no name is `loss` itself: what
    training_loss_name() took, and by which rule; "" where a name is `loss`, or none is a training loss."""
    candidates = list(names)
    if "loss" in candidates:
        return ""
    for says, why in _RULES:
        found = next((name for name in candidates if says(name)), None)
        if found is not None:
            return f"; its training loss: {found} ({why})"
    return ""


def _dataset(name: str) -> tuple[str, str]:
    """A metric's name as (its dataset's word, the rest): `training_l1` is ("training", "l1"), `train/loss`
    ("train", "loss"), `loss` ("", "loss")."""
    found = _QUALIFIED.match(name)
    return (found.group(1), found.group(2)) if found else ("", name)


_QUALIFIED = re.compile(r"([a-z]+)[_/-](.+)")
_TRAINING_DATASETS = frozenset({"train", "training", "learn"})
_ERROR = re.compile(r"(?:^|[_-])(?:error|l1|l2|mae|mse|rmse|rmsle|mape|huber|deviance|nll|nloglik|perplexity|ppl)$")
_RULES: tuple[tuple[Callable[[str], bool], str], ...] = (
    (lambda name: name == "loss", "its name is loss"),
    (
        lambda name: _dataset(name)[1] == "loss" and _dataset(name)[0] in _TRAINING_DATASETS,
        "the training dataset's loss",
    ),
    (
        lambda name: name.endswith("loss") and not name.startswith(EVALUATION_PREFIXES),
        "the first name ending in loss that is no evaluation's",
    ),
    (
        lambda name: _dataset(name)[0] in _TRAINING_DATASETS and bool(_ERROR.search(_dataset(name)[1])),
        "no name says loss: the training dataset's first error metric",
    ),
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
