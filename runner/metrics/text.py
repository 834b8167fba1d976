"""The words and numbers of training output, as every metric format reads them: a number in any notation, a
metric's name in a print (`train loss`, `Average loss`, `'loss':`), and whether a line is an evaluation's."""

from __future__ import annotations

import math
import re
from typing import Any, NamedTuple

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
_NAMED = (
    r"(?:([a-z]+)[ -])?"
    r"((?:[a-z_]+/)*[a-z_]*(?:loss|accuracy|acc)(?:_\w*)?|lr|learning_rate|[a-z_]*grad_norm\w*)['\"]?"
    r"(?:\s*\([^()]*\))?(?:\s+at\s+(?:step|iteration|iter|batch|epoch)\s+\d+)?"
    rf"\s*(?:[:=\u2502|]\s*|\s)['\"]?({NUM})"
)
PRINT_PAIR = re.compile(rf"(?i)(?<![\w./]){_NAMED}{PRINT_END}")
# A dataset's figure, whatever its metric: a name a dataset begins (`valid_auc: 0.69`, `Val: 0.2850`,
# `eval/f1=0.7`), with `:` or `=` only (not `Validation 100%`); and on a boosting round's line, LightGBM's
# `training's l1: 0.34` and `valid_1's auc: 0.8`.
_DATASET_NAMED = rf"((?:train|training|val|valid|validation|test|eval)(?:[_/][a-z0-9@]+)*)['\"]?\s*[:=]\s*['\"]?({NUM})"
_DATASET_PAIR = re.compile(rf"(?i)(?<![\w./])(?:{_DATASET_NAMED}|{_NAMED}){PRINT_END}")
_DATASET_WORDS = ("train", "val", "test", "eval")  # in every name _DATASET_NAMED and _EVAL_WORD match
_POSSESSIVE = re.compile(rf"(?i)(?<![\w./])([a-z]\w*)'s\s+([a-z][\w@.]*)\s*:\s*({NUM}){PRINT_END}")
# After a boosting round (`[3]\t`), XGBoost's `dataset-metric:value`, whatever the metric (`eval-rmse:0.5`,
# `validation_0-cox-nloglik:2.1`): the qualifier is the dataset, up to its first hyphen.
_ROUND_PAIR = re.compile(rf"(?<![\w./-])([A-Za-z_]\w*)-([A-Za-z][\w@.-]*):({NUM}){PRINT_END}")
# A dataset's count or timing, which no metric is: `train/global_step`, Hugging Face's `eval_runtime` and
# `train_samples_per_second`.
_COUNT_NAME = re.compile(r"(?i)[_/](?:global_step|steps?|epochs?|iter|iterations?|batch(?:es)?|runtime|per_second)$")


class Pair(NamedTuple):
    """A figure of a print: where it is in the line, its qualifier (`train`, `valid_1`, `Average`, ''), its
    name and its value."""

    start: int
    end: int
    qualifier: str
    name: str
    value: float


def figures(segment: str, boosting: bool = False) -> tuple[list[Pair], str]:
    """The figures of a print, in order, and the kind of evaluation the line is (eval_kind). `boosting`: the
    line is a boosting round's (`[3]\t...`), whose `dataset's metric:` and `dataset-metric:` figures are read
    whatever their metric. A line with no dataset's word (most metric lines: `step 100 loss=0.23`) has neither a
    dataset's figure nor a word of evaluation: one search of the loss-like names reads it, as fast as ever."""
    low = segment.lower()
    if not boosting and not any(word in low for word in _DATASET_WORDS):
        found = PRINT_PAIR.finditer(segment)
        return [Pair(m.start(), m.end(), (m[1] or "").lower(), m[2].lower(), parse_float(m[3])) for m in found], ""
    pairs = []
    for match in _DATASET_PAIR.finditer(segment):
        if match[1] is not None:  # `valid_auc: 0.69`; not a count or a timing (`'train/global_step': 100`)
            if not _COUNT_NAME.search(match[1]):
                pairs.append(Pair(match.start(), match.end(), "", match[1].lower(), parse_float(match[2])))
        else:
            qualifier, name, value = match[3] or "", match[4], match[5]
            pairs.append(Pair(match.start(), match.end(), qualifier.lower(), name.lower(), parse_float(value)))
    if boosting:
        for extra in (_POSSESSIVE, _ROUND_PAIR):
            taken = [(pair.start, pair.end) for pair in pairs]
            for match in extra.finditer(segment):
                if not any(start < match.end() and match.start() < end for start, end in taken):
                    qualifier, name, value = match.groups()
                    pairs.append(Pair(match.start(), match.end(), qualifier.lower(), name.lower(), parse_float(value)))
        pairs.sort()
    return pairs, eval_kind(segment, pairs)


def eval_kind(segment: str, pairs: list[Pair]) -> str:
    """`val`, `test` or `eval` when a word of the line says the line is an evaluation's and is no figure's own
    name or qualifier (`Test set: Average loss: 0.2475`, `Validation | loss: 0.31`); "" when none does. A word
    that names a figure (`Val: 0.285`, `val_loss=0.31`, `valid_1's l1`) qualifies that figure only: a line with a
    training loss and evaluation figures (`Epoch: 001, Loss: 2.0, Train: 0.31, Val: 0.28`) stays training's."""
    for found in _EVAL_WORD.finditer(segment):
        if not any(pair.start <= found.start() < pair.end for pair in pairs):
            return _EVAL_KINDS[found.group(1).lower()]
    return ""


def metric_name(qualifier: str, name: str, kind: str) -> str:
    """A printed name as a metric's: `Training loss` is `training_loss`, `Validation loss` `val_loss`,
    `valid_1's l1` `valid_1_l1`, and on an evaluation's line (`kind`) `Average loss` is `test_loss`, so that
    training_loss() never takes it; a figure its own name or qualifier says is an evaluation's keeps its name."""
    qualifier = "" if qualifier in _JOINING_WORDS else _EVAL_KINDS.get(qualifier, qualifier)
    evaluation = qualifier.startswith(EVALUATION_PREFIXES) or name.startswith(EVALUATION_PREFIXES)
    if kind and not evaluation:
        qualifier = kind if not qualifier or qualifier in _PLAIN_QUALIFIERS else f"{kind}_{qualifier}"
    return f"{qualifier}_{name}" if qualifier else name


def parse_float(text: str) -> float:
    """A number as printed: Lightning's tqdm postfix prints NaN and Inf as `nan.0` and `inf.0`, which float()
    refuses, and a NaN read as no value is a NaN that raises no alert."""
    return float(text[:-2] if text.endswith(".0") and text[-3:-2].isalpha() else text)


def json_float(value: float) -> Any:
    """JSON has no NaN or Inf: those as their names, which float() reads back."""
    return value if math.isfinite(value) else str(value)
