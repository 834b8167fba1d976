"""What the watching verbs print: alerts and their deliveries, metrics and how a log was read (`--explain`),
the GPUs, doctor's checks, and a job's checkpoints; each as styled lines or a table (client/views/render.py's).
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Sequence
from typing import TYPE_CHECKING, Optional, Union

from .render import Cell, one_line, print_table, size, table_lines, when
from .styled import Styled

if TYPE_CHECKING:
    # the records are only drawn here: a verb imports the protocol modules it asks with, and no others
    from tfrun.protocol.admin import Check
    from tfrun.protocol.submit import FileEntry
    from tfrun.protocol.watching import Alert, Delivery, Gpu, LineReading, MetricSample

    from .styled import Output

_TF_CHECKPOINT = re.compile(r"^(?P<prefix>.*?)(\.index|\.data-\d+-of-\d+)$")
_STEP = re.compile(r"-(\d+)$")
_CHECK_STYLE = {"ok": ("ok", "green"), "warn": ("warn", "yellow"), "fail": ("FAIL", "bold red")}
NO_NOTIFY = "not sent: no notify URL configured"
_DELIVERY_STYLE = {"sent": "green", "pending": "yellow", "expired": "red", "failed": "red"}


@dataclasses.dataclass
class Checkpoint:
    """One saved state in a job's checkpoint folder: a TensorFlow checkpoint's files, or any other file."""

    name: str
    step: Optional[int]
    saved: Optional[float]
    size: int
    files: list[str]


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


def check_lines(checks: list[Check], out: Output) -> None:
    """`tfrun doctor`'s report: one line per check, in the colour of its outcome, what to do after it when
    there is something. Not cut on a narrow terminal: the advice is the point."""
    lines = []
    for check in checks:
        label, style = _CHECK_STYLE.get(check.status, (check.status, ""))
        line = Styled(f"{label:<4}  ", style) + Styled(f"{check.name}: ", "bold") + check.detail
        if check.advice:
            line += Styled(f"; {check.advice}", "dim" if check.status == "ok" else "")
        lines.append(line)
    out.write(*lines)


def gpu_table(gpus: list[Gpu], out: Output) -> None:
    if not gpus:
        out.write("no GPUs on this box (or none NVML can see)", style="dim")
        return
    out.write(*gpu_lines((), [gpu_cells(gpu) for gpu in gpus]), cut=True)


def gpu_lines(first: tuple[str, ...], rows: Sequence[Sequence[Cell]]) -> list[Styled]:
    """The GPUs' table (`gpus`, and `top` under its jobs), `first` naming the columns before GPU."""
    return table_lines((*first, "GPU", "NAME", "MEMORY", "USE", "JOB"), rows, right=("MEMORY", "USE"))


def gpu_cells(gpu: Gpu) -> tuple[str, str, str, str, str]:
    """A GPU's row in `tfrun gpus` and `tfrun top`: device, name, memory, utilisation, and its job, or who
    holds it outside this daemon (another user's job, a process outside tfrun), which keeps jobs off it."""
    memory = "-"
    if gpu.memory_used is not None and gpu.memory_total:
        percent = 100 * gpu.memory_used / gpu.memory_total
        memory = f"{size(gpu.memory_used)} / {size(gpu.memory_total)} ({percent:.0f}%)"
    utilization = "-" if gpu.utilization is None else f"{gpu.utilization}%"
    job = str(gpu.job) if gpu.job is not None else f"held by {gpu.held_by}" if gpu.held_by else "-"
    return gpu.device, gpu.name or "-", memory, utilization, job


def alert_lines(alerts: list[Alert], verbose: bool, out: Output, where: Optional[list[str]] = None) -> None:
    """`tfrun alerts`: per alert its time, rule and summary, then how each delivery went. `where`, over a
    pool: each alert's job address (HOST:ID), or its host for a box's own alert, before its summary."""
    if not alerts:
        out.write("no alerts", style="dim")
        return
    lines: list[Union[Styled, str]] = []
    for i, alert in enumerate(alerts):
        line = Styled(f"{when(alert.at)}  ") + Styled(f"{alert.rule:<10} ", "bold")
        if where is not None:
            line.append(f"{where[i]}  ", "cyan")
        lines.append(line + alert.summary)
        if not alert.deliveries:
            lines.append(Styled(f"    {NO_NOTIFY}", "dim"))
        for delivery in alert.deliveries:
            line = Styled("    ").append(f"{delivery.state:<8}", _DELIVERY_STYLE.get(delivery.state, ""))
            note, error = delivery_note(delivery)
            line.append(f" {delivery.target}").append(note, "dim")
            if error:
                line.append(error)
            lines.append(line)
        if verbose:
            lines.append("\n".join("    | " + line for line in alert.body.rstrip("\n").split("\n")))
    out.write(*lines)


def delivery_note(delivery: Delivery) -> tuple[str, str]:
    """What `alerts` says of a delivery after its target (the web page's Alerts too): when it was sent, or its
    attempts and next try; and its last error, or ''."""
    if delivery.state == "sent":
        return f" at {when(delivery.sent_at)}", ""
    next_try = "" if delivery.next_at is None else f", next at {when(delivery.next_at)}"
    return f" ({delivery.attempts} attempt(s){next_try})", f": {delivery.error}" if delivery.error else ""


def metric_table(source: str, samples: list[MetricSample], out: Output) -> None:
    """`tfrun metrics`: one row per step, a column per metric (loss first), and where they came from."""
    if not samples:
        out.write("no metrics yet: nothing the daemon can read as a metric was printed", style="dim")
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
    print_table(out, header, body, right=header)
    where = {"callback": "written by tfrun.jobs (exact)", "log": "read from the output"}.get(source, source)
    out.write(f"{len(samples)} sample(s), {where}", style="dim")


def explained(readings: list[LineReading], truncated: bool, out: Output) -> None:
    """`tfrun metrics --explain`: each line shown, what was read from it, and how."""
    if not readings:
        out.write("no output with a number in it yet", style="dim")
        return
    lines: list[Union[Styled, str]] = []
    for reading in readings:
        lines.append(Styled(f"{reading.lines:>7,}x  ").append(one_line(reading.line), "bold"))
        if reading.values:
            values = ", ".join(f"{name}={value:.6g}" for name, value in reading.values.items())
            epoch = "" if reading.epoch is None else f" (epoch {reading.epoch})"
            lines.append(f"          read: {values} at step {reading.step}{epoch}")
        else:
            lines.append(Styled("          read: nothing", "yellow"))
        lines.append(Styled(f"          how:  {reading.why}", "dim"))
    footer = "a line of each shape (the same but for its numbers), with how many lines have it"
    lines.append(Styled(footer + ("; the log's first 8 MiB only" if truncated else ""), "dim"))
    out.write(*lines)
