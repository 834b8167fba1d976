"""Watching jobs: alerts and their deliveries, metrics, the box's GPUs, and `tfrun top`'s one-shot view."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Annotated, Optional

from tfrun.constants import (
    MAX_ALERTS,
    MAX_INT64,
    MAX_LOSS_JOBS,
    MAX_METRIC_BUCKETS,
    MAX_NAME,
    MAX_TOP_LOSSES,
    MAX_TOP_RECENT,
)
from tfrun.protocol.fields import JobRef, Limit, Range, Reading, Text
from tfrun.protocol.jobs import Job
from tfrun.protocol.wire import Message, Request, tagged


@dataclass
class Delivery:
    """One alert's way to one notification URL: `target` is the URL with its secrets masked."""

    target: str
    state: str  # "pending" (will retry), "sent", "expired" (gave up), or for `NotifyTest`: "sent"/"failed"
    attempts: int = 0
    sent_at: Optional[float] = None
    error: Optional[str] = None  # the last failure, secrets masked
    next_at: Optional[float] = None  # when a pending delivery is tried again


@dataclass
class Alert:
    """An alert as the daemon recorded it (before sending it anywhere)."""

    id: int
    rule: str  # oom, spike, stall, failed, done, lost, gpu-memory
    at: float
    summary: str  # one line
    body: str  # the whole message: host, job, the metric context, the last lines of output, checkpoints
    job_id: Optional[int] = None  # None for the box's own alerts (gpu-memory)
    deliveries: list[Delivery] = field(default_factory=list)


@dataclass
class Gpu:
    """One of the box's GPUs as `tfrun gpus` shows it; figures are None where NVML cannot be asked."""

    device: str  # as jobs are given it in CUDA_VISIBLE_DEVICES: an index or a UUID
    name: Optional[str] = None
    memory_used: Optional[int] = None  # bytes
    memory_total: Optional[int] = None
    utilization: Optional[int] = None  # percent
    job: Optional[int] = None  # the unfinished job it is given to
    # who holds it outside this daemon, so that none of its jobs gets it: another user's job (its box-wide
    # lease), a process outside tfrun with its memory; None from an older daemon
    held_by: Optional[str] = None


@dataclass
class GpuUse:
    """A GPU a job held, sampled by its daemon (runner/gpus/history.py): when, which, its memory in use and
    in all (bytes) and its load (percent; None where NVML did not say)."""

    time: float
    device: str
    used: int
    total: int
    load: Optional[int] = None


@dataclass
class MetricSample:
    """Metrics at one step of a job: from the tfrun.jobs callback (exact) or read from its log."""

    step: int
    values: dict[str, Reading]
    epoch: Optional[int] = None
    time: Optional[float] = None


@dataclass
class LineReading:
    """One line of a job's output as the daemon reads it for metrics (`tfrun metrics --explain`)."""

    line: str  # the line, ANSI colours removed, cut to 160 characters
    lines: int  # lines of the log of this shape (the same but for their numbers)
    why: str  # how it was read, or why nothing was
    values: dict[str, Reading] = field(default_factory=dict)  # what was read from it
    step: Optional[int] = None
    epoch: Optional[int] = None


@tagged("alerts")
@dataclass
class AlertList(Message):
    alerts: list[Alert]


@tagged("notify_report")
@dataclass
class NotifyReport(Message):
    results: list[Delivery]


@tagged("metrics")
@dataclass
class MetricsReply(Message):
    """`source`: "callback" (tfrun.jobs wrote them), "log" (read from the output), or "none" yet."""

    source: str
    samples: list[MetricSample]
    thinned: bool = False  # some samples of the steps asked were left out (GetMetrics.buckets)
    cursor: Optional[str] = None  # where this read ended, for the next's GetMetrics.cursor


@tagged("losses")
@dataclass
class LossesReply(Message):
    """`losses`: each job's last training losses, oldest first, by its id (absent: none printed yet, or no such
    job); `reading`: the ended jobs among them whose log the daemon has not read to its end yet (their losses
    may still grow; the others' never change)."""

    losses: dict[str, list[Reading]]
    reading: list[int] = field(default_factory=list)


@tagged("gpu_use")
@dataclass
class GpuUseReply(Message):
    """`next`: the byte of the job's samples file the next GetGpuUse starts at; `thinned`: some samples of
    the time asked were left out (GetGpuUse.buckets)."""

    samples: list[GpuUse]
    next: int = 0
    thinned: bool = False


@tagged("metrics_explained")
@dataclass
class MetricsExplained(Message):
    """`truncated`: the log is longer than what was read (its first 8 MiB)."""

    readings: list[LineReading]
    truncated: bool = False


@tagged("gpus")
@dataclass
class GpuList(Message):
    gpus: list[Gpu]


@tagged("top_reply")
@dataclass
class TopReply(Message):
    jobs: list[Job]
    gpus: list[Gpu]
    losses: dict[str, list[Reading]]  # job id -> its last losses, oldest first
    host: str = ""
    default_gpus: Optional[int] = None  # GPUs a job without --gpus gets there; None from an older daemon


@tagged("list_alerts")
@dataclass
class ListAlerts(Request[AlertList]):
    """Alerts of one job (or of all, newest last), with how their delivery went; answered by `AlertList`."""

    job: Optional[JobRef] = None
    limit: Annotated[int, Range(1, MAX_ALERTS)] = 100


@tagged("notify_test")
@dataclass
class NotifyTest(Request[NotifyReport]):
    """Send one test message to `url`, or to each URL the daemon is configured with; answered by
    `NotifyReport` once every attempt is over. Nothing is stored or retried."""

    url: Optional[Text] = None


@tagged("get_metrics")
@dataclass
class GetMetrics(Request[MetricsReply]):
    """A job's metrics, the last `last` samples (all when None) of those at steps above `after` and up to
    `upto`; with `buckets`, thinned to what a chart of that many pixels draws: of each of `buckets` equal
    ranges of steps, its first and last sample and, of each metric, the sample of its lowest, its highest and
    its first non-finite value (real samples, none made up); with `cursor` (a `MetricsReply`'s), of the lines
    written since that reply only (a cursor that names another file, or a place past its end, reads from the
    start). Answered by `MetricsReply`. A daemon before these four ignores them and answers every sample."""

    job: JobRef
    last: Optional[Annotated[int, Range(1, MAX_INT64)]] = None
    after: Optional[Annotated[int, Range(-MAX_INT64, MAX_INT64)]] = None
    upto: Optional[Annotated[int, Range(-MAX_INT64, MAX_INT64)]] = None
    buckets: Optional[Annotated[int, Range(1, MAX_METRIC_BUCKETS)]] = None
    cursor: Optional[Annotated[Text, Limit(chars=MAX_NAME)]] = None


@tagged("explain_metrics")
@dataclass
class ExplainMetrics(Request[MetricsExplained]):
    """How the daemon reads the job's output for metrics, one line of each shape; answered by
    `MetricsExplained`."""

    job: JobRef
    lines: Annotated[int, Range(1, 1000)] = 30


@tagged("get_losses")
@dataclass
class GetLosses(Request[LossesReply]):
    """The last `last` training losses of each of `jobs`, in one round trip: the trend lines of a page of jobs
    (`tfrun ui`), where a request a job cost a page of 50 ended jobs 50 round trips. Answered by `LossesReply`."""

    jobs: Annotated[list[JobRef], Limit(items=MAX_LOSS_JOBS)]
    last: Annotated[int, Range(1, MAX_TOP_LOSSES)] = 30


@tagged("get_gpu_use")
@dataclass
class GetGpuUse(Request[GpuUseReply]):
    """The memory and load of the GPUs a job held over its life, as its daemon sampled them: those written at
    or after byte `since` of its samples file (a reply's `next`: only the new ones), thinned with `buckets` to
    each GPU's first sample and its peaks of memory and load in each of that many ranges of time."""

    job: JobRef
    since: Annotated[int, Range(0, MAX_INT64)] = 0
    buckets: Optional[Annotated[int, Range(1, MAX_METRIC_BUCKETS)]] = None


@tagged("list_gpus")
@dataclass
class ListGpus(Request[GpuList]):
    """The box's GPUs, their memory and load, and the job each is given to; answered by `GpuList`."""


@tagged("top")
@dataclass
class Top(Request[TopReply]):
    """What `tfrun top` shows, in one round trip: unfinished jobs and the `recent` last ended ones, the
    GPUs, and each shown job's last training losses. Answered by `TopReply`."""

    recent: Annotated[int, Range(0, MAX_TOP_RECENT)] = 5
    losses: Annotated[int, Range(0, MAX_TOP_LOSSES)] = 30
