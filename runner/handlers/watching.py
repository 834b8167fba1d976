"""Handlers that look at jobs and the box: alerts, metrics and how they are read, GPUs, `top`."""

from __future__ import annotations

import asyncio
import functools
from pathlib import Path
from typing import TYPE_CHECKING, Optional, Protocol

from tfrun.constants import (
    FOLLOW_POLL_S,
    MAX_METRIC_SAMPLES,
    METRICS_SETTLE_S,
)
from tfrun.protocol.watching import (
    AlertList,
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
    MetricSample,
    MetricsExplained,
    MetricsReply,
    NotifyReport,
    NotifyTest,
    Top,
    TopReply,
)

from ..alerts.outbox import diagnose, usable
from ..gpus.devices import held_outside, read_gpu_memory
from ..gpus.history import read_gpu_use
from ..metrics import PatternError as MetricPatternError
from ..metrics.explain import explain
from ..metrics.jobmetrics import pending, read_metrics, recent_losses, thinned, unread_bytes
from ..shim import jobdir
from .base import Connection, Shown, find, handles, invalid, public

INLINE_METRICS_BYTES = 16 << 10  # read on the event loop below this (a look a second at a job printing fast: ~2 KB)

if TYPE_CHECKING:
    from tfrun.paths import Layout

    from ..alerts.outbox import Outbox
    from ..alerts.watch import Alerts
    from ..executors.runs import Runs
    from ..queue.scheduler import Scheduler


class Context(Shown, Protocol):
    """What alerts, metrics, GPUs and top need of the daemon (runner/daemon.py's Daemon is one)."""

    alerts: Alerts
    layout: Layout
    outbox: Outbox
    scheduler: Scheduler
    runs: Runs


@handles(ListAlerts)
async def list_alerts(daemon: Context, req: ListAlerts, conn: Connection) -> None:
    job_id = find(daemon, req.job).id if req.job is not None else None
    await conn.send(AlertList(daemon.store.alerts(job_id, req.limit)))


@handles(NotifyTest)
async def notify_test(daemon: Context, req: NotifyTest, conn: Connection) -> None:
    """One message to the URL given, or to each of the daemon's; the report says how each went. A URL given
    that apprise cannot use is bad input: the error says what is wrong with it."""
    if req.url and not usable(req.url):
        raise invalid(diagnose(req.url))
    urls = [req.url] if req.url else daemon.config.notify
    if not urls:
        raise invalid(
            f"no URL given, and the daemon has no notify URLs (set notify = [...] in {daemon.layout.config_file})"
        )
    host = daemon.alerts.host
    title = f"tfrun: test message from {host}"
    body = f"This is a test message from tfrund on {host}. Alerts about jobs on this box will arrive like this.\n"
    await conn.send(NotifyReport(await daemon.outbox.test(urls, title, body)))


@handles(GetMetrics)
async def get_metrics(daemon: Context, req: GetMetrics, conn: Connection) -> None:
    row = find(daemon, req.job)
    if row.final:
        await _watch_caught_up(daemon, row.id)
    if req.cursor is None:  # every sample read so far in the files, not only those kept every KEEP_EVERY_S
        daemon.alerts.keep_now(row.id)
    last = min(req.last or MAX_METRIC_SAMPLES, MAX_METRIC_SAMPLES)
    work = functools.partial(_metrics_asked, Path(row.job_dir), last, req)
    if req.cursor is not None and unread_bytes(Path(row.job_dir), req.cursor) <= INLINE_METRICS_BYTES:
        source, samples, thin, cursor = work()  # a live view's second's worth: here, not through a thread
    else:
        source, samples, thin, cursor = await asyncio.get_running_loop().run_in_executor(None, work)
    if req.cursor is not None and source != "callback":  # a live view's look: the samples not kept yet, unwritten
        unkept = [s for s in pending(daemon.alerts.unkept(row.id)) if req.after is None or s.step > req.after]
        source, samples = ("log" if unkept else source), samples + unkept
    await conn.send(MetricsReply(source=source, samples=samples, thinned=thin, cursor=cursor))


def _metrics_asked(job_dir: Path, last: int, req: GetMetrics) -> tuple[str, list[MetricSample], bool, Optional[str]]:
    """The samples `req` asks for, thinned to its `buckets` where they are more than a chart draws (a sample
    a bucket's first, last, each metric's lowest and highest: up to four times as many as a one-metric chart's
    buckets), and whether they were: in a thread, as thinning 100,000 samples takes a tenth of a second."""
    source, samples, cursor = read_metrics(job_dir, last, req.after, req.upto, req.cursor)
    thin = req.buckets is not None and len(samples) > 4 * req.buckets
    return source, thinned(samples, req.buckets) if thin and req.buckets else samples, thin, cursor


@handles(GetLosses)
async def get_losses(daemon: Context, req: GetLosses, conn: Connection) -> None:
    """Each job's last losses (as `top` reads them: the end of its metrics file), a job not found skipped (one
    removed since its page was drawn); an ended job whose log the watch is still reading is named in `reading`."""
    loop = asyncio.get_running_loop()
    losses, reading = {}, []
    for ref in dict.fromkeys(req.jobs):
        row = daemon.store.find(ref)
        if row is None:
            continue
        if row.final and daemon.store.watch_state(row.id) is not None:
            reading.append(row.id)
        unkept = pending(daemon.alerts.unkept(row.id))
        found = await loop.run_in_executor(None, recent_losses, Path(row.job_dir), req.last, unkept)
        if found:
            losses[str(row.id)] = found
    await conn.send(LossesReply(losses=losses, reading=reading))


@handles(GetGpuUse)
async def get_gpu_use(daemon: Context, req: GetGpuUse, conn: Connection) -> None:
    row = find(daemon, req.job)
    work = functools.partial(read_gpu_use, Path(row.job_dir), req.since, req.buckets)
    samples, after, thin = await asyncio.get_running_loop().run_in_executor(None, work)
    await conn.send(GpuUseReply(samples=samples, next=after, thinned=thin))


@handles(ExplainMetrics)
async def explain_metrics(daemon: Context, req: ExplainMetrics, conn: Connection) -> None:
    row = find(daemon, req.job)
    patterns = daemon.alerts.settings(row.id).patterns
    work = functools.partial(explain, Path(row.job_dir) / jobdir.OUTPUT, patterns, req.lines)
    try:
        readings, truncated = await asyncio.get_running_loop().run_in_executor(None, work)
    except FileNotFoundError:
        readings, truncated = [], False
    except MetricPatternError as exc:  # a daemon config changed since submit: say so, as the watch logs it
        raise invalid(str(exc)) from None
    await conn.send(MetricsExplained(readings=readings, truncated=truncated))


async def _watch_caught_up(daemon: Context, job_id: int) -> None:
    """Wait (briefly) until the alert watch has read the rest of an ended job's log, which it marks by deleting
    the job's watch row: the metrics it reads from the output are whole only then, and `tfrun wait J && tfrun
    metrics J` must show the last lines' too. A watch that cannot finish (a daemon overloaded) costs at most
    METRICS_SETTLE_S; the reply is then what has been read."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + METRICS_SETTLE_S
    while daemon.store.watch_state(job_id) is not None and loop.time() < deadline:
        await asyncio.sleep(FOLLOW_POLL_S / 2)


@handles(ListGpus)
async def list_gpus(daemon: Context, req: ListGpus, conn: Connection) -> None:
    await conn.send(GpuList(await _gpus(daemon)))


@handles(Top)
async def top(daemon: Context, req: Top, conn: Connection) -> None:
    rows = daemon.store.list(include_final=False)
    ended = daemon.store.recent_final(req.recent)
    shown = sorted([*rows, *ended], key=lambda row: row.id)
    loop = asyncio.get_running_loop()
    losses = {}
    for row in shown:
        unkept = pending(daemon.alerts.unkept(row.id))
        found = await loop.run_in_executor(None, recent_losses, Path(row.job_dir), req.losses, unkept)
        if found:
            losses[str(row.id)] = found
    jobs = [public(daemon, row) for row in shown]
    gpus = await _gpus(daemon)
    await conn.send(TopReply(jobs, gpus, losses, daemon.alerts.host, daemon.scheduler.default_gpus()))


async def _gpus(daemon: Context) -> list[Gpu]:
    """The devices jobs are given, with NVML's figures where it has them and the job holding each, or who
    holds it outside this daemon (read, never claimed: that could keep another daemon's job from starting; in a
    thread, as the scheduler reads it: a lease folder someone filled with files takes time to read)."""
    loop = asyncio.get_running_loop()
    readings = await loop.run_in_executor(None, read_gpu_memory)
    held = daemon.scheduler.held()
    others = [d for d in daemon.scheduler.devices if d not in held]
    places = daemon.runs.executor.places_jobs()  # Slurm decides: no leases
    outside = {} if places else await loop.run_in_executor(None, held_outside, others, readings)
    gpus = []
    for device in daemon.scheduler.devices:
        reading = next((r for r in readings if r.is_device(device)), None)
        gpu = Gpu(device=device, job=held.get(device), held_by=outside.get(device))
        if reading is not None:
            gpu.name, gpu.memory_used, gpu.memory_total = reading.name, reading.used, reading.total
            gpu.utilization = reading.utilization
        gpus.append(gpu)
    return gpus
