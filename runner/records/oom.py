"""Out-of-memory text in a job's output: what TensorFlow, PyTorch, JAX and Python print when memory runs out.

A line is an OOM when it is one of the fatal messages; the messages that only look like one are not:
TensorFlow's (and XLA's) BFC allocator warning that ends "The caller indicates that this is not a failure"
(it retries with less), and the `CUDA_ERROR_OUT_OF_MEMORY` lines the stream executor logs when it shrinks
its first allocation (training goes on); the driver's code is fatal only inside a raised exception. A kill
by the kernel's OOM killer prints nothing: runner/shim/cgroup.py sees it (on Slurm, Slurm's state or slurmstepd's
line in slurm-ID.out: runner/executors/slurm/executor.py).

Whether a job's end was for want of memory is decided once, by the lifecycle (runner/records/lifecycle.py
`end_cause`: this module's `killed_by_oom_killer` and `log_ends_in_oom`, and Slurm's word), and kept as the job's
cause; the alert watch reads that cause (`kill_summary`) and searches the log only for its live alerts
(`first_oom`).

The same failure reads differently by machine: TensorFlow on a CPU with oneDNN (on by default on recent x86)
allocates through the BFC allocator "mklcpu", which logs "Allocator (mklcpu) ran out of memory" before the
op fails; without oneDNN the plain "cpu" allocator fails silently and the op's "OOM when allocating tensor"
comes first. tests/test_oom.py holds the real lines each framework and version prints.
"""

from __future__ import annotations

import os
import re
import signal
from pathlib import Path
from typing import Optional

from ..logs.lines import display, plain
from ..shim import cgroup, jobdir
from ..shim.process import boot_id
from .job import JobRow

# A Slurm job's reason when Slurm killed it for its memory (runner/executors/slurm/states.py): its oom alert's words.
SLURM_OUT_OF_MEMORY = "out of memory: Slurm killed it over its memory limit"

# Any OOM line holds one of these: a chunk of log without any of them is skipped whole, by memmem.
# tests/test_oom.py checks that every fatal sample passes.
_HINTS = (b"memory", b"Memory", b"MEMORY", b"OOM", b"EXHAUSTED", b"Exhausted", b"exhausted")

# A raised exception's line, "torch.OutOfMemoryError: ..." or "tensorflow.python....InternalError: ...".
_EXCEPTION = r"^[\w.]*(?:Error|Exception): "

# The first that matches names the kind: PyTorch/XLA's and JAX's messages carry XLA's RESOURCE_EXHAUSTED too,
# so they come before TensorFlow's catch-all status.
_FATAL = [
    (
        "PyTorch",
        re.compile(
            r"DefaultCPUAllocator: (?:can't allocate memory|not enough memory)"  # Linux, Windows
            r"|(?:CUDA|HIP|XPU|MPS backend) out of memory|CUDA error: out of memory"  # OutOfMemoryError, old torch
            r"|torch\.(?:cuda\.)?OutOfMemoryError"
            r"|^RuntimeError: (?:Bad StatusOr access: )?(?:RESOURCE_EXHAUSTED|Resource exhausted)"  # PyTorch/XLA
        ),
    ),
    (
        "JAX/XLA",
        re.compile(
            r"XlaRuntimeError: RESOURCE_EXHAUSTED|RESOURCE_EXHAUSTED: Out of memory"
            r"|Ran out of memory in memory space|Attempting to reserve \S+ at the bottom of memory"  # TPU HBM
        ),
    ),
    (
        "TensorFlow",
        re.compile(
            r"OOM when allocating tensor|ResourceExhaustedError|ran out of memory trying to allocate"
            # The status, any wording ("Resource exhausted: " up to TF 2.8); the colon leaves out gRPC's
            # "StatusCode.RESOURCE_EXHAUSTED" and an HTTP API's "429 RESOURCE_EXHAUSTED", which are quotas.
            r"|RESOURCE_EXHAUSTED: |Resource exhausted: "
        ),
    ),
    # The driver's out-of-memory code in an exception: a GPU already full when the framework starts.
    ("CUDA", re.compile(_EXCEPTION + r".*CUDA_ERROR_OUT_OF_MEMORY")),
    # Python: MemoryError, numpy's _ArrayMemoryError ("Unable to allocate 8.00 TiB for an array ...").
    ("Python", re.compile(r"^(?:[\w.]+\.)?_?\w*MemoryError\b")),
]
_NOT_FATAL = re.compile(
    r"The caller indicates that this is not a failure|^(?!" + _EXCEPTION + r").*CUDA_ERROR_OUT_OF_MEMORY"
)


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


def killed_by_oom_killer(job_dir: Path) -> bool:
    """Whether the kernel's OOM killer struck the job's cgroup while it ran: its count (runner/shim/cgroup.py) rose
    above the one its shim recorded just before the job started. Only where that shim ran, in this boot: a
    Slurm job's shim records a counter of its compute node, and a count from before a reboot starts again at
    0, so the counter read here then is another one, and its count says nothing of the job."""
    try:
        shim = jobdir.read_shim(job_dir / jobdir.SHIM) or {}
    except ValueError:
        return False
    if shim.get("boot_id") != boot_id():
        return False
    before, counter_file = shim.get("oom_kills"), shim.get("oom_file")
    now = cgroup.oom_kills(counter_file) if isinstance(counter_file, str) else None
    return isinstance(before, int) and now is not None and now > before


OOM_PENDING_BYTES = 64 << 10  # an unfinished line kept for the OOM search; longer ones are searched by their start
_SEGMENTS = re.compile(rb"[\r\n]")


def first_oom(pending: bytes, data: bytes) -> tuple[bytes, Optional[tuple[str, str]]]:
    """The lines `data` completes (after `pending`, the unfinished line the last search kept) searched for a fatal
    out-of-memory message: the unfinished line to keep for the next search, and the first message's (kind, line
    as shown), or None. The alert watch's OOM rule, on each read of a log."""
    text = pending + data
    last_newline = text.rfind(b"\n")
    complete, rest = text[: last_newline + 1], text[last_newline + 1 :][:OOM_PENDING_BYTES]
    if complete and may_hold_oom(complete):
        for line in _SEGMENTS.split(complete):
            if not may_hold_oom(line):
                continue
            shown = plain(display(line)).strip()
            kind = oom_kind(shown)
            if kind is not None:
                return rest, (kind, shown)
    return rest, None


LAST_WORDS_BYTES = 64 << 10  # where a failed job's last words are: its traceback


def in_last_words(found_at: Optional[int], log_size: int) -> bool:
    """Whether a fatal OOM message that the alert watch found (up to byte `found_at` of the log; None: none) is
    among the last words of a log of `log_size` bytes: the message the job's cause `oom` may be of, which the
    watch alerted as it read it."""
    return found_at is not None and log_size - found_at < LAST_WORDS_BYTES


def kill_summary(row: JobRow) -> Optional[str]:
    """The `oom` alert of a job whose cause is oom and whose last words hold no OOM message the watch alerted: who
    killed it for its memory, Slurm (its executor's reason) or the kernel's OOM killer (the SIGKILL that the
    lifecycle found with a risen OOM-kill count); None when neither did."""
    if row.reason == SLURM_OUT_OF_MEMORY:
        return "killed by Slurm over its memory limit (sbatch --mem)"
    if row.signal == signal.SIGKILL:
        return "killed by the kernel's OOM killer (SIGKILL)"
    return None


def log_ends_in_oom(log_path: Path) -> bool:
    """Whether the last LAST_WORDS_BYTES of a failed job's log hold a fatal out-of-memory line (the framework's
    traceback, as the oom alert reads it): the job failed for want of memory, not for a bug of its own."""
    try:
        with open(log_path, "rb") as f:
            f.seek(max(0, f.seek(0, os.SEEK_END) - LAST_WORDS_BYTES))
            tail = f.read()
    except OSError:
        return False
    if not may_hold_oom(tail):
        return False
    return any(oom_kind(plain(display(line)).strip()) for line in _SEGMENTS.split(tail) if may_hold_oom(line))
