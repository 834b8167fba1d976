"""Job arrays (`tfrun submit --array KEY=V1,V2,...`): what the client checks before sending and the daemon
checks again on receipt, and how the values become tasks. Shared by both sides so that they agree.

An *axis* is one `--array KEY=V1,V2,...`; several axes give every combination of their values (the first
axis varies slowest, as nested loops), one *task* each. A task is a whole job of its own (id, folder, log,
state, restarts); the tasks of one submit share an *array id* (the first task's job id) and each has its
*index*, 0 to N-1, in the order of the combinations.

Each task gets its values twice: as environment variables named by the key in capitals (`lr` -> LR=0.1) and
as arguments `--lr=0.1` appended to the script's own. A key is a Python identifier's letters (so that
argparse makes it an attribute as it is), and the variable it makes may not shadow what the job, tfrun or
Slurm rely on (PATH, PYTHONPATH, TFRUN_JOB_ID, SLURM_*, ...). A value cannot hold a comma (the separator)
and no control character (it is shown on one line in `ps`).
"""

from __future__ import annotations

import itertools
import re
from collections.abc import Mapping, Sequence
from typing import Optional

from tfrun.shorten import shorten

MAX_ARRAY_TASKS = 1000  # tasks in one array: Slurm's default MaxArraySize (1001) takes indexes 0 to 999
MAX_ARRAY_AXES = 8
MAX_KEY = 64
MAX_VALUE = 1024
_KEY = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_RESERVED_PREFIXES = ("TFRUN_", "SLURM_", "SLURMD_", "LD_", "PYTHON", "CUDA_", "TF_")
_RESERVED = frozenset({"PATH", "HOME", "USER", "LOGNAME", "SHELL", "LANG", "TMPDIR", "TERM", "PWD"})

Axis = tuple[str, list[str]]  # a key and its values


class ArrayError(ValueError):
    """An --array that cannot be used; the message says why, in one line."""


def parse(text: str) -> Axis:
    """One `--array KEY=V1,V2,...` as (key, values), checked."""
    key, sep, values = text.partition("=")
    if not sep:
        raise ArrayError(f"{_shown(text)} is not KEY=V1,V2,... (e.g. lr=0.1,0.01)")
    axis = (key, values.split(","))
    check([axis])
    return axis


def check(axes: Sequence[Axis], env: Mapping[str, str] = {}) -> None:
    """ArrayError unless `axes` make a usable array beside the job's --env."""
    if not axes:
        raise ArrayError("an array needs at least one KEY=V1,V2,...")
    if len(axes) > MAX_ARRAY_AXES:
        raise ArrayError(f"at most {MAX_ARRAY_AXES} --array options")
    seen: set[str] = set()
    for key, values in axes:
        if not _KEY.fullmatch(key) or len(key) > MAX_KEY:
            raise ArrayError(f"key {_shown(key)}: use letters, digits and _ (not first), at most {MAX_KEY}")
        variable = key.upper()
        if variable in seen:
            raise ArrayError(f"key {key!r} is given twice (as {variable})")
        seen.add(variable)
        if variable in _RESERVED or variable.startswith(_RESERVED_PREFIXES):
            raise ArrayError(f"key {key!r} would set {variable}, which the job or tfrun relies on: name it otherwise")
        if variable in env:
            raise ArrayError(f"key {key!r} sets {variable}, which --env sets too")
        if not values:
            raise ArrayError(f"key {key!r} has no values")
        for value in values:
            if not value:
                raise ArrayError(f"key {key!r} has an empty value (a,,b or a trailing comma)")
            if len(value) > MAX_VALUE:
                raise ArrayError(f"key {key!r}: a value longer than {MAX_VALUE} characters")
            if "," in value or any(not c.isprintable() for c in value if c != " "):
                raise ArrayError(f"key {key!r}: value {_shown(value)} holds a comma or a control character")
    size = 1
    for _, values in axes:
        size *= len(values)
        if size > MAX_ARRAY_TASKS:
            raise ArrayError(f"at most {MAX_ARRAY_TASKS} tasks in one array (these values make more)")


def tasks(axes: Sequence[Axis]) -> list[dict[str, str]]:
    """Each task's values by key, in index order: every combination, the first axis varying slowest."""
    keys = [key for key, _ in axes]
    return [dict(zip(keys, combination)) for combination in itertools.product(*(values for _, values in axes))]


def task_env(values: Mapping[str, str]) -> dict[str, str]:
    """A task's variables: LR=0.1 for lr."""
    return {key.upper(): value for key, value in values.items()}


def task_args(values: Mapping[str, str]) -> list[str]:
    """A task's arguments, after the script's own: --lr=0.1."""
    return [f"--{key}={value}" for key, value in values.items()]


def task_name(name: Optional[str], index: int) -> Optional[str]:
    """A task's job name: the array's --name with its index (sweep-3), so each task is named on its own."""
    return None if name is None else f"{name}-{index}"


def _shown(text: str) -> str:
    """`text` quoted for a one-line message, cut if long."""
    return repr(shorten(text, 40))
