"""Calls that watch jobs and the box (tfrun/protocol/watching.py): alerts, notify tests, metrics, GPUs, top."""

from __future__ import annotations

from typing import Optional

from tfrun.protocol.watching import (
    Alert,
    AlertList,
    Delivery,
    ExplainMetrics,
    GetGpuUse,
    GetLosses,
    GetMetrics,
    Gpu,
    GpuList,
    GpuUseReply,
    ListAlerts,
    ListGpus,
    LossesReply,
    MetricsExplained,
    MetricsReply,
    NotifyReport,
    NotifyTest,
    Top,
    TopReply,
)

from . import Call, whole


def alerts(job: Optional[str] = None, limit: int = 100) -> Call[AlertList, list[Alert]]:
    """The newest `limit` alerts of one job, or of every job and the box, with how their delivery went."""
    return Call(ListAlerts(job=job, limit=limit), lambda reply: reply.alerts)


def notify_test(url: Optional[str] = None) -> Call[NotifyReport, list[Delivery]]:
    """A test message sent from the box to `url`, or to each notify URL of its config; how each went."""
    return Call(NotifyTest(url=url), lambda reply: reply.results)


def metrics(
    job: str, last: Optional[int] = None, after: Optional[int] = None, upto: Optional[int] = None,
    buckets: Optional[int] = None, cursor: Optional[str] = None,
) -> Call[MetricsReply, MetricsReply]:  # fmt: skip
    """The job's metrics by step (the last `last` samples, or all; above step `after` and up to `upto`;
    thinned to a chart of `buckets` pixels; written since the reply whose `cursor` this is: GetMetrics) and
    where they were read from."""
    asked = GetMetrics(job=job, last=last, after=after, upto=upto, buckets=buckets, cursor=cursor)
    return Call(asked, whole)


def losses(jobs: list[str], last: int = 30) -> Call[LossesReply, LossesReply]:
    """The last `last` training losses of each of `jobs` in one round trip, and which ended ones may grow yet."""
    return Call(GetLosses(jobs=jobs, last=last), whole)


def gpu_use(job: str, since: int = 0, buckets: Optional[int] = None) -> Call[GpuUseReply, GpuUseReply]:
    """The memory and load of the GPUs the job held, sampled by its daemon: those written since byte `since`
    (a reply's `next`), thinned to `buckets` ranges of time where they are more (GetGpuUse)."""
    return Call(GetGpuUse(job=job, since=since, buckets=buckets), whole)


def explain_metrics(job: str, lines: int = 30) -> Call[MetricsExplained, MetricsExplained]:
    """How the daemon reads the job's output: one line of each shape, up to `lines`, and what it read."""
    return Call(ExplainMetrics(job=job, lines=lines), whole)


def gpus() -> Call[GpuList, list[Gpu]]:
    """The box's GPUs, their memory and load, and the job each is given to."""
    return Call(ListGpus(), lambda reply: reply.gpus)


def top(recent: int = 5, losses: int = 30) -> Call[TopReply, TopReply]:
    """`tfrun top`'s frame: jobs (and the `recent` that ended last), GPUs, each job's last `losses`. A pool's
    placement asks with 0 and 0: its figures only."""
    return Call(Top(recent=recent, losses=losses), whole)
