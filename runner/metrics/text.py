"""The words and numbers of training output, as every metric format reads them: a number in any notation, a
metric's name in a print (`train loss`, `Average loss`, `'loss':`), and whether a line is an evaluation's."""

from __future__ import annotations

import math
import re
from typing import Any

from tfrun.losses import EVALUATION_PREFIXES

# Any float notation (`1e-3`, `.5`, `2.`), and NaN and Inf as Python, NumPy, JSON and Lightning (`nan.0`) print them.
NUM = r"[-+]?(?:(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?|(?i:nan|inf(?:inity)?)(?:\.0)?)"
END = r"(?![\w.:])"  # a number ends here: not `0s` (an ETA), not `1:02`, not `1.2.3`
PRINT_END = r"(?![\w.:/])"  # in a print, not `9213/10000` either (a count, such as `Accuracy: 9213/10000`)
NUMBER = re.compile(NUM)
# A value printed as a tensor or a NumPy scalar: `tensor(0.2300, grad_fn=<NllLossBackward0>)`,
# `tf.Tensor(0.23, shape=(), dtype=float32)`, `np.float32(0.23)`; read as the number inside.
WRAPPED = re.compile(
    rf"\b(?:tf\.Tensor|Tensor|tensor|(?:np|numpy)\.float(?:16|32|64)|array)\(\s*({NUM})"
    r"(?:\s*,[^()]*(?:\([^()]*\)[^()]*)*)?\)"
)
WRAPPERS = ("ensor(", "float", "array(")  # in every text WRAPPED matches
# The one word before a metric's name: a qualifier (`train loss`, `Average loss`) or a model's part
# (`discriminator loss at step 0: 0.68`); none of the words that only join a sentence.
_JOINING_WORDS = frozenset({"a", "an", "and", "at", "for", "in", "is", "of", "on", "the", "to", "with"})
_EVAL_KINDS = {
    "val": "val",
    "valid": "val",
    "validation": "val",
    "test": "test",
    "testing": "test",
    "eval": "eval",
    "evaluation": "eval",
}
_EVAL_WORD = re.compile(rf"(?i)(?<![a-z])({'|'.join(_EVAL_KINDS)})(?![a-z])")
_PLAIN_QUALIFIERS = frozenset({"avg", "average", "mean", "total", "running"})  # dropped where the line names a kind
# `name: value`, `name=value`, `name value`, `'name': value` (dict reprs, JSON), `name │ value` (rich tables),
# and `name (anything) at step N: value` (keras-io's custom-loop guide); the qualifier joined by a space or, as
# XGBoost names its evaluation sets' metrics, a hyphen (`train-logloss:0.48018`).
PRINT_PAIR = re.compile(
    r"(?i)(?<![\w./])(?:([a-z]+)[ -])?"
    r"((?:[a-z_]+/)*[a-z_]*(?:loss|accuracy|acc)(?:_\w*)?|lr|learning_rate|[a-z_]*grad_norm\w*)['\"]?"
    r"(?:\s*\([^()]*\))?(?:\s+at\s+(?:step|iteration|iter|batch|epoch)\s+\d+)?"
    rf"\s*(?:[:=\u2502|]\s*|\s)['\"]?({NUM}){PRINT_END}"
)


def eval_kind(segment: str, pairs: list[tuple[str, str, float]]) -> str:
    """`val`, `test` or `eval` when the line is an evaluation's and its names do not say so themselves
    (`Test set: Average loss: 0.2475`, `Validation loss: 0.31`); "" for a training line, or one whose names
    tell training and evaluation apart already (`loss=0.25 val_loss=0.31`, `train loss 2.1, val loss 2.2`)."""
    if any(qualifier in _EVAL_KINDS or name.startswith(EVALUATION_PREFIXES) for qualifier, name, _ in pairs):
        return ""
    found = _EVAL_WORD.search(segment)
    return _EVAL_KINDS[found.group(1).lower()] if found else ""


def metric_name(qualifier: str, name: str, kind: str) -> str:
    """A printed name as a metric's: `Training loss` is `training_loss`, `Validation loss` `val_loss`, and on
    an evaluation's line (`kind`) `Average loss` is `test_loss`, so that training_loss() never takes it."""
    qualifier = "" if qualifier in _JOINING_WORDS else _EVAL_KINDS.get(qualifier, qualifier)
    if kind:
        qualifier = kind if not qualifier or qualifier in _PLAIN_QUALIFIERS else f"{kind}_{qualifier}"
    return f"{qualifier}_{name}" if qualifier else name


def parse_float(text: str) -> float:
    """A number as printed: Lightning's tqdm postfix prints NaN and Inf as `nan.0` and `inf.0`, which float()
    refuses, and a NaN read as no value is a NaN that raises no alert."""
    return float(text[:-2] if text.endswith(".0") and text[-3:-2].isalpha() else text)


def json_float(value: float) -> Any:
    """JSON has no NaN or Inf: those as their names, which float() reads back."""
    return value if math.isfinite(value) else str(value)
