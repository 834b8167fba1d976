"""Per-step metrics as JSON lines in the job's metrics file, where the daemon reads them exactly.

Scraping Keras's progress bar gives a running mean, rounded to four digits, as often as the bar redraws;
a line per step from inside the training process gives every value as it was. The daemon names the file
in TFRUN_METRICS_FILE (the job's folder, beside its log); outside tfrun nothing is written, and in a job of
several workers only the chief writes it (they train one model: the others' lines would repeat). Lines are
buffered and flushed about once a second, so writing costs microseconds a step; a reader ignores a last
line without its newline.

    {"step": 120, "epoch": 1, "time": 1796025600.25, "loss": 0.4312, "accuracy": 0.87}

Standard library only, Python 3.8.
"""

import json
import math
import os
import time

from .cluster import is_chief

METRICS_FILE_ENV = "TFRUN_METRICS_FILE"
FLUSH_EVERY_S = 1.0


class MetricWriter:
    """Appends one JSON line per call to the metrics file; does nothing when there is none (by default: no
    TFRUN_METRICS_FILE, or not the chief of a multi-worker job)."""

    def __init__(self, path=None):
        if path is None and is_chief():
            path = os.environ.get(METRICS_FILE_ENV)
        self._file = open(path, "a", buffering=1 << 16) if path else None  # noqa: SIM115 - kept open
        self._flushed = time.monotonic()

    def write(self, step, epoch=None, **values):
        """Record `values` (numbers; NaN and infinities are kept as such) at `step` of `epoch`."""
        if self._file is None:
            return
        record = {"step": int(step)}
        if epoch is not None:
            record["epoch"] = int(epoch)
        record["time"] = round(time.time(), 3)
        for name, value in values.items():
            try:
                record[name] = float(value)
            except (TypeError, ValueError):
                continue  # a string or a tensor of many values: not a metric
        self._file.write(json.dumps(record, separators=(",", ":")) + "\n")
        now = time.monotonic()
        if now - self._flushed >= FLUSH_EVERY_S:
            self.flush()
            self._flushed = now

    def flush(self):
        """Write out the lines still buffered (the daemon reads them from the file)."""
        if self._file is not None:
            self._file.flush()

    def close(self):
        """Close the metrics file; later writes do nothing."""
        if self._file is not None:
            self._file.close()
            self._file = None


def is_bad(value):
    """Whether a loss is NaN or infinite: training that produced it has diverged."""
    try:
        return not math.isfinite(float(value))
    except (TypeError, ValueError):
        return False
