"""How jobs look on a terminal (rich tables) and to scripts (JSON)."""

from __future__ import annotations

import dataclasses
import json
import re
import shlex
import time
from typing import TYPE_CHECKING, Any, Optional

from tfrun.protocol import Alert, Check, FileEntry, Gpu, Job, JobState, MetricSample

if TYPE_CHECKING:  # rich is imported where a table is drawn: `tfrun submit` and `--json` never pay for it
    from rich.console import Console
    from rich.text import Text

STATE_STYLE = {
    JobState.QUEUED: "yellow",
    JobState.RUNNING: "cyan",
    JobState.SUCCEEDED: "green",
    JobState.FAILED: "red",
    JobState.CANCELLED: "magenta",
    JobState.LOST: "red",
}


def to_json(value: Any) -> str:
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        value = dataclasses.asdict(value)
    elif isinstance(value, list):
        value = [dataclasses.asdict(v) if dataclasses.is_dataclass(v) and not isinstance(v, type) else v for v in value]
    return json.dumps(value, indent=2)


def duration(seconds: Optional[float]) -> str:
    """`1h02m`, `3m07s`, `12.3s`: short and sortable by eye."""
    if seconds is None:
        return "-"
    if seconds < 60:
        return f"{seconds:.1f}s"
    minutes, secs = divmod(int(seconds), 60)
    if minutes < 60:
        return f"{minutes}m{secs:02d}s"
    hours, minutes = divmod(minutes, 60)
    if hours < 48:
        return f"{hours}h{minutes:02d}m"
    return f"{hours // 24}d{hours % 24:02d}h"


def runtime(job: Job) -> Optional[float]:
    if job.started_at is None:
        return None
    return (job.finished_at or time.time()) - job.started_at


def when(timestamp: Optional[float]) -> str:
    return "-" if timestamp is None else time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(timestamp))


def command_line(job: Job) -> str:
    return shlex.join([job.script, *job.args])


def job_table(jobs: list[Job], console: Console) -> None:
    from rich.table import Table
    from rich.text import Text

    if not jobs:
        console.print("no jobs", style="dim")
        return
    table = Table(box=None, pad_edge=False, header_style="bold")
    for column in ("ID", "NAME", "STATE", "GPUS", "EXIT", "STARTED", "RUNTIME", "COMMAND"):
        table.add_column(column, no_wrap=column != "COMMAND", overflow="fold")
    for job in jobs:
        table.add_row(  # Text, not markup: a name like "[red]" is shown as typed
            str(job.id),
            Text(job.name or "-"),
            Text(job.state, style=STATE_STYLE.get(job.state, "")),
            ",".join(job.gpus) or ("-" if not job.gpus_requested else f"({job.gpus_requested})"),
            "-" if job.exit_code is None else str(job.exit_code),
            when(job.started_at),
            duration(runtime(job)),
            Text(command_line(job)),
        )
    console.print(table)


def job_detail(job: Job, console: Console) -> None:
    from rich.table import Table
    from rich.text import Text

    rows = [
        ("id", str(job.id)),
        ("name", job.name or "-"),
        ("state", job.state),
        ("exit code", "-" if job.exit_code is None else str(job.exit_code)),
        ("signal", "-" if job.signal is None else str(job.signal)),
        ("reason", job.reason or "-"),
        ("command", shlex.join(job.command)),
        ("pid", "-" if job.pid is None else str(job.pid)),
        ("created", when(job.created_at)),
        ("started", when(job.started_at)),
        ("finished", when(job.finished_at)),
        ("runtime", duration(runtime(job))),
        ("workdir", job.workdir),
        ("source", job.source or "-"),
        ("snapshot", f"{job.files} entries, {size(job.bytes)}"),
        ("git", "-" if job.git_commit is None else job.git_commit + (" (dirty)" if job.git_dirty else "")),
        ("log", job.log_path),
        ("checkpoints", job.checkpoint_dir),
        ("restart of", "-" if job.restart_of is None else f"job {job.restart_of}"),
        ("restarted as", "-" if job.restarted_as is None else f"job {job.restarted_as}"),
        ("restarts left", str(job.restarts_left)),
        (
            "gpus",
            ",".join(job.gpus)
            if job.gpus
            else f"{job.gpus_requested} asked, none given yet"
            if job.gpus_requested
            else "none",
        ),
        ("waiting", job.waiting or "-"),
        ("after", ", ".join(f"job {ref}" for ref in job.after) or "-"),
        ("priority", str(job.priority)),
        ("alerts", ", ".join(job.alert_rules) or "none"),
        ("notify", ", ".join(job.notify) or "the daemon's URLs only"),
    ]
    rows += [(f"env {k}", v) for k, v in sorted(job.env.items())]
    table = Table(box=None, show_header=False, pad_edge=False)
    table.add_column(style="bold", no_wrap=True)
    table.add_column(overflow="fold")
    for key, value in rows:
        table.add_row(key, Text(value))
    console.print(table)


@dataclasses.dataclass
class Checkpoint:
    """One saved state in a job's checkpoint folder: a TensorFlow checkpoint's files, or any other file."""

    name: str
    step: Optional[int]
    saved: Optional[float]
    size: int
    files: list[str]


_TF_CHECKPOINT = re.compile(r"^(?P<prefix>.*?)(\.index|\.data-\d+-of-\d+)$")
_STEP = re.compile(r"-(\d+)$")


def checkpoints(entries: list[FileEntry]) -> list[Checkpoint]:
    """The checkpoints among a listing of the checkpoint folder, oldest first.

    TensorFlow writes one checkpoint as `PREFIX.index` and `PREFIX.data-0000N-of-0000M`, numbered by
    step in PREFIX (`ckpt-1200`); its bookkeeping file `checkpoint` is not one. Other files are listed as
    they are (a `final.weights.h5`, say), with no step.
    """
    found: dict[str, Checkpoint] = {}
    for entry in entries:
        if entry.kind != "file" or entry.path.rsplit("/", 1)[-1] == "checkpoint":
            continue
        path = entry.path.split("/", 1)[1] if "/" in entry.path else entry.path  # below "checkpoints/"
        match = _TF_CHECKPOINT.match(path)
        name = match["prefix"] if match else path
        step = _STEP.search(name)
        point = found.setdefault(name, Checkpoint(name, int(step[1]) if step else None, None, 0, []))
        point.size += entry.size
        point.files.append(path)
        if entry.mtime is not None:
            point.saved = max(point.saved or 0.0, entry.mtime)
    return sorted(found.values(), key=lambda c: (c.saved or 0.0, c.step or 0, c.name))


def checkpoint_table(points: list[Checkpoint], console: Console) -> None:
    from rich.table import Table
    from rich.text import Text

    if not points:
        console.print("no checkpoints", style="dim")
        return
    table = Table(box=None, pad_edge=False, header_style="bold")
    for column in ("CHECKPOINT", "STEP", "SAVED", "SIZE"):
        table.add_column(column, no_wrap=True, justify="right" if column in ("STEP", "SIZE") else "left")
    for point in points:
        table.add_row(Text(point.name), "-" if point.step is None else str(point.step), when(point.saved),
                      size(point.size))  # fmt: skip
    console.print(table)


_CHECK_STYLE = {"ok": ("ok", "green"), "warn": ("warn", "yellow"), "fail": ("FAIL", "bold red")}


def check_lines(checks: list[Check], console: Console) -> None:
    """`tfrun doctor`'s report: one line per check, what to do after it when there is something."""
    from rich.text import Text

    for check in checks:
        label, style = _CHECK_STYLE.get(check.status, (check.status, ""))
        line = Text(f"{label:<4}  ", style=style) + Text(f"{check.name}: ", style="bold") + Text(check.detail)
        if check.advice:
            line += Text(f"; {check.advice}", style="dim" if check.status == "ok" else "")
        console.print(line, soft_wrap=True)  # one line per check, however narrow the terminal


def gpu_table(gpus: list[Gpu], console: Console) -> None:
    from rich.table import Table

    if not gpus:
        console.print("no GPUs on this box (or none NVML can see)", style="dim")
        return
    table = Table(box=None, pad_edge=False, header_style="bold")
    for column in ("GPU", "NAME", "MEMORY", "USE", "JOB"):
        table.add_column(column, no_wrap=True, justify="right" if column in ("MEMORY", "USE") else "left")
    for gpu in gpus:
        table.add_row(*gpu_cells(gpu))
    console.print(table)


def gpu_cells(gpu: Gpu) -> tuple[Text, Text, str, str, str]:
    """A GPU's row in `tfrun gpus` and `tfrun top`: device, name, memory, utilisation, job."""
    from rich.text import Text

    memory = "-"
    if gpu.memory_used is not None and gpu.memory_total:
        percent = 100 * gpu.memory_used / gpu.memory_total
        memory = f"{size(gpu.memory_used)} / {size(gpu.memory_total)} ({percent:.0f}%)"
    utilization = "-" if gpu.utilization is None else f"{gpu.utilization}%"
    return Text(gpu.device), Text(gpu.name or "-"), memory, utilization, "-" if gpu.job is None else str(gpu.job)


_DELIVERY_STYLE = {"sent": "green", "pending": "yellow", "expired": "red", "failed": "red"}


def alert_lines(alerts: list[Alert], verbose: bool, console: Console) -> None:
    """`tfrun alerts`: per alert its time, rule and summary, then how each delivery went."""
    from rich.text import Text

    if not alerts:
        console.print("no alerts", style="dim")
        return
    for alert in alerts:
        head = Text(f"{when(alert.at)}  ") + Text(f"{alert.rule:<10} ", style="bold") + Text(alert.summary)
        console.print(head, soft_wrap=True)
        if not alert.deliveries:
            console.print(Text("    not sent: no notify URL configured", style="dim"), soft_wrap=True)
        for delivery in alert.deliveries:
            line = Text("    ") + Text(f"{delivery.state:<8}", style=_DELIVERY_STYLE.get(delivery.state, ""))
            line += Text(f" {delivery.target}")
            if delivery.state == "sent":
                line += Text(f" at {when(delivery.sent_at)}", style="dim")
            else:
                line += Text(f" ({delivery.attempts} attempt(s)", style="dim")
                if delivery.next_at is not None:
                    line += Text(f", next at {when(delivery.next_at)}", style="dim")
                line += Text(")", style="dim")
                if delivery.error:
                    line += Text(f": {delivery.error}")
            console.print(line, soft_wrap=True)
        if verbose:
            console.print(
                Text("\n".join("    | " + line for line in alert.body.rstrip("\n").split("\n"))), soft_wrap=True
            )


def metric_table(source: str, samples: list[MetricSample], console: Console) -> None:
    """`tfrun metrics`: one row per step, a column per metric (loss first), and where they came from."""
    from rich.table import Table

    if not samples:
        console.print("no metrics yet: nothing the daemon can read as a metric was printed", style="dim")
        return
    names: dict[str, None] = {}
    for sample in samples:
        names.update(dict.fromkeys(sample.values))
    columns = sorted(names, key=lambda n: (n != "loss", n.startswith("val_"), n))
    table = Table(box=None, pad_edge=False, header_style="bold")
    for column in ("STEP", "EPOCH", *(c.upper() for c in columns)):
        table.add_column(column, no_wrap=True, justify="right")
    for sample in samples:
        values = [f"{sample.values[c]:.6g}" if c in sample.values else "" for c in columns]
        table.add_row(str(sample.step), "" if sample.epoch is None else str(sample.epoch), *values)
    console.print(table)
    where = {"callback": "written by tfrun.jobs (exact)", "log": "read from the output"}.get(source, source)
    console.print(f"{len(samples)} sample(s), {where}", style="dim")


def size(n: float) -> str:
    """Bytes the way `ls -h` shows them: 512 B, 3.4 kB, 1.2 GB."""
    for unit in ("B", "kB", "MB", "GB", "TB"):
        if n < 1000 or unit == "TB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1000
    raise AssertionError("unreachable")
