"""Which failures `submit --max-restarts N` restarts (`--restart-on CAUSES`): shared by the client, which reads
the option, and the daemon, which stores it with the job and applies it when the job ends.

The causes (`tfrun.protocol.fields.Cause`), as the daemon tells them at a job's end (runner/records/lifecycle.py):

    lost    its shim, the daemon or the machine went away without a record of its end; on Slurm, a node
            failure or a preemption too
    oom     it ran out of memory: the kernel's OOM killer killed it (its cgroup's memory.events), Slurm killed
            it over its memory limit, or its log ends with a fatal out-of-memory message (runner/records/oom.py)
    signal  a signal killed it that was not tfrun's cancel (a kill -9, a segfault, a time limit's SIGTERM)
    error   it failed any other way: it exited non-zero, or could not start

The default is lost, oom and signal: what goes wrong around a script, which running it again (from its last
checkpoint) may get past. An error is the script's own (a KeyError at step 1), and running it again fails
the same way, N more times and N more alerts; `--restart-on all` (or a list with `error`) restarts it too,
as every failure did before --restart-on. A job stored by a tfrund from before keeps that: its spec has no
restart_on, which reads as all (runner/records/job.py).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Union

from tfrun.protocol.fields import CAUSES, Cause

DEFAULT: tuple[Cause, ...] = ("lost", "oom", "signal")
ALL_WORD = "all"  # --restart-on all: every cause


def parse(causes: Union[str, Iterable[str]]) -> tuple[Cause, ...]:
    """The causes named (comma lists, `all`), each once and in CAUSES' order; ValueError names the unknown
    ones and the valid ones, in the option's words."""
    texts = [causes] if isinstance(causes, str) else list(causes)
    words = [word.strip().lower() for text in texts for word in text.split(",") if word.strip()]
    unknown = [word for word in words if word != ALL_WORD and word not in CAUSES]
    if unknown:
        valid = ", ".join((*CAUSES, ALL_WORD))
        raise ValueError(f"unknown cause {', '.join(map(_as_typed, unknown))}: the causes are {valid}")
    if not words:
        raise ValueError(f"name at least one cause: {', '.join((*CAUSES, ALL_WORD))}")
    return CAUSES if ALL_WORD in words else tuple(cause for cause in CAUSES if cause in words)


def shown(causes: Iterable[str]) -> str:
    """Causes as --restart-on takes them: "lost,oom,signal"."""
    return ",".join(causes) or "nothing"


def _as_typed(word: str) -> str:
    """`word` quoted as the user typed it: bytes that are not UTF-8 as \\xNN ('a\\xff', not 'a\\udcff')."""
    shown = word.encode("utf-8", "surrogateescape").decode("utf-8", "backslashreplace")
    return "'" + "".join(c if c.isprintable() else repr(c)[1:-1] for c in shown) + "'"
