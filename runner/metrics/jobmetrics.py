"""A job's metrics: read as it runs from its log and from the metrics.jsonl tfrun.jobs writes, kept, and
read back for `tfrun metrics` and `tfrun top`.

A *sample* is one step's metrics (runner/metrics/ reads them from the log; a line of metrics.jsonl is one).
The samples read from the log are appended to the job's logmetrics.jsonl, the view shown for a job that writes
no metrics.jsonl of its own. A *loss point* is a sample's training loss at its step, which the alert rules
follow (runner/alerts/watch.py). Both files are the job's: nothing read back from them is trusted.
"""

from __future__ import annotations

import json
import math
import os
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any, BinaryIO, NamedTuple, Optional

from tfrun.losses import TrainingLoss
from tfrun.numerals import is_digits
from tfrun.protocol.watching import MetricSample

from ..shim import jobdir
from . import Sample, plausible, training_loss
from .eventfile import PRINTED, ScalarFile

TOP_TAIL_BYTES = 64 << 10  # the end of a metrics file that `tfrun top` reads
_COMPACT = json.JSONEncoder(separators=(",", ":")).encode  # one encoder for every line: json.dumps with these
# separators builds one a call, a tenth of the cost of keeping a sample


class LossPoint(NamedTuple):
    """A training loss at a step; `position` and `name` say, for an alert, where the log printed it and
    what the value is where not the loss (see log_losses)."""

    step: int
    loss: Optional[float]
    position: str = ""
    name: Optional[str] = None


def printed_run(job_dir: Path) -> ScalarFile:
    """The job's TensorBoard folder's `printed` run (runner/metrics/eventfile.py): curves for a script that writes
    none. One per job for the watch's life: it finds its file once."""
    return ScalarFile(job_dir / jobdir.TENSORBOARD / PRINTED)


def keep_log_metrics(job_dir: Path, samples: list[Sample], printed: ScalarFile) -> None:
    """Append to the job's logmetrics.jsonl, the view `tfrun metrics` shows when the job writes none, and to
    its `printed` run (`printed_run`)."""
    now = round(time.time(), 3)
    lines = []
    for sample in samples:
        record: dict[str, Any] = {"step": sample.step}
        if sample.epoch is not None:
            record["epoch"] = sample.epoch
        record["time"] = now
        record.update(sample.values)
        lines.append(_COMPACT(record) + "\n")
    with open(job_dir / jobdir.LOG_METRICS, "ab") as f:  # bytes: no text layer to build for one write
        f.write("".join(lines).encode())
    printed.append([(s.step, s.values) for s in samples])


def log_losses(samples: list[Sample], follow: TrainingLoss) -> Iterator[LossPoint]:
    """The loss of each sample read from the log, as `follow` follows one loss from sample to sample (a NaN
    gradient norm beside a finite loss is answered instead, and named). Lazily: `follow` is where the last
    point taken left it, as the watch saves it."""
    for sample in samples:
        loss = follow.of(sample.values)
        yield LossPoint(sample.step, loss, _position(sample), follow.cause)


def callback_losses(path: str, offset: int, limit: int) -> Optional[tuple[int, list[LossPoint], bool]]:
    """(the bytes read, the losses in them, whether that was all the file held) from the lines tfrun.jobs appended
    to metrics.jsonl (at `path`) past `offset`, `limit` bytes at most; a last line without its newline waits,
    but for one longer than `limit`, which is no record of tfrun.jobs': passed over. None when the file has not
    grown."""
    try:
        size = os.stat(path).st_size
    except FileNotFoundError:
        return None
    if size <= offset:
        return None
    with open(path, "rb") as f:
        f.seek(offset)
        data = f.read(min(size - offset, limit))
    lines = data[: data.rfind(b"\n") + 1] or (data if len(data) == limit else b"")  # (its rest fails to parse)
    points = []
    for line in lines.splitlines():
        try:
            record = json.loads(line)
        except ValueError:
            continue
        if isinstance(record, dict) and plausible(record.get("step")):
            points.append(LossPoint(record["step"], _loss_of(record)))
    return len(lines), points, offset + len(data) >= size


def read_metrics(
    job_dir: Path,
    last: Optional[int],
    after: Optional[int] = None,
    upto: Optional[int] = None,
    cursor: Optional[str] = None,
) -> tuple[str, list[MetricSample], Optional[str]]:
    """A job's metrics for `tfrun metrics` and charts: its own metrics.jsonl when it wrote one, else what was
    read from its log, one sample a step; the last `last` samples of those at steps above `after`, up to
    `upto` (a chart's new points, a zoom's). `cursor`, a reply's own, reads only the lines written since that
    reply (a chart's page asks each second: reading the whole file each time cost tfrund 130 ms a look at
    36,000 steps); the cursor returned is where the next read starts (the source, and the byte after the
    last whole line read)."""
    for source, name in (("callback", jobdir.METRICS), ("log", jobdir.LOG_METRICS)):
        path = job_dir / name
        if path.exists() and path.stat().st_size:
            samples: list[MetricSample] = []
            with open(path, "rb") as f:
                size = os.fstat(f.fileno()).st_size
                start = _resumed_at(cursor, source, size)
                f.seek(start)
                whole = start
                for line in _lines_until(f, size - start):
                    if line.endswith(b"\n"):  # a line still being written is read again next time
                        whole += len(line)
                    sample = _sample(line)
                    if sample is None:
                        continue
                    if source == "log" and samples and samples[-1].step == sample.step:
                        samples[-1] = _updated(samples[-1], sample)
                    else:
                        samples.append(sample)
            if after is not None or upto is not None:
                samples = [s for s in samples if (after is None or s.step > after) and (upto is None or s.step <= upto)]
            return source, samples[-last:] if last else samples, f"{source}@{whole}"
    return "none", [], None


def unread_bytes(job_dir: Path, cursor: Optional[str]) -> int:
    """How much of the job's metrics file a `read_metrics` from `cursor` reads: the bytes past it, or the whole
    file (a cursor of another file, or none)."""
    for source, name in (("callback", jobdir.METRICS), ("log", jobdir.LOG_METRICS)):
        try:
            size = (job_dir / name).stat().st_size
        except OSError:
            continue
        if size:
            return size - _resumed_at(cursor, source, size)
    return 0


def _resumed_at(cursor: Optional[str], source: str, size: int) -> int:
    """The byte a read of `source` starts at: where `cursor` says the last one ended, if it names this source
    and a place within the file; else its start (a cursor of the log's when the job's own metrics.jsonl has
    appeared since, one from a file replaced, or none)."""
    named, _, at = (cursor or "").partition("@")
    return int(at) if named == source and is_digits(at) and len(at) <= 19 and int(at) <= size else 0


def thinned(samples: list[MetricSample], buckets: int) -> list[MetricSample]:
    """The samples a chart `buckets` pixels wide needs to draw `samples` as it would draw them all, as uPlot's
    users thin a series (min/max per pixel): in each of `buckets` equal ranges of steps, the first and last
    sample, and each metric's lowest, highest and first non-finite (a gap the chart must show). Real samples
    only, in their order: what a zoom asks again is the same points, more of them."""
    low = min(sample.step for sample in samples)
    span = max(sample.step for sample in samples) - low + 1
    kept: dict[tuple[int, str], int] = {}  # (bucket, what) -> the index of the sample kept for it
    for index, sample in enumerate(samples):
        bucket = (sample.step - low) * buckets // span
        kept.setdefault((bucket, ""), index)
        kept[(bucket, "\0last")] = index
        for name, value in sample.values.items():
            if not math.isfinite(value):
                kept.setdefault((bucket, "\0odd" + name), index)
                continue
            lowest, highest = (bucket, "\0low" + name), (bucket, "\0high" + name)
            if lowest not in kept or value < samples[kept[lowest]].values[name]:
                kept[lowest] = index
            if highest not in kept or value > samples[kept[highest]].values[name]:
                kept[highest] = index
    return [samples[index] for index in sorted(set(kept.values()))]


def _lines_until(f: BinaryIO, end: int) -> Iterator[bytes]:
    """The lines of `f` that begin before `end`: the file as it was when asked, as a job appending fast moves
    its end faster than it is read, and a read to the end would never stop."""
    read = 0
    for line in f:
        if read >= end:
            return
        read += len(line)
        yield line


def _updated(sample: MetricSample, later: MetricSample) -> MetricSample:
    """A step's sample with what a later line at that step gave (an evaluation's value that changed where the
    log printed it twice, a print placed at the step a bar reached): its values added, the last one winning, as a
    terminal shows the last."""
    return MetricSample(
        step=sample.step,
        values={**sample.values, **later.values},
        epoch=later.epoch if later.epoch is not None else sample.epoch,
        time=later.time if later.time is not None else sample.time,
    )


def recent_losses(job_dir: Path, n: int, unkept: Sequence[MetricSample] = ()) -> list[float]:
    """The job's last `n` training losses, from the end of its metrics file (the view `tfrun top` draws), and
    from the samples read from its log and not kept yet (`unkept`: `pending`) where the log is the source."""
    for name in (jobdir.METRICS, jobdir.LOG_METRICS):
        try:
            with open(job_dir / name, "rb") as f:
                size = f.seek(0, os.SEEK_END)
                f.seek(max(0, size - TOP_TAIL_BYTES))
                lines = f.read().splitlines()[1 if size > TOP_TAIL_BYTES else 0 :]
        except OSError:
            lines = []
        samples = [sample for sample in map(_sample, lines) if sample is not None]
        if name == jobdir.LOG_METRICS:
            samples += unkept
        losses = []
        follow = TrainingLoss()  # one loss from line to line: a GAN's two are not one curve (tfrun/losses.py)
        for sample in samples:
            loss = follow.of(sample.values)
            if loss is not None:
                losses.append(loss)
        if losses:
            return losses[-n:]
    return []


def pending(samples: Sequence[Sample]) -> list[MetricSample]:
    """Samples read from a log and not kept yet, as `read_metrics` would read them back once kept: one a step
    (a step's later values winning), numbers only."""
    found: list[MetricSample] = []
    for sample in samples:
        values = {k: float(v) for k, v in sample.values.items() if isinstance(v, (int, float))}
        shown = MetricSample(step=sample.step, values=values, epoch=sample.epoch)
        if found and found[-1].step == sample.step:
            found[-1] = _updated(found[-1], shown)
        else:
            found.append(shown)
    return found


def _sample(line: bytes) -> Optional[MetricSample]:
    """One line of a metrics file as a sample, or None: the file is the job's, so nothing in it is trusted
    (a step of 10^30 or a time of 1e400 would be refused by the client reading the reply)."""
    try:
        record = json.loads(line)
    except ValueError:
        return None
    if not isinstance(record, dict):
        return None
    step, epoch, at = record.pop("step", None), record.pop("epoch", None), record.pop("time", None)
    if not plausible(step):
        return None
    values = {k: float(v) for k, v in record.items() if isinstance(v, (int, float)) and not isinstance(v, bool)}
    return MetricSample(
        step=step,
        values=values,
        epoch=epoch if plausible(epoch) else None,
        time=float(at) if type(at) in (int, float) and math.isfinite(at) else None,
    )


def _loss_of(values: dict[str, Any]) -> Optional[float]:
    """The training loss among a sample's or a metrics line's values (numbers only: the file is the job's)."""
    return training_loss(
        {k: float(v) for k, v in values.items() if isinstance(v, (int, float)) and not isinstance(v, bool)}
    )


def _position(sample: Sample) -> str:
    """Where a sample read from the log was printed, when its step is not what the line shows: the epoch and the
    line's own counter (`epoch 2, step 100` of a loop whose steps restart, Keras's `batch 40`), so that a user
    finds the line the alert is about."""
    if sample.epoch is None or sample.printed_step is None or sample.printed_step == sample.step:
        return ""
    counter = {"keras": "batch", "lightning": "batch", "bar": "batch"}.get(sample.source, "step")
    return f" (epoch {sample.epoch}, {counter} {sample.printed_step})"
