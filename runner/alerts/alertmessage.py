"""What an alert says: its summary line and its text (runner/alerts/alerttext.py renders the text for each receiver).

The *summary* is one line, `job 12 (name) on host: what happened`; the *text* (its body) adds the job's
fields, its last losses and the last lines of its output: of a failed job on several Slurm nodes, those of the
task that failed first (its task-I.log, when that is not task 0: runner/shim/slurmtask.py).
"""

from __future__ import annotations

import time
from collections.abc import Collection
from pathlib import Path
from typing import Optional

from tfrun.constants import EXIT_LOST
from tfrun.protocol.fields import JobState
from tfrun.shorten import shorten

from ..logs.lines import TerminalLines, display, plain
from ..records.job import JobRow
from ..shim import jobdir
from ..shim.slurmtask import TASK_LOG, first_failed_task
from .alerttext import INDENT
from .spikes import DEFAULT_PATIENCE, Spike

CONTEXT_LINES = 15
CONTEXT_BYTES = 32 << 10


def body(host: str, row: JobRow, summary: str, losses: Collection[tuple[int, float]], offset: int) -> str:
    """The alert's text, laid out as runner/alerts/alerttext.py reads it back: mail shows it as HTML, Slack as
    mrkdwn, and both keep its lines. `losses`: the last (step, loss) seen; `offset`: how far the log is read."""
    command = " ".join([row.spec.script, *row.spec.args])
    task = failed_task(row)
    log = Path(row.job_dir) / (TASK_LOG.format(task) if task else jobdir.OUTPUT)
    lines = [
        summary,
        "",
        f"Host:        {host}",
        f"Job:         {label(row)}: {command} ({row.state})",
        f"Checkpoints: {row.checkpoint_dir}",
        f"Log:         {log}  (tfrun logs {row.id}{f' --task {task}' if task else ''})",
    ]
    if row.restarted_as:
        lines.append(f"Restarted:   as job {row.restarted_as}")
    if losses:
        shown = ", ".join(f"{step}: {loss:.4g}" for step, loss in losses)
        lines += ["", "Last losses (step: loss):", f"{INDENT}{shown}"]
    tail = _last_lines(log, _size(log) if task else offset)
    if tail:
        caption = f"Last lines of task {task}'s output:" if task else "Last lines of output:"
        lines += ["", caption, *(f"{INDENT}{line}" for line in tail)]
    return "\n".join(lines) + "\n"


def failed_task(row: JobRow) -> Optional[int]:
    """The task of a failed job on several Slurm nodes whose command failed first, if not task 0: its output,
    not the job's log (task 0's, most often only its stop), says why the job failed. None otherwise."""
    tasks = row.spec.nodes or 1
    if row.state != JobState.FAILED or tasks < 2:
        return None
    return first_failed_task(row.job_dir, tasks) or None


def _size(path: Path) -> int:
    """How long the file is now (0 if it is missing): a task's log is read whole, the job being over."""
    try:
        return path.stat().st_size
    except OSError:
        return 0


def spike_summary(spike: Spike, position: str = "", name: Optional[str] = None) -> str:
    if spike.kind in ("nan", "inf"):
        what = name if name and "grad_norm" in name else "loss"
        return f"{what} is {spike.value} at step {spike.step}{position}"
    ratio = spike.value / spike.baseline
    return (
        f"loss spike at step {spike.step}{position}: {spike.value:.4g}, {ratio:.1f}x the 90th percentile of the last "
        f"losses ({spike.baseline:.4g}), for {DEFAULT_PATIENCE} losses in a row"
    )


def failure(row: JobRow) -> str:
    if row.exit_code == EXIT_LOST or row.exit_code is None:
        how = row.reason or "failed"
    elif row.signal:
        how = f"killed by signal {row.signal} (exit code {row.exit_code})"
    else:
        how = f"exited with code {row.exit_code}"
    if row.reason and row.reason not in how:
        how += f": {row.reason}"
    task = failed_task(row)
    if task:
        how += f" (task {task} of {row.spec.nodes} failed first)"
    after = f" after {minutes(runtime(row))}" if row.started_at else ""
    again = f"; running it again as job {row.restarted_as}" if row.restarted_as else ""
    return f"failed{after}: {how}{again}"


def _last_lines(path: Path, end: int) -> list[str]:
    """The last lines of the log before byte `end`, as a terminal shows them."""
    try:
        with open(path, "rb") as f:
            start = max(0, end - CONTEXT_BYTES)
            f.seek(start)
            data = f.read(end - start)
    except OSError:
        return []
    lines = TerminalLines()
    finished = lines.feed(data)
    rest = lines.pending()
    if rest:
        finished.append(rest)
    if start > 0:
        finished = finished[1:]  # the first line is cut
    return [shorten(plain(display(line)), 300) for line in finished[-CONTEXT_LINES:]]


def label(row: JobRow) -> str:
    return f"{row.id} ({row.name})" if row.name else str(row.id)


def runtime(row: JobRow) -> float:
    return max(0.0, (row.finished_at or time.time()) - (row.started_at or row.created_at))


def minutes(seconds: float) -> str:
    if seconds < 120:
        return f"{seconds:.0f} s"
    if seconds < 7200:
        return f"{seconds / 60:.0f} min"
    return f"{seconds / 3600:.1f} h"
