"""The alert watch over each job: its output and metrics go through the alert rules, and what fires is
written (runner/alerts/alertmessage.py) to the outbox (runner/alerts/outbox.py), which delivers it.

A job's *watch* (runner/alerts/jobwatch.py) is where the reading of its output stands.

Per job, every WATCH_INTERVAL_S: the log's new bytes are searched for fatal OOM messages (runner/records/oom.py) and
read for metrics (runner/metrics/; kept in the job's logmetrics.jsonl, runner/metrics/jobmetrics.py); the job's own
metrics.jsonl, when tfrun.jobs writes one, is read too and is the exact source the spike rule prefers
(runner/alerts/spikes.py); no growth of either for the stall time is a stall. When a job ends, the rest of its log
is read first, then `failed`, `done`, `lost` fire, and `oom` where the job's cause is oom (decided once, by the
lifecycle: runner/records/lifecycle.py) and its log's last words held no OOM message this watch alerted already
(a kill by the kernel's OOM killer or by Slurm: oom.kill_summary). A job's watch row is deleted only after its end
alerts are stored, so a daemon that dies at any point resumes the watch and loses no alert; the outbox's cooldown
keeps the rescanned end of a log from alerting twice.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import socket
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Optional

from tfrun.protocol.fields import JobState
from tfrun.shorten import shorten

from ..logs.loggrowth import LogGrowth, Subscription
from ..metrics import LogMetrics, PatternError, Sample
from ..metrics.jobmetrics import LossPoint, callback_losses, log_losses, printed_run
from ..records import oom
from ..records.job import JobRow
from ..records.store import Store
from ..shim import jobdir
from . import alertmessage
from .gpumemory import GpuMemory
from .jobwatch import LOOK_READ_BYTES, Settings, Watch, keep, read_log
from .outbox import Outbox
from .rules import AlertConfig
from .spikes import DEFAULT_FACTOR, SpikeDetector

log = logging.getLogger("tfrund")

WATCH_INTERVAL_S = 0.5
# Two turns of the watch that a log's growth woke, less than this apart, are followed by a pause this long: a busy
# box's lines are read in batches, about four times a second (an alert of a busy box waits up to this long; a
# `logs -f` follower never does). The second turn is free: a line often comes in two writes, its text and then
# its newline, and the turn woken by the first would otherwise leave an OOM line unread for the whole pause.
MIN_LOOK_INTERVAL_S = 0.25
SAVE_EVERY_S = 10.0  # a running job's watch saved this often (and after every alert): what a restart reads again;
# the saves that came due are made together every WATCH_INTERVAL_S, as one commit
KEEP_EVERY_S = 10.0  # the metrics read from a log are appended to its files this often (and at every save,
# and when `tfrun metrics` asks: `keep_now`), as one write: TensorBoard sees them that late (a live view: `unkept`)
KEEP_MAX_SAMPLES = 2000  # samples read and not kept yet that are kept at once, whatever KEEP_EVERY_S says (~15 ms)
GPU_INTERVAL_S = 2.0


class Alerts:
    def __init__(self, config: AlertConfig, store: Store, outbox: Outbox) -> None:
        self.config = config
        self.store = store
        self.outbox = outbox
        self._hostname = socket.gethostname()
        self._watches: dict[int, Watch] = {}
        self._settings: dict[int, Settings] = {}
        self._gpu_memory = GpuMemory()
        # Read every job's files each WATCH_INTERVAL_S, events or not: a Slurm job writes its log on another
        # machine, into a shared folder whose changes no inotify of this one sees.
        self.poll_logs = False
        self._behind: set[int] = set()  # jobs whose last look did not read all their log
        self._unsaved: set[int] = set()  # jobs looked at since their watch was last saved

    @property
    def host(self) -> str:
        """The box's name in every alert, test message and `tfrun top`: the config's `name` (read again on a
        reload), else the machine's hostname, which in a fleet of containers is often a meaningless id."""
        return self.config.name or self._hostname

    def reconfigure(self, config: AlertConfig) -> None:
        """Use a config read again: each job's settings are worked out afresh at its next look, so the
        daemon's notify URLs reach the alerts of jobs that were already running."""
        self.config = config
        self._settings.clear()

    # -- the loop -----------------------------------------------------------------------------------------

    async def run(self, log_growth: LogGrowth) -> None:
        """Forever: look at each job whose log or metrics grew (file events) or whose row was written, in turns
        paced by MIN_LOOK_INTERVAL_S when logs grow nonstop; every WATCH_INTERVAL_S check the stall deadlines
        (in memory) and read the jobs whose growth no event tells (no inotify, or `poll_logs`); now and then
        look at the GPUs.
        A job that prints nothing costs nothing here, and a printed line costs its own job's look alone (of
        its log alone, when only the log grew)."""
        grew = Subscription()
        followed: dict[int, contextlib.ExitStack] = {}  # a watched job -> the following of its files
        files: dict[str, tuple[int, bool]] = {}  # a followed file -> its job, and whether it is its metrics.jsonl
        rows: dict[int, JobRow] = {}
        read_as_of = -1  # the store's job_writes when the watched jobs were read
        polled_at = gpu_next = woken_at = 0.0
        self.store.on_job_write.append(grew.poke)  # a job that starts is followed at once, one that ends read
        try:
            while True:
                woken = [files[path] for path in grew.take() if path in files]
                due = {job_id for job_id, _ in woken} | self._behind
                whole = {job_id for job_id, metrics in woken if metrics} | self._behind  # metrics.jsonl read too
                self._behind = set()
                if self.store.job_writes != read_as_of:
                    read_as_of = self.store.job_writes
                    fresh = self._watched()
                    moved = {job_id for job_id, row in fresh.items() if _moved(rows.get(job_id), row)}
                    due, whole = due | moved, whole | moved
                    for job_id in set(followed) - set(fresh):
                        followed.pop(job_id).close()
                    for job_id in set(fresh) - set(followed):
                        followed[job_id] = contextlib.ExitStack()
                        followed[job_id].enter_context(self._follow(log_growth, fresh[job_id], grew, files))
                    rows = fresh
                if time.monotonic() - polled_at >= WATCH_INTERVAL_S:
                    polled_at = time.monotonic()
                    polled = {
                        job_id for job_id, row in rows.items() if self.poll_logs or not log_growth.watches(row.job_dir)
                    }
                    due, whole = due | polled, whole | polled
                    self._check_stalls(rows)
                    self._keep_metrics()
                    self._save_due(rows)
                began = time.perf_counter()
                for job_id in sorted(due & set(rows)):
                    try:
                        if self._look(rows[job_id], job_id in whole):  # its end alerts are stored: not watched
                            followed.pop(job_id).close()
                            del rows[job_id]
                    except Exception:  # one odd job must not stop the watch over the others
                        log.exception("job %d: alert watch failed", job_id)
                looked = time.perf_counter() - began  # the looks' own time, not the GPU look's wait below
                if time.monotonic() >= gpu_next and "gpu-memory" in self.config.rules:
                    gpu_next = time.monotonic() + GPU_INTERVAL_S
                    await self._gpu_memory.look(self.config, self.host, self.store, self.outbox)
                if self._behind:  # a look ran out of its budget (jobwatch.LOOK_BUDGET_S): the rest of the loop's for
                    await asyncio.sleep(looked)  # as long, so a backlog costs half a core at most
                    continue
                if woken:  # a log written nonstop wakes us about this often; after a quiet while, twice at once
                    busy, woken_at = time.monotonic() - woken_at < MIN_LOOK_INTERVAL_S, time.monotonic()
                    if busy:
                        await asyncio.sleep(MIN_LOOK_INTERVAL_S)
                await grew.wait(WATCH_INTERVAL_S)
        finally:
            self.store.on_job_write.remove(grew.poke)
            for following in followed.values():
                following.close()

    def _watched(self) -> dict[int, JobRow]:
        """Running jobs, and ended jobs whose end alerts are not stored yet (a queued job has no output)."""
        rows = {row.id: row for row in self.store.list(include_final=False) if row.state != JobState.QUEUED}
        for job_id in self.store.watched_jobs() - set(rows):
            row = self.store.get(job_id)
            if row is not None and row.state != JobState.QUEUED:
                rows[job_id] = row
        return rows

    @contextlib.contextmanager
    def _follow(
        self, log_growth: LogGrowth, row: JobRow, grew: Subscription, files: dict[str, tuple[int, bool]]
    ) -> Iterator[None]:
        """Follow the growth of the job's log and metrics.jsonl into `grew` for as long as the block runs."""
        paths = [Path(row.job_dir) / jobdir.OUTPUT, Path(row.job_dir) / jobdir.METRICS]
        with contextlib.ExitStack() as stack:
            for path in paths:
                stack.enter_context(log_growth.follow(path, grew))
                files[os.fspath(path)] = (row.id, path.name == jobdir.METRICS)
            try:
                yield
            finally:
                for path in paths:
                    files.pop(os.fspath(path), None)

    def _look(self, row: JobRow, whole: bool) -> bool:
        """Read what the job's log and metrics gained (its log alone unless `whole`: a file event said only the
        log grew); for an ended job once all is read, its end alerts. True once those are stored and the job
        is watched no more."""
        job_id = row.id
        settings = self._settings.get(job_id) or self._settings.setdefault(job_id, self.settings(job_id))
        watch = self._watches.get(job_id) or self._load(row, settings)
        caught_up = self._read_log(row, watch, settings)
        if whole or row.final:  # a final job's end alerts come once all of both files is read
            caught_up = self._read_callback_metrics(row, watch, settings) and caught_up
        if not caught_up:  # more than a look reads: the next look goes on
            self._behind.add(job_id)
        if not row.final:
            self._unsaved.add(job_id)  # saved with the others due, in one commit (_save_due)
            return False
        if not caught_up:
            return False
        keep(watch)
        self._ended(row, watch, settings)
        self._watches.pop(job_id, None)
        self._settings.pop(job_id, None)
        self.store.finish_watch(job_id)
        return True

    def unkept(self, job_id: int) -> list[Sample]:
        """The samples read from the log, not yet in its files (KEEP_EVERY_S): a live view's, without a write."""
        return list(self._watches[job_id].unkept) if job_id in self._watches else []

    def keep_now(self, job_id: int) -> None:
        """Append the samples read from the log that wait for KEEP_EVERY_S: `tfrun metrics` sees every line read."""
        watch = self._watches.get(job_id)
        if watch is not None and watch.unkept:
            keep(watch)

    def _keep_metrics(self) -> None:
        """Append the samples read more than KEEP_EVERY_S ago, of jobs that printed nothing since."""
        now = time.monotonic()
        for watch in self._watches.values():
            if watch.unkept and now - watch.kept_at >= KEEP_EVERY_S:
                try:
                    keep(watch)
                except OSError as exc:
                    log.warning("job %d: metrics not kept: %s", watch.job_id, exc)

    def _check_stalls(self, rows: dict[int, JobRow]) -> None:
        """The stall rule of every running job looked at so far: a comparison each, files read only once a
        job's deadline has passed by what was seen of it."""
        for job_id, row in rows.items():
            watch = self._watches.get(job_id)
            if watch is not None and not row.final:
                try:
                    settings = self._settings.get(job_id) or self._settings.setdefault(job_id, self.settings(job_id))
                    self._check_stall(row, watch, settings)
                except Exception:
                    log.exception("job %d: stall check failed", job_id)

    def _load(self, row: JobRow, settings: Settings) -> Watch:
        state = self.store.watch_state(row.id)
        watch = None
        if state and "offset" in state:  # a watch begun by an earlier daemon ({} for one never begun)
            try:
                watch = Watch.restore(row.id, state, settings.patterns)
            except (KeyError, TypeError, ValueError) as exc:
                log.warning("job %d: alert watch state unusable (%s); reading its log again", row.id, exc)
        if watch is None:
            factor = settings.rules.get("spike") or DEFAULT_FACTOR
            try:
                metrics = LogMetrics(settings.patterns)
            except PatternError as exc:  # checked at submit; a daemon config changed since may still be bad
                log.warning("job %d: metric patterns unusable (%s); reading Keras and plain prints only", row.id, exc)
                metrics = LogMetrics()
            watch = Watch(row.id, metrics=metrics, spikes=SpikeDetector(factor), callback_spikes=SpikeDetector(factor))
        watch.job_dir = Path(row.job_dir)
        watch.output_path = os.path.join(row.job_dir, jobdir.OUTPUT)
        watch.metrics_path = os.path.join(row.job_dir, jobdir.METRICS)
        watch.printed = printed_run(watch.job_dir)
        self._watches[row.id] = watch
        return watch

    def _save(self, *watches: Watch) -> None:
        """Save where the watches stand, their samples kept first (a restart reads on from the offset saved, so
        no sample before it may be still unwritten), in one commit."""
        for watch in watches:
            keep(watch)
        self.store.save_watch_states({watch.job_id: watch.state() for watch in watches})
        for watch in watches:  # only once stored: a save that failed is due again at the next pass
            watch.saved_at = time.monotonic()

    def _save_due(self, rows: dict[int, JobRow]) -> None:
        """Save the watches of running jobs looked at since their last save, SAVE_EVERY_S ago or more (a quiet
        job's watch has nothing new to save; an ended job's watch row is deleted once its end alerts are stored)."""
        self._unsaved &= self._watches.keys()  # a watch dropped (its job's end alerts stored) has nothing to save
        now = time.monotonic()
        due = [
            self._watches[job_id]
            for job_id in self._unsaved
            if job_id in rows and not rows[job_id].final and now - self._watches[job_id].saved_at >= SAVE_EVERY_S
        ]
        if not due:
            return
        try:
            self._save(*due)
        except Exception:  # kept in _unsaved: the next pass tries again, and the watch goes on meanwhile
            log.exception("alert watch: %d watches not saved", len(due))
            return
        self._unsaved -= {watch.job_id for watch in due}

    def settings(self, job_id: int) -> Settings:
        stored = self.store.job_alerts(job_id)
        if stored is None:  # submitted before this daemon had alerts: the daemon's rules
            return Settings(self.config.rules, list(self.config.notify), [])
        rules, urls, patterns = stored
        return Settings(rules, [*self.config.notify, *urls], [*self.config.metric_patterns, *patterns])

    # -- the log ------------------------------------------------------------------------------------------

    def _read_log(self, row: JobRow, watch: Watch, settings: Settings) -> bool:
        """Read what the log gained, for a look's budget (jobwatch.read_log); True once all of it is read."""
        return read_log(watch, lambda piece: self._read_piece(row, watch, settings, piece))

    def _read_piece(self, row: JobRow, watch: Watch, settings: Settings, data: bytes) -> None:
        """The next bytes of the log through the metric reader, the spike rule and the OOM search."""
        samples = watch.metrics.feed(data)  # before the OOM search: an OOM alert quotes the losses before it
        if samples:
            watch.unkept.extend(samples)
            if len(watch.unkept) >= KEEP_MAX_SAMPLES or time.monotonic() - watch.kept_at >= KEEP_EVERY_S:
                keep(watch)
            if not watch.from_callback:
                for point in log_losses(samples, watch.log_loss):
                    self._loss(row, watch, settings, watch.spikes, point)
        if "oom" in settings.rules:
            watch.pending, found = oom.first_oom(watch.pending, data)
            if found is not None:  # one incident: the rest of its traceback says the same
                kind, shown = found
                watch.oom_at = watch.offset  # its end's oom alert, if its last words (oom.in_last_words)
                summary = f"out of memory ({kind}): {shorten(oom.message(shown), 160)}"
                self._fire(row, watch, settings, "oom", summary)
        else:
            watch.pending = b""

    def _read_callback_metrics(self, row: JobRow, watch: Watch, settings: Settings) -> bool:
        """Follow the losses tfrun.jobs appended to metrics.jsonl, LOOK_READ_BYTES a look; True once all is read."""
        found = callback_losses(watch.metrics_path, watch.metrics_offset, LOOK_READ_BYTES)
        if found is None:
            return True
        read, points, caught_up = found
        watch.metrics_offset += read
        watch.from_callback = True
        watch.stalled, watch.active_at = False, time.time()
        for point in points:
            self._loss(row, watch, settings, watch.callback_spikes, point)
        return caught_up

    # -- the rules ----------------------------------------------------------------------------------------

    def _loss(self, row: JobRow, watch: Watch, settings: Settings, detector: SpikeDetector, point: LossPoint) -> None:
        """Follow one training loss; a spike fires an alert that says where the log printed it."""
        if point.loss is None:
            return
        watch.losses.append((point.step, point.loss))
        if "spike" not in settings.rules:
            return
        spike = detector.add(point.step, point.loss)
        if spike is not None:
            self._fire(row, watch, settings, "spike", alertmessage.spike_summary(spike, point.position, point.name))

    def _check_stall(self, row: JobRow, watch: Watch, settings: Settings) -> None:
        limit = settings.rules.get("stall")
        if "stall" not in settings.rules or limit is None or watch.stalled or row.state != JobState.RUNNING:
            return
        if time.time() - watch.active_at < limit:
            return
        last = max(
            [row.started_at or 0.0, *(_mtime(Path(row.job_dir) / name) for name in (jobdir.OUTPUT, jobdir.METRICS))]
        )
        watch.active_at = last
        quiet = time.time() - last
        if quiet >= limit:
            watch.stalled = True
            self._fire(row, watch, settings, "stall", f"no output for {alertmessage.minutes(quiet)} while it runs")

    def _ended(self, row: JobRow, watch: Watch, settings: Settings) -> None:
        """The end alerts of a final job, once its whole log is read."""
        rules = settings.rules
        told = oom.in_last_words(watch.oom_at, watch.offset)  # the cause's own message, alerted as it was read
        kill = oom.kill_summary(row) if row.cause == "oom" and "oom" in rules and not told else None
        if kill is not None:
            self._fire(row, watch, settings, "oom", kill)
        if row.state == JobState.FAILED and "failed" in rules:
            self._fire(row, watch, settings, "failed", alertmessage.failure(row))
        elif row.state == JobState.SUCCEEDED and "done" in rules:
            self._fire(
                row, watch, settings, "done", f"succeeded after {alertmessage.minutes(alertmessage.runtime(row))}"
            )
        elif row.state == JobState.LOST and "lost" in rules:
            self._fire(row, watch, settings, "lost", f"lost: {row.reason}")

    def _fire(self, row: JobRow, watch: Watch, settings: Settings, rule: str, what: str) -> None:
        """Store the alert (the outbox sends it), then save the watch, so a restart never loses it."""
        summary = f"job {alertmessage.label(row)} on {self.host}: {what}"
        self.outbox.record(
            row.id, rule, summary, alertmessage.body(self.host, row, summary, watch.losses, watch.offset), settings.urls
        )
        self._save(watch)


def _mtime(path: Path) -> float:
    try:
        return os.stat(path).st_mtime
    except OSError:
        return 0.0


def _moved(before: Optional[JobRow], after: JobRow) -> bool:
    """Whether a job is new to the watch or changed state since it was last read (its end: the rest of its
    log, then its end alerts)."""
    return before is None or before.state != after.state
