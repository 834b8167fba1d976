"""How jobs look on a terminal (rich), in a pipe (plain whole rows) and to scripts (JSON)."""

from __future__ import annotations

import dataclasses
import json
import os
import re
import shlex
import sys
import time
from collections.abc import Collection, Mapping, Sequence
from typing import TYPE_CHECKING, Any, Literal, Optional, Union

from tfrun.protocol.fields import JobState

if TYPE_CHECKING:  # rich is imported where a table is drawn: `tfrun submit` and `--json` never pay for it
    from rich.console import Console
    from rich.text import Text

    # the records are only drawn here: a verb imports the protocol modules it asks with, and no others
    from tfrun.protocol.admin import Check
    from tfrun.protocol.files import FileEntry
    from tfrun.protocol.jobs import Job
    from tfrun.protocol.watching import Alert, Gpu, LineReading, MetricSample

STATE_STYLE: dict[str, str] = {
    JobState.QUEUED: "yellow",
    JobState.RUNNING: "cyan",
    JobState.SUCCEEDED: "green",
    JobState.FAILED: "red",
    JobState.CANCELLED: "magenta",
    JobState.LOST: "red",
}


def wants_color(choice: str, terminal: bool, environ: Mapping[str, str]) -> bool:
    """Whether to write colour: --color always or never decides; with auto, NO_COLOR (set, not empty) says no
    (no-color.org), then FORCE_COLOR (set, not empty, not 0) says yes (force-color.org); else a terminal
    gets colour and a pipe or file none. --color beats both variables: it is the more deliberate choice."""
    if choice != "auto":
        return choice == "always"
    if environ.get("NO_COLOR"):
        return False
    if environ.get("FORCE_COLOR", "") not in ("", "0"):
        return True
    return terminal


def console(choice: str = "auto") -> Console:
    """The console a verb prints through. Whether stdout is a terminal is read here, once, and rich's own
    guesses (FORCE_COLOR or TTY_COMPATIBLE making a pipe a terminal) are overruled: a pipe gets whole lines,
    a terminal lines cut to its width. Without colour there are no escape codes at all, bold included."""
    from rich.console import Console

    terminal = sys.stdout.isatty()
    color = wants_color(choice, terminal, os.environ)
    system: Optional[Literal["auto", "standard"]] = ("auto" if terminal else "standard") if color else None
    return Console(highlight=False, soft_wrap=False, force_terminal=terminal, no_color=False, color_system=system)


def one_line(value: str) -> str:
    """`value` with line breaks, tabs and other control characters written as escapes (\\n, \\x1b): a name or
    an argument can hold anything, and a row must stay one row, with no escape code of the job's own."""
    if value.isprintable():
        return value
    return "".join(char if char.isprintable() or char == " " else repr(char)[1:-1] for char in value)


Cell = Union[str, "Text"]  # a table cell: plain text, or text with a style


def print_table(
    console: Console, header: Sequence[str], body: Sequence[Sequence[Cell]], right: Collection[str] = ()
) -> None:
    """A table as `ps` prints it: columns two spaces apart, one line per row, no trailing spaces. Never
    wrapped: in a pipe every row is whole, however long (`ps -a | grep NAME` finds each job, `cut` and
    `awk` see one record a line); on a terminal a row too long for it is cut with … at its right end."""
    from rich.text import Text

    lines = [[Text(name, style="bold") for name in header]]
    lines += [[cell if isinstance(cell, Text) else Text(one_line(cell)) for cell in row] for row in body]
    widths = [max(cells[i].cell_len for cells in lines) for i in range(len(header))]
    for cells in lines:
        line = Text()
        for i, (name, cell, width) in enumerate(zip(header, cells, widths)):
            pad = " " * (width - cell.cell_len)
            line.append("  " if i else "")
            line.append_text(Text(pad) + cell if name in right else cell + Text(pad))
        line.rstrip()
        if console.is_terminal:
            line.truncate(console.width, overflow="ellipsis")
        console.print(line, soft_wrap=True)


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


def job_table(jobs: list[Job], console: Console, where: str) -> None:
    """`tfrun ps`: a first line naming the box (`where`), so that a default host is never a surprise, then a
    row per job."""
    from rich.text import Text

    if not jobs:
        console.print(Text(f"no jobs on {where}", style="dim"), soft_wrap=True)
        return
    console.print(Text(f"jobs on {where}", style="dim"), soft_wrap=True)
    body: list[list[Cell]] = [
        [  # Text, not markup: a name like "[red]" is shown as typed
            str(job.id),
            job.name or "-",
            Text(job.state, style=STATE_STYLE.get(job.state, "")),
            ",".join(job.gpus) or ("-" if not job.gpus_requested else f"({job.gpus_requested})"),
            "-" if job.exit_code is None else str(job.exit_code),
            when(job.started_at),
            duration(runtime(job)),
            command_line(job),
        ]
        for job in jobs
    ]
    print_table(console, ("ID", "NAME", "STATE", "GPUS", "EXIT", "STARTED", "RUNTIME", "COMMAND"), body)


def job_detail(job: Job, console: Console) -> None:
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
    width = max(len(key) for key, _ in rows)
    for key, value in rows:  # a line each, whole and without trailing spaces: `status | grep workdir`
        line = Text(key.ljust(width), style="bold") + Text("  ")
        line.append(one_line(value), style=STATE_STYLE.get(value, "") if key == "state" else "")
        line.rstrip()
        console.print(line, soft_wrap=True)


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
    if not points:
        console.print("no checkpoints", style="dim")
        return
    body = [[p.name, "-" if p.step is None else str(p.step), when(p.saved), size(p.size)] for p in points]
    print_table(console, ("CHECKPOINT", "STEP", "SAVED", "SIZE"), body, right=("STEP", "SIZE"))


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
    if not gpus:
        console.print("no GPUs on this box (or none NVML can see)", style="dim")
        return
    body = [gpu_cells(gpu) for gpu in gpus]
    print_table(console, ("GPU", "NAME", "MEMORY", "USE", "JOB"), body, right=("MEMORY", "USE"))


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
    if not samples:
        console.print("no metrics yet: nothing the daemon can read as a metric was printed", style="dim")
        return
    names: dict[str, None] = {}
    for sample in samples:
        names.update(dict.fromkeys(sample.values))
    columns = sorted(names, key=lambda n: (n != "loss", n.startswith("val_"), n))
    header = ("STEP", "EPOCH", *(c.upper() for c in columns))
    body = [
        [
            str(s.step),
            "" if s.epoch is None else str(s.epoch),
            *(f"{s.values[c]:.6g}" if c in s.values else "" for c in columns),
        ]
        for s in samples
    ]
    print_table(console, header, body, right=header)
    where = {"callback": "written by tfrun.jobs (exact)", "log": "read from the output"}.get(source, source)
    console.print(f"{len(samples)} sample(s), {where}", style="dim")


def explained(readings: list[LineReading], truncated: bool, console: Console) -> None:
    """`tfrun metrics --explain`: each line shown, what was read from it, and how."""
    from rich.text import Text

    if not readings:
        console.print("no output with a number in it yet", style="dim")
        return
    for reading in readings:
        console.print(Text(f"{reading.lines:>7,}x  ") + Text(one_line(reading.line), style="bold"), soft_wrap=True)
        if reading.values:
            values = ", ".join(f"{name}={value:.6g}" for name, value in reading.values.items())
            epoch = "" if reading.epoch is None else f" (epoch {reading.epoch})"
            console.print(f"          read: {values} at step {reading.step}{epoch}", soft_wrap=True)
        else:
            console.print("          read: nothing", style="yellow", soft_wrap=True)
        console.print(f"          how:  {reading.why}", style="dim", soft_wrap=True)
    console.print(
        "a line of each shape (the same but for its numbers), with how many lines have it"
        + ("; the log's first 8 MiB only" if truncated else ""),
        style="dim",
    )


def size(n: float) -> str:
    """Bytes the way `ls -h` shows them: 512 B, 3.4 kB, 1.2 GB."""
    for unit in ("B", "kB", "MB", "GB", "TB"):
        if n < 1000 or unit == "TB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1000
    raise AssertionError("unreachable")
