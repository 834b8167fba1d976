"""The watch over running jobs: their output and metrics go through the alert rules, and what fires is
written to the outbox (runner/outbox.py), which delivers it.

Per job, every WATCH_INTERVAL_S: the log's new bytes are searched for fatal OOM messages (runner/oom.py) and
read for metrics (runner/metrics.py; kept in the job's logmetrics.jsonl); the job's own metrics.jsonl, when
tfrun.jobs writes one, is read too and is the exact source the spike rule prefers (runner/spikes.py); no
growth of either for the stall time is a stall. When a job ends, the rest of its log is read first, then
`failed`, `done`, `lost` fire, and a SIGKILL with a risen OOM-kill count of its cgroup (runner/cgroup.py)
is an `oom`. Where the watch stands is saved in the database (`watches`, a row per job being watched), and
a job's row is deleted only after its end alerts are stored, so a daemon that dies at any point resumes the
watch and loses no alert; the outbox's cooldown keeps the rescanned end of a log from alerting twice.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import logging
import math
import os
import re
import socket
import time
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional

from tfrun.constants import EXIT_LOST
from tfrun.losses import TrainingLoss
from tfrun.protocol import JobState, MetricSample
from tfrun.runner import cgroup, jobdir, oom
from tfrun.runner.alerttext import INDENT
from tfrun.runner.config import Config
from tfrun.runner.gpus import GpuReading, read_gpu_memory
from tfrun.runner.lines import TerminalLines, display, plain
from tfrun.runner.metrics import LogMetrics, PatternError, Sample, plausible, training_loss
from tfrun.runner.outbox import Outbox
from tfrun.runner.spikes import DEFAULT_FACTOR, DEFAULT_PATIENCE, Spike, SpikeDetector
from tfrun.runner.store import JobRow, Store
from tfrun.runner.watch import LogWatch, Subscription

log = logging.getLogger("tfrund")

WATCH_INTERVAL_S = 0.5
MIN_LOOK_INTERVAL_S = 0.02
READ_LIMIT_BYTES = 8 << 20  # per job and look: a job that writes faster is caught up over several looks
SAVE_EVERY_S = 2.0
MAX_LINE_BYTES = 64 << 10  # an unfinished line kept for the OOM search; longer ones are searched by their start
CONTEXT_LINES = 15
CONTEXT_BYTES = 32 << 10
GPU_INTERVAL_S = 2.0
TAIL_BYTES = 64 << 10  # the end of a metrics file that `tfrun top` reads
_SEGMENTS = re.compile(rb"[\r\n]")


@dataclass
class Watch:
    """Where the watch over one job stands; `state()` is what the database keeps of it."""

    job_id: int
    offset: int = 0  # bytes of the log read
    pending: bytes = b""  # the log's unfinished last line, for the OOM search
    metrics_offset: int = 0  # bytes of metrics.jsonl read
    from_callback: bool = False  # the job writes metrics.jsonl: its losses are the exact ones
    stalled: bool = False
    metrics: LogMetrics = field(default_factory=LogMetrics)
    spikes: SpikeDetector = field(default_factory=SpikeDetector)
    callback_spikes: SpikeDetector = field(default_factory=SpikeDetector)
    log_loss: TrainingLoss = field(default_factory=TrainingLoss)  # the loss the log's samples are followed by
    losses: deque[tuple[int, float]] = field(default_factory=lambda: deque(maxlen=10))
    saved_at: float = 0.0

    def state(self) -> dict[str, Any]:
        return {
            "offset": self.offset,
            "pending": base64.b64encode(self.pending).decode(),
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


class Alerts:
    def __init__(self, config: Config, store: Store, outbox: Outbox) -> None:
        self.config = config
        self.store = store
        self.outbox = outbox
        self.host = socket.gethostname()
        self._watches: dict[int, Watch] = {}
        self._settings: dict[int, Settings] = {}
        self._gpu_high_since: dict[int, float] = {}

    def reconfigure(self, config: Config) -> None:
        """Use a config read again: each job's settings are worked out afresh at its next look, so the
        daemon's notify URLs reach the alerts of jobs that were already running."""
        self.config = config
        self._settings.clear()

    # -- the loop -----------------------------------------------------------------------------------------

    async def run(self, log_watch: LogWatch) -> None:
        """Forever: look at every job being watched, as soon as a log grows (file events), at least every
        WATCH_INTERVAL_S (for stalls, and where events are missing); now and then at the GPUs."""
        grew = Subscription()
        with contextlib.ExitStack() as following:
            followed: dict[int, contextlib.ExitStack] = {}
            gpu_next = 0.0
            while True:
                watched = self._watched()
                for job_id in watched:
                    if job_id not in followed:
                        followed[job_id] = following.enter_context(contextlib.ExitStack())
                        row = self.store.get(job_id)
                        if row is not None:
                            followed[job_id].enter_context(log_watch.follow(Path(row.job_dir) / jobdir.OUTPUT, grew))
                    try:
                        self._look(job_id)
                    except Exception:  # one odd job must not stop the watch over the others
                        log.exception("job %d: alert watch failed", job_id)
                for job_id in set(followed) - set(watched):
                    followed.pop(job_id).close()
                if time.monotonic() >= gpu_next and "gpu-memory" in self.config.rules:
                    gpu_next = time.monotonic() + GPU_INTERVAL_S
                    await self._look_at_gpus()
                await asyncio.sleep(MIN_LOOK_INTERVAL_S)  # a log written nonstop wakes us at most this often
                await grew.wait(WATCH_INTERVAL_S)

    def _watched(self) -> list[int]:
        """Unfinished jobs, and ended jobs whose end alerts are not stored yet."""
        running = {row.id for row in self.store.list(include_final=False)}
        unfinished = {job_id for (job_id,) in self.store.db.execute("SELECT job_id FROM watches")}
        return sorted(running | unfinished)

    def _look(self, job_id: int) -> None:
        row = self.store.get(job_id)
        if row is None or row.state == JobState.QUEUED:
            return
        settings = self._settings.get(job_id) or self._settings.setdefault(job_id, self.settings(job_id))
        watch = self._watches.get(job_id) or self._load(row, settings)
        caught_up = self._read_log(row, watch, settings)
        self._read_callback_metrics(row, watch, settings)
        if not row.final:
            self._check_stall(row, watch, settings)
            if time.monotonic() - watch.saved_at >= SAVE_EVERY_S:
                self._save(watch)
            return
        if caught_up:
            self._ended(row, watch, settings)
            self._watches.pop(job_id, None)
            self._settings.pop(job_id, None)
            self.store.finish_watch(job_id)

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
        self._watches[row.id] = watch
        return watch

    def _save(self, watch: Watch) -> None:
        self.store.save_watch_state(watch.job_id, watch.state())
        watch.saved_at = time.monotonic()

    def settings(self, job_id: int) -> Settings:
        stored = self.store.job_alerts(job_id)
        if stored is None:  # submitted before this daemon had alerts: the daemon's rules
            return Settings(self.config.rules, list(self.config.notify), [])
        rules, urls, patterns = stored
        return Settings(rules, [*self.config.notify, *urls], [*self.config.metric_patterns, *patterns])

    # -- the log ------------------------------------------------------------------------------------------

    def _read_log(self, row: JobRow, watch: Watch, settings: Settings) -> bool:
        """Read what the log gained; True once all of it is read."""
        path = Path(row.job_dir) / jobdir.OUTPUT
        try:
            size = path.stat().st_size
        except FileNotFoundError:
            return True
        if size <= watch.offset:
            return True
        with open(path, "rb") as f:
            f.seek(watch.offset)
            data = f.read(min(size - watch.offset, READ_LIMIT_BYTES))
        watch.offset += len(data)
        watch.stalled = False
        samples = watch.metrics.feed(data)  # before the OOM search: an OOM alert quotes the losses before it
        if samples:
            self._keep_log_metrics(row, samples)
            if not watch.from_callback:
                for sample in samples:
                    loss = watch.log_loss.of(sample.values)
                    where = _position(sample)
                    self._loss(row, watch, settings, watch.spikes, sample.step, loss, where, watch.log_loss.cause)
        if "oom" in settings.rules:
            self._search_oom(row, watch, settings, data)
        else:
            watch.pending = b""
        return watch.offset >= size

    def _search_oom(self, row: JobRow, watch: Watch, settings: Settings, data: bytes) -> None:
        text = watch.pending + data
        last_newline = text.rfind(b"\n")
        complete, watch.pending = text[: last_newline + 1], text[last_newline + 1 :][:MAX_LINE_BYTES]
        if not complete or not oom.may_hold_oom(complete):
            return
        for line in _SEGMENTS.split(complete):
            if not oom.may_hold_oom(line):
                continue
            shown = plain(display(line)).strip()
            kind = oom.oom_kind(shown)
            if kind is not None:
                self._fire(row, watch, settings, "oom", f"out of memory ({kind}): {_cut(oom.message(shown), 160)}")
                return  # one incident: the rest of the traceback says the same

    def _keep_log_metrics(self, row: JobRow, samples: list[Any]) -> None:
        """Append to the job's logmetrics.jsonl, the view `tfrun metrics` shows when the job writes none."""
        now = round(time.time(), 3)
        lines = []
        for sample in samples:
            record: dict[str, Any] = {"step": sample.step}
            if sample.epoch is not None:
                record["epoch"] = sample.epoch
            record["time"] = now
            record.update(sample.values)
            lines.append(json.dumps(record, separators=(",", ":")) + "\n")
        with open(Path(row.job_dir) / jobdir.LOG_METRICS, "a") as f:
            f.write("".join(lines))

    def _read_callback_metrics(self, row: JobRow, watch: Watch, settings: Settings) -> None:
        """Read the lines tfrun.jobs appended to metrics.jsonl (a last line without its newline waits)."""
        path = Path(row.job_dir) / jobdir.METRICS
        try:
            size = path.stat().st_size
        except FileNotFoundError:
            return
        if size <= watch.metrics_offset:
            return
        with open(path, "rb") as f:
            f.seek(watch.metrics_offset)
            data = f.read(min(size - watch.metrics_offset, READ_LIMIT_BYTES))
        data = data[: data.rfind(b"\n") + 1]
        watch.metrics_offset += len(data)
        watch.from_callback = True
        watch.stalled = False
        for line in data.splitlines():
            try:
                record = json.loads(line)
            except ValueError:
                continue
            if isinstance(record, dict) and plausible(record.get("step")):
                self._loss(row, watch, settings, watch.callback_spikes, record["step"], _loss_of(record))

    # -- the rules ----------------------------------------------------------------------------------------

    def _loss(
        self,
        row: JobRow,
        watch: Watch,
        settings: Settings,
        detector: SpikeDetector,
        step: int,
        loss: Optional[float],
        position: str = "",
        name: Optional[str] = None,
    ) -> None:
        """Follow one training loss; `position` says where the log printed it, for the alert (see _position),
        and `name` what the value is, where not the loss (a NaN gradient norm: TrainingLoss.of)."""
        if loss is None:
            return
        watch.losses.append((step, loss))
        if "spike" not in settings.rules:
            return
        spike = detector.add(step, loss)
        if spike is not None:
            self._fire(row, watch, settings, "spike", _spike_summary(spike, position, name))

    def _check_stall(self, row: JobRow, watch: Watch, settings: Settings) -> None:
        limit = settings.rules.get("stall")
        if "stall" not in settings.rules or limit is None or watch.stalled or row.state != JobState.RUNNING:
            return
        last = max(
            [row.started_at or 0.0, *(_mtime(Path(row.job_dir) / name) for name in (jobdir.OUTPUT, jobdir.METRICS))]
        )
        quiet = time.time() - last
        if quiet >= limit:
            watch.stalled = True
            self._fire(row, watch, settings, "stall", f"no output for {_minutes(quiet)} while it runs")

    def _ended(self, row: JobRow, watch: Watch, settings: Settings) -> None:
        """The end alerts of a final job, once its whole log is read."""
        rules = settings.rules
        if row.state == JobState.FAILED and row.signal == 9 and "oom" in rules and _oom_killed(row):
            self._fire(row, watch, settings, "oom", "killed by the kernel's OOM killer (SIGKILL)")
        if row.state == JobState.FAILED and "failed" in rules:
            self._fire(row, watch, settings, "failed", _failure(row))
        elif row.state == JobState.SUCCEEDED and "done" in rules:
            self._fire(row, watch, settings, "done", f"succeeded after {_minutes(_runtime(row))}")
        elif row.state == JobState.LOST and "lost" in rules:
            self._fire(row, watch, settings, "lost", f"lost: {row.reason}")

    def _fire(self, row: JobRow, watch: Watch, settings: Settings, rule: str, what: str) -> None:
        """Store the alert (the outbox sends it), then save the watch, so a restart never loses it."""
        summary = f"job {_label(row)} on {self.host}: {what}"
        self.outbox.record(row.id, rule, summary, self._body(row, summary, watch), settings.urls)
        self._save(watch)

    # -- the message --------------------------------------------------------------------------------------

    def _body(self, row: JobRow, summary: str, watch: Watch) -> str:
        """The alert's text, laid out as runner/alerttext.py reads it back: mail shows it as HTML, Slack as
        mrkdwn, and both keep its lines."""
        command = " ".join([row.spec["script"], *row.spec["args"]])
        lines = [
            summary,
            "",
            f"Host:        {self.host}",
            f"Job:         {_label(row)}: {command} ({row.state})",
            f"Checkpoints: {row.checkpoint_dir}",
            f"Log:         {Path(row.job_dir) / jobdir.OUTPUT}  (tfrun logs {row.id})",
        ]
        if row.restarted_as:
            lines.append(f"Restarted:   as job {row.restarted_as}")
        if watch.losses:
            losses = ", ".join(f"{step}: {loss:.4g}" for step, loss in watch.losses)
            lines += ["", "Last losses (step: loss):", f"{INDENT}{losses}"]
        tail = _last_lines(Path(row.job_dir) / jobdir.OUTPUT, watch.offset)
        if tail:
            lines += ["", "Last lines of output:", *(f"{INDENT}{line}" for line in tail)]
        return "\n".join(lines) + "\n"

    # -- the box ------------------------------------------------------------------------------------------

    async def _look_at_gpus(self) -> None:
        """gpu-memory: a GPU above the threshold for the config's gpu_memory_for is one alert (the box's, not a
        job's; the cooldown makes a GPU that stays full one message)."""
        threshold = self.config.rules.get("gpu-memory") or 90.0
        gpus: list[GpuReading] = await asyncio.get_running_loop().run_in_executor(None, read_gpu_memory)
        now = time.time()
        for gpu in gpus:
            percent = 100.0 * gpu.used / gpu.total if gpu.total else 0.0
            if percent < threshold:
                self._gpu_high_since.pop(gpu.index, None)
                continue
            since = self._gpu_high_since.setdefault(gpu.index, now)
            if now - since >= self.config.gpu_memory_for:
                summary = (
                    f"{self.host}: GPU {gpu.index} ({gpu.name}) memory at {percent:.0f}% "
                    f"({gpu.used / 2**30:.1f} of {gpu.total / 2**30:.1f} GiB) for {_minutes(now - since)}"
                )
                running = [_label(row) for row in self.store.list(include_final=False)]
                body = f"{summary}\n\nRunning jobs: {', '.join(running) or 'none'}\n"
                self.outbox.record(None, "gpu-memory", summary, body, list(self.config.notify))

    # -- reading metrics back -----------------------------------------------------------------------------


def read_metrics(job_dir: Path, last: Optional[int]) -> tuple[str, list[MetricSample]]:
    """A job's metrics for `tfrun metrics`: its own metrics.jsonl when it wrote one, else what was read from
    its log; the last `last` samples."""
    for source, name in (("callback", jobdir.METRICS), ("log", jobdir.LOG_METRICS)):
        path = job_dir / name
        if path.exists() and path.stat().st_size:
            samples = []
            with open(path, "rb") as f:
                for line in f:
                    sample = _sample(line)
                    if sample is not None:
                        samples.append(sample)
            return source, samples[-last:] if last else samples
    return "none", []


def recent_losses(job_dir: Path, n: int) -> list[float]:
    """The job's last `n` training losses, from the end of its metrics file (the view `tfrun top` draws)."""
    for name in (jobdir.METRICS, jobdir.LOG_METRICS):
        try:
            with open(job_dir / name, "rb") as f:
                size = f.seek(0, os.SEEK_END)
                f.seek(max(0, size - TAIL_BYTES))
                lines = f.read().splitlines()[1 if size > TAIL_BYTES else 0 :]
        except OSError:
            continue
        losses = []
        follow = TrainingLoss()  # one loss from line to line: a GAN's two are not one curve (tfrun/losses.py)
        for line in lines:
            sample = _sample(line)
            loss = follow.of(sample.values) if sample is not None else None
            if loss is not None:
                losses.append(loss)
        if losses:
            return losses[-n:]
    return []


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


def _spike_summary(spike: Spike, position: str = "", name: Optional[str] = None) -> str:
    if spike.kind in ("nan", "inf"):
        what = name if name and "grad_norm" in name else "loss"
        return f"{what} is {spike.value} at step {spike.step}{position}"
    ratio = spike.value / spike.baseline
    return (
        f"loss spike at step {spike.step}{position}: {spike.value:.4g}, {ratio:.1f}x the 90th percentile of the last "
        f"losses ({spike.baseline:.4g}), for {DEFAULT_PATIENCE} losses in a row"
    )


def _failure(row: JobRow) -> str:
    if row.exit_code == EXIT_LOST or row.exit_code is None:
        how = row.reason or "failed"
    elif row.signal:
        how = f"killed by signal {row.signal} (exit code {row.exit_code})"
    else:
        how = f"exited with code {row.exit_code}"
    if row.reason and row.reason not in how:
        how += f": {row.reason}"
    after = f" after {_minutes(_runtime(row))}" if row.started_at else ""
    again = f"; running it again as job {row.restarted_as}" if row.restarted_as else ""
    return f"failed{after}: {how}{again}"


def _oom_killed(row: JobRow) -> bool:
    """Whether the kernel's OOM killer struck the job's cgroup while it ran (its count rose since the start)."""
    try:
        shim = jobdir.read_json(Path(row.job_dir) / jobdir.SHIM) or {}
    except ValueError:
        return False
    before, counter_file = shim.get("oom_kills"), shim.get("oom_file")
    now = cgroup.oom_kills(counter_file) if isinstance(counter_file, str) else None
    return isinstance(before, int) and now is not None and now > before


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
    return [_cut(plain(display(line)), 300) for line in finished[-CONTEXT_LINES:]]


def _label(row: JobRow) -> str:
    return f"{row.id} ({row.name})" if row.name else str(row.id)


def _cut(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _mtime(path: Path) -> float:
    try:
        return os.stat(path).st_mtime
    except OSError:
        return 0.0


def _runtime(row: JobRow) -> float:
    return max(0.0, (row.finished_at or time.time()) - (row.started_at or row.created_at))


def _minutes(seconds: float) -> str:
    if seconds < 120:
        return f"{seconds:.0f} s"
    if seconds < 7200:
        return f"{seconds / 60:.0f} min"
    return f"{seconds / 3600:.1f} h"
