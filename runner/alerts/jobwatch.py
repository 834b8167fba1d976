"""A job's *watch* (Watch) is where the reading of its output stands: the log's offset, the metrics reader's and
the spike detectors' state, the last losses. Its state is saved in the database (the `watches` table, a row per
job being watched); nothing else is called a watch (followers of a log's growth: runner/logs/loggrowth.py).
"""

from __future__ import annotations

import base64
import os
import time
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Optional

from tfrun.losses import TrainingLoss

from ..metrics import LogMetrics, Sample
from ..metrics.eventfile import ScalarFile
from ..metrics.jobmetrics import keep_log_metrics
from .spikes import SpikeDetector

# A look (read_log) reads one job's log for this long at most; a pass of the watch whose looks left a backlog
# gives the event loop as long again before the next (runner/alerts/watch.py: a backlog costs tfrund half a core
# at most). A job that prints metric lines faster than they are parsed (a tight loop's 400,000 a second, at 20-40
# µs each) has a backlog of seconds: read in one go, it held every client's request (`tfrun ps` took 17-37 s)
# and the samples of 8 MB of it (400 MB of RSS).
LOOK_BUDGET_S = 0.02
LOOK_READ_BYTES = 256 << 10  # read from the log per look, and parsed in pieces of
LOOK_PIECE_BYTES = 32 << 10  # about 1,000 metric lines, 20 ms: the grain of the budget


@dataclass
class Watch:
    """Where the watch over one job stands; `state()` is what the database keeps of it."""

    job_id: int
    offset: int = 0  # bytes of the log read
    pending: bytes = b""  # the log's unfinished last line, for the OOM search
    oom_at: Optional[int] = None  # the log's offset after the piece where the OOM search last found a message
    metrics_offset: int = 0  # bytes of metrics.jsonl read
    from_callback: bool = False  # the job writes metrics.jsonl: its losses are the exact ones
    stalled: bool = False
    metrics: LogMetrics = field(default_factory=LogMetrics)
    spikes: SpikeDetector = field(default_factory=SpikeDetector)
    callback_spikes: SpikeDetector = field(default_factory=SpikeDetector)
    log_loss: TrainingLoss = field(default_factory=TrainingLoss)  # the loss the log's samples are followed by
    losses: deque[tuple[int, float]] = field(default_factory=lambda: deque(maxlen=10))
    saved_at: float = 0.0
    active_at: float = 0.0  # when output was last seen (wall clock; 0: not yet known, the files say)
    unkept: list[Sample] = field(default_factory=list)  # samples read, not yet appended to logmetrics.jsonl
    kept_at: float = 0.0
    job_dir: Optional[Path] = None  # the job's folder, and in it (set at load, as strings: no Path per look)
    output_path: str = ""
    metrics_path: str = ""
    printed: Optional[ScalarFile] = None  # the `printed` TensorBoard run, which finds its file once

    def state(self) -> dict[str, Any]:
        return {
            "offset": self.offset,
            "pending": base64.b64encode(self.pending).decode(),
            "oom_at": self.oom_at,
            "metrics_offset": self.metrics_offset,
            "from_callback": self.from_callback,
            "stalled": self.stalled,
            "metrics": self.metrics.state(),
            "spikes": self.spikes.state(),
            "callback_spikes": self.callback_spikes.state(),
            "log_loss": self.log_loss.name,
            "losses": list(self.losses),
        }

    @classmethod
    def restore(cls, job_id: int, state: dict[str, Any], patterns: list[str]) -> Watch:
        watch = cls(
            job_id=job_id,
            offset=state["offset"],
            pending=base64.b64decode(state["pending"]),
            oom_at=state.get("oom_at"),  # absent from a watch saved by an older daemon
            metrics_offset=state["metrics_offset"],
            from_callback=state["from_callback"],
            stalled=state["stalled"],
            metrics=LogMetrics.restore(state["metrics"], patterns),
            spikes=SpikeDetector.restore(state["spikes"]),
            callback_spikes=SpikeDetector.restore(state["callback_spikes"]),
            log_loss=TrainingLoss(state.get("log_loss")),  # absent from a watch saved by an older daemon
        )
        watch.losses.extend((int(step), float(loss)) for step, loss in state["losses"])
        return watch


@dataclass
class Settings:
    """What a job's alerts need to know: its rules, where its alerts go, its metric patterns."""

    rules: dict[str, Optional[float]]
    urls: list[str]  # secret
    patterns: list[str]


def keep(watch: Watch) -> None:
    """Append the samples the watch read from the log to the job's metrics files: every KEEP_EVERY_S at most, as
    one write (a progress bar redrawn 20 times a second was two files opened for each redraw; at one line a
    second, 100 jobs cost the daemon 100 opens of two files a second)."""
    samples, watch.unkept = watch.unkept, []
    watch.kept_at = time.monotonic()
    if samples and watch.job_dir is not None and watch.printed is not None:
        keep_log_metrics(watch.job_dir, samples, watch.printed)


def read_log(watch: Watch, take: Callable[[bytes], None]) -> bool:
    """The next LOOK_READ_BYTES at most of the job's log, handed to `take` in pieces of LOOK_PIECE_BYTES until
    LOOK_BUDGET_S is spent, the watch's offset moved past each; True once the log is read to its end."""
    try:
        fd = os.open(watch.output_path, os.O_RDONLY | os.O_CLOEXEC)  # no file object: a look is a few syscalls
    except FileNotFoundError:
        return True
    try:
        size = os.fstat(fd).st_size
        if size <= watch.offset:
            return True
        data = os.pread(fd, min(size - watch.offset, LOOK_READ_BYTES), watch.offset)
    finally:
        os.close(fd)
    watch.stalled, watch.active_at = False, time.time()
    began = time.perf_counter()
    for start in range(0, len(data), LOOK_PIECE_BYTES):
        piece = data[start : start + LOOK_PIECE_BYTES]  # all of it, not a copy, when it is one piece
        watch.offset += len(piece)
        take(piece)
        if time.perf_counter() - began >= LOOK_BUDGET_S:
            break
    return watch.offset >= size
