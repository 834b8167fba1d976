"""How jobs look on a terminal (styled lines, client/views/styled.py), in a pipe (plain whole rows) and to scripts
(JSON)."""

from __future__ import annotations

import dataclasses
import json
import os
import shlex
import signal
import sys
import time
from collections.abc import Collection, Sequence
from typing import TYPE_CHECKING, Any, Literal, Optional, Union

from tfrun.constants import GPU_HELD_OUTSIDE
from tfrun.protocol.fields import JobState
from tfrun.sizes import shown

from .styled import Styled, wants_color

if TYPE_CHECKING:
    from rich.console import Console

    # the records are only drawn here: a verb imports the protocol modules it asks with, and no others
    from tfrun.protocol.jobs import Job

    from .styled import Output

STATE_STYLE: dict[str, str] = {
    JobState.QUEUED: "yellow",
    JobState.RUNNING: "cyan",
    JobState.SUCCEEDED: "green",
    JobState.FAILED: "red",
    JobState.CANCELLED: "magenta",
    JobState.LOST: "red",
}


def console(choice: str = "auto") -> Console:
    """rich's console, for `tfrun top`'s live view (the other views write through client/views/styled.py's Output,
    which spares them importing rich.console). Whether stdout is a terminal is read here, once, and rich's own
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


Cell = Union[str, Styled]  # a table cell: plain text (shown with `one_line`), or text with a style


def print_table(
    out: Output, header: Sequence[str], body: Sequence[Sequence[Cell]], right: Collection[str] = ()
) -> None:
    """A table as `ps` prints it: columns two spaces apart, one line per row, no trailing spaces. Never
    wrapped: in a pipe every row is whole, however long (`ps -a | grep NAME` finds each job, `cut` and
    `awk` see one record a line); on a terminal a row too long for it is cut with … at its right end."""
    out.write(*table_lines(header, body, right), cut=True)


def table_lines(header: Sequence[str], body: Sequence[Sequence[Cell]], right: Collection[str] = ()) -> list[Styled]:
    """`print_table`'s lines, whole: also what `tfrun top` draws on its screen, where rich cuts them."""
    lines = [[Styled(name, "bold") for name in header]]
    lines += [[cell if isinstance(cell, Styled) else Styled(one_line(cell)) for cell in row] for row in body]
    widths = [max(cells[i].cell_len for cells in lines) for i in range(len(header))]
    rows = []
    for cells in lines:
        line = Styled()
        for i, (name, cell, width) in enumerate(zip(header, cells, widths)):
            pad = " " * (width - cell.cell_len)
            line.append("  " if i else "")
            line.append_styled(Styled(pad) + cell if name in right else cell + pad)
        line.rstrip()
        rows.append(line)
    return rows


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


def job_table(jobs: list[Job], out: Output, where: str) -> None:
    """`tfrun ps`: a first line naming the box (`where`), so that a default host is never a surprise, then a
    row per job. The tasks of an array (submit --array) follow a row of their own that sums them up
    (`12[0-3]  sweep  3 running, 1 queued ... train.py, 4 tasks`), each indented under it: still one row a
    job, its id first, so `ps | grep sweep-2` and `awk '{print $1}'` find it as any job."""
    if not jobs:
        out.write(f"no jobs on {where}", style="dim")
        return
    out.write(f"jobs on {where}", style="dim")
    print_table(out, ("ID", *_JOB_COLUMNS), _job_rows(jobs))
    for job in jobs:  # what no column shows: a GPU that no job here holds is someone else's on a shared box
        if job.state == JobState.QUEUED and job.waiting and GPU_HELD_OUTSIDE in job.waiting:
            out.write(f"job {job.id} {job.waiting}", style="dim")


def _job_rows(jobs: list[Job], host: Optional[str] = None) -> list[list[Cell]]:
    """`job_table`'s rows: arrays grouped under their summary rows; with `host`, each row begins with it and
    names its job by address (`box:12`, `box:12[0-3]`), as `ps --host POOL` shows them."""
    first: list[Cell] = [] if host is None else [host]
    where = "" if host is None else f"{host}:"
    body: list[list[Cell]] = []
    for label, members in array_groups(jobs):
        if label is not None:
            tasks = f"{members[0].script}, {len(members)} task{'s' if len(members) > 1 else ''}"
            body.append([*first, where + label, array_name(members), Styled(array_states(members), "dim"), "", "",
                         "", "", tasks])  # fmt: skip
        body += [[*first, f"{'  ' if label else ''}{where}{job.id}", *_job_cells(job)] for job in members]
    return body


def array_groups(jobs: Sequence[Job]) -> list[tuple[Optional[str], list[Job]]]:
    """The jobs in their order, the tasks of each array together (by index) where its first one listed is,
    labelled with the array's id and their indexes (`12[0-3]`); a job of no array alone, labelled None."""
    groups: list[tuple[Optional[str], list[Job]]] = []
    arrays: dict[int, list[Job]] = {}
    for job in jobs:
        if job.array_id is None:
            groups.append((None, [job]))
        elif job.array_id in arrays:
            arrays[job.array_id].append(job)
        else:
            arrays[job.array_id] = [job]
            groups.append((str(job.array_id), arrays[job.array_id]))
    labelled = []
    for label, members in groups:
        if label is not None:
            members.sort(key=lambda job: (job.array_index or 0, job.id))
            indexes = sorted({job.array_index or 0 for job in members})
            shown = _ranges(indexes)
            label = f"{label}[{shown if len(shown) <= 16 else f'{indexes[0]},…,{indexes[-1]}'}]"  # a column, not a list
        labelled.append((label, members))
    return labelled


def _ranges(numbers: list[int]) -> str:
    """`0-3,5,7-8`: sorted numbers in Slurm's way of writing array indexes."""
    runs: list[list[int]] = []
    for n in numbers:
        if runs and n == runs[-1][1] + 1:
            runs[-1][1] = n
        else:
            runs.append([n, n])
    return ",".join(f"{a}" if a == b else f"{a}-{b}" for a, b in runs)


def array_states(tasks: Sequence[Job]) -> str:
    """`3 running, 1 queued`: how an array's tasks are doing, in the order a job moves through its states."""
    counts = {state: sum(1 for job in tasks if job.state == state) for state in JobState.ALL}
    return ", ".join(f"{n} {state}" for state, n in counts.items() if n)


def _gpus(job: Job) -> str:
    """The GPUs a job was given; a job that started with none recorded had them chosen by its executor
    (Slurm gives the allocation its CUDA_VISIBLE_DEVICES on a node of its choosing)."""
    if job.gpus:
        return ",".join(job.gpus)
    if not job.gpus_requested:
        return "none"
    if job.started_at is None:
        return f"{job.gpus_requested} asked, none given" + (" yet" if job.state == JobState.QUEUED else "")
    return f"{job.gpus_requested}, chosen by the cluster on its node"


def array_name(tasks: Sequence[Job]) -> str:
    """The --name the array was given (its tasks are NAME-INDEX), else -."""
    job = tasks[0]
    suffix = f"-{job.array_index}"
    return job.name[: -len(suffix)] if job.name and job.name.endswith(suffix) else "-"


def pool_job_table(jobs: list[tuple[str, Job]], out: Output, where: str) -> None:
    """`tfrun ps --host POOL`: as `job_table`, each job with its host and named by its address (HOST:ID)."""
    if not jobs:
        out.write(f"no jobs on {where}", style="dim")
        return
    out.write(f"jobs on {where}", style="dim")
    by_host: dict[str, list[Job]] = {}
    for host, job in jobs:
        by_host.setdefault(host, []).append(job)
    body = [row for host, listed in by_host.items() for row in _job_rows(listed, host)]
    print_table(out, ("HOST", "ID", *_JOB_COLUMNS), body)


_JOB_COLUMNS = ("NAME", "STATE", "GPUS", "EXIT", "STARTED", "RUNTIME", "COMMAND")


def _job_cells(job: Job) -> list[Cell]:
    """A job's cells after its id, as `_JOB_COLUMNS` names them."""
    return [
        job.name or "-",
        Styled(job.state, STATE_STYLE.get(job.state, "")),
        ",".join(job.gpus) or ("-" if not job.gpus_requested else f"({job.gpus_requested})"),
        "-" if job.exit_code is None else str(job.exit_code),
        when(job.started_at),
        duration(runtime(job)),
        command_line(job),
    ]


def job_detail(job: Job, out: Output, address: Optional[str] = None) -> None:
    """`tfrun status J`: a line per field, the key in bold. (As rich drew it, the whole line is bold.)
    `address`: the job's HOST:ID, shown as its id when the verb was given one."""
    rows = [
        ("id", address or str(job.id)),
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
        ("stored to", job.checkpoints_to or "-"),
        ("restart of", "-" if job.restart_of is None else f"job {job.restart_of}"),
        ("restarted as", restarted(job)),
        ("restarts left", str(job.restarts_left)),
        ("restart on", ",".join(job.restart_on) or "-"),
        ("array", "-" if job.array_id is None else f"task {job.array_index} of array {job.array_id}"),
        ("gpus", _gpus(job)),
        ("waiting", job.waiting or "-"),
        ("after", ", ".join(f"job {ref}" for ref in job.after) or "-"),
        ("priority", str(job.priority)),
        ("alerts", ", ".join(job.alert_rules) or "none"),
        ("notify", ", ".join(job.notify) or "the daemon's URLs only"),
    ]
    rows += [(f"env {k}", v) for k, v in sorted(job.env.items())]
    width = max(len(key) for key, _ in rows)
    lines = []
    for key, value in rows:  # a line each, whole and without trailing spaces: `status | grep workdir`
        line = Styled(key.ljust(width), "bold") + "  "
        line.append(one_line(value), STATE_STYLE.get(value, "") if key == "state" else "")
        line.rstrip()
        lines.append(line)
    out.write(*lines)


def restarted(job: Job) -> str:
    """`status`'s word on a job's restart: the job that runs it again and, for one --max-restarts made, why
    and which restart of how many; for a failure with restarts left that --restart-on does not name, why
    there is none (else the user waits for a restart that never comes)."""
    automatic = job.cause in job.restart_on and job.restarts_left > 0
    if job.restarted_as is not None and automatic:
        which = f"restart {job.restarts + 1} of {job.restarts + job.restarts_left}"
        return f"job {job.restarted_as}: {ended_because(job)} ({which})"
    if job.restarted_as is not None:
        return f"job {job.restarted_as}"  # tfrun restart
    if job.cause is not None and job.restarts_left > 0 and not automatic:
        return f"not restarted: {ended_because(job)}, and --restart-on is {','.join(job.restart_on) or 'empty'}"
    return "-"


def ended_because(job: Job) -> str:
    """Why a failed or lost job ended, by its cause, as a clause: "it was OOM-killed"."""
    if job.cause == "oom":
        return "it was OOM-killed" if job.signal == 9 else "it ran out of memory"
    if job.cause == "lost":
        return f"it was lost ({job.reason})" if job.reason else "it was lost"
    if job.cause == "signal" and job.signal is not None:
        return f"it was killed by {signal_name(job.signal)}"
    if job.exit_code is not None:
        return f"it exited with code {job.exit_code}"
    return f"it failed ({job.reason})" if job.reason else "it failed"


def signal_name(number: int) -> str:
    """SIGKILL (signal 9), or signal N where this machine has no name for it (the box may differ)."""
    try:
        return f"{signal.Signals(number).name} (signal {number})"
    except ValueError:
        return f"signal {number}"


size = shown  # bytes as tfrun shows them everywhere (tfrun/sizes.py): 512 B, 3.4 kB, 1.2 GB
