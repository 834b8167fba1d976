"""Out-of-memory text in a job's output: what TensorFlow, PyTorch, JAX and Python print when memory runs out.

A line is an OOM when it is one of the fatal messages; the messages that only look like one are not:
TensorFlow's BFC allocator warning that ends "The caller indicates that this is not a failure" (it retries
with less), and the `CUDA_ERROR_OUT_OF_MEMORY` lines the stream executor prints when it shrinks its first
allocation (training goes on). A kill by the kernel's OOM killer prints nothing: runner/cgroup.py sees it.
"""

from __future__ import annotations

import re
from typing import Optional

# Any OOM line holds one of these: a chunk of log without any of them is skipped whole, by memmem.
_HINTS = (b"memory", b"Memory", b"OOM", b"EXHAUSTED", b"Exhausted")

_FATAL = [
    # TensorFlow: the op's error, the exception, the allocator giving up.
    (
        "TensorFlow",
        re.compile(r"OOM when allocating tensor|ResourceExhaustedError|ran out of memory trying to allocate"),
    ),
    # PyTorch: torch.cuda.OutOfMemoryError / RuntimeError: CUDA out of memory. Tried to allocate ...
    ("PyTorch", re.compile(r"CUDA out of memory|torch\.(?:cuda\.)?OutOfMemoryError")),
    # JAX / XLA: XlaRuntimeError: RESOURCE_EXHAUSTED: Out of memory while trying to allocate ...
    ("JAX/XLA", re.compile(r"RESOURCE_EXHAUSTED: Out of memory")),
    # Python: MemoryError, numpy's _ArrayMemoryError ("Unable to allocate 8.00 TiB for an array ...").
    ("Python", re.compile(r"^(?:[\w.]+\.)?_?\w*MemoryError\b")),
]
_NOT_FATAL = re.compile(r"The caller indicates that this is not a failure|CUDA_ERROR_OUT_OF_MEMORY")


# TensorFlow's and XLA's C++ log prefix: "W0000 00:00:1796.63 13274 op_kernel.cc:1858] " (absl) or
# "2022-06-01 10:00:00.000000: W tensorflow/core/.../bfc_allocator.cc:275] " (TF 2.9).
_LOG_PREFIX = re.compile(r"^(?:[IWEF]\d{4} [\d:.]+\s+\d+ |\d{4}-\d\d-\d\d [\d:.]+: [IWEF] )\S+:\d+\] ")


def message(line: str) -> str:
    """`line` without a C++ log prefix: what to quote in an alert's one-line summary."""
    return _LOG_PREFIX.sub("", line, count=1)


def may_hold_oom(data: bytes) -> bool:
    """False when no line of `data` can be an OOM message: the common case, decided without splitting lines."""
    return any(hint in data for hint in _HINTS)


def oom_kind(line: str) -> Optional[str]:
    """Which framework's out-of-memory failure `line` reports ("TensorFlow", ...), or None."""
    if _NOT_FATAL.search(line):
        return None
    for kind, pattern in _FATAL:
        if pattern.search(line):
            return kind
    return None
