"""The `[slurm]` table of config.toml, checked when the config loads, so that a bad option is refused with
its line before any job is submitted with it rather than by sbatch, job after job.

    executor = "slurm"
    [slurm]
    partition = "gpu"          # sbatch --partition (default: the cluster's default partition)
    account = "ml"             # sbatch --account
    time = "4:00:00"           # the default time limit: Slurm's forms (M, H:M:S, D-H:M...) or "2h"; never unlimited
    sbatch_options = ["--qos=high", "--constraint=a100"]   # appended to every sbatch

tfrun sets some options itself and the extras may not touch them: the output file (named by tfrun's job
id: Slurm's ids restart when its state is wiped), the job name, the signal before the time limit, the
work dir, `--parsable`; the GPUs come from `--gpus`, and partition, account and time have keys of their
own. `--time=UNLIMITED` is refused in any form: a job with no limit can hold its nodes forever.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any, Optional

from tfrun import tomltext
from tfrun.constants import MAX_NODES
from tfrun.duration import parse_duration

# Each option tfrun owns (long form, short form if any), and what to say to someone who sets it.
PROTECTED: dict[str, tuple[Optional[str], str]] = {
    "--output": ("-o", "tfrun writes the output under the job's folder"),
    "--error": ("-e", "tfrun writes the output under the job's folder"),
    "--job-name": ("-J", "tfrun names the job tfrun-ID"),
    "--signal": (None, "tfrun sets the signal before the time limit from the cancel grace"),
    "--chdir": ("-D", "tfrun runs the job in its own folder"),
    "--parsable": (None, "tfrun reads sbatch's answer itself"),
    "--wrap": (None, "tfrun writes the batch script"),
    "--array": ("-a", "tfrun makes the array itself: tfrun submit --array KEY=V1,V2,..."),
    "--open-mode": (None, "tfrun appends to the output file"),
    "--time": ("-t", "use the key time"),
    "--partition": ("-p", "use the key partition"),
    "--account": ("-A", "use the key account"),
    "--gres": (None, "tfrun asks for the job's --gpus"),
    "--gpus": ("-G", "tfrun asks for the job's --gpus"),
}
_UNLIMITED = ("unlimited", "infinite")
_PARTITION = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63}")  # whole: `$` would let "gpu\n" by
# Slurm's time forms: minutes, minutes:seconds, hours:minutes:seconds, days-hours[:minutes[:seconds]].
_SLURM_TIME = re.compile(r"\d+-\d+(?::\d+){0,2}|\d+(?::\d+){0,2}")


class SettingsError(ValueError):
    """A [slurm] value that cannot be used; the message names the key (config.py adds the file and line)."""


@dataclass(frozen=True)
class SlurmSettings:
    partition: Optional[str] = None
    account: Optional[str] = None
    time: Optional[str] = None  # in Slurm's form, as sbatch --time takes it
    sbatch_options: list[str] = field(default_factory=list)


def parse(table: Any, text: str, where: str) -> SlurmSettings:
    """The [slurm] table as read from config.toml (`text`), or SettingsError with `where` and the line."""
    if not isinstance(table, dict):
        raise SettingsError(f"{where}: [slurm] must be a table")

    def fail(key: str, message: str) -> SettingsError:
        line = tomltext.line_of(text, ("slurm", key))
        return SettingsError(f"{where}{f' line {line}' if line else ''}: [slurm] {key} {message}")

    strings = {}
    for key in ("partition", "account", "time"):
        value = table.get(key)
        if value is not None and (not isinstance(value, str) or not value.strip() or value != value.strip()):
            raise fail(key, "must be a non-empty string")
        strings[key] = value
    time = strings["time"]
    if time is not None:
        slurm_time = slurm_time_limit(time)
        if slurm_time is None:
            raise fail(
                "time", f"{time!r} is not a time limit: use Slurm's form (60, 4:00:00, 1-12) or 2h; never unlimited"
            )
        time = slurm_time
    options = table.get("sbatch_options", [])
    if not isinstance(options, list) or not all(isinstance(o, str) for o in options):
        raise fail("sbatch_options", "must be a list of strings")
    for option in options:
        why = refused(option)
        if why:
            raise fail("sbatch_options", f"cannot hold {option!r}: {why}")
    return SlurmSettings(strings["partition"], strings["account"], time, list(options))


def slurm_time_limit(text: str) -> Optional[str]:
    """`text` as sbatch --time takes it ("2h" becomes minutes), or None if it is not a finite, positive limit."""
    text = text.strip()
    if text.lower() in _UNLIMITED:
        return None
    if _SLURM_TIME.fullmatch(text):
        return text if any(c not in "0:-" for c in text) else None  # 0 is "no limit" to Slurm
    seconds = parse_duration(text)
    if seconds is None or seconds <= 0:
        return None
    return str(max(1, -(-int(seconds) // 60)))  # whole minutes, rounded up


def job_options(
    partition: Optional[str], time: Optional[str], nodes: Optional[int]
) -> tuple[Optional[str], Optional[str]]:
    """A submit's --partition, --time (as sbatch takes it) and --nodes, checked; SettingsError says why not."""
    if partition is not None and not _PARTITION.fullmatch(partition):
        raise SettingsError(f"--partition {partition!r} is not a partition name (letters, digits, - _ .)")
    limit = None
    if time is not None:
        limit = slurm_time_limit(time)
        if limit is None:
            raise SettingsError(f"--time {time!r} is not a time limit: use Slurm's form (60, 4:00:00, 1-12) or 2h")
    if nodes is not None and not 1 <= nodes <= MAX_NODES:
        raise SettingsError(f"--nodes {nodes}: from 1 to {MAX_NODES} nodes")
    return partition, limit


def nice(priority: int) -> Optional[int]:
    """sbatch --nice for a job's --priority: higher priority, lower nice. A negative priority P is nice -P;
    0 and above are nice 0 (Slurm's default: a negative nice needs a Slurm operator), so None."""
    return -priority if priority < 0 else None


def refused(option: str) -> Optional[str]:
    """Why an extra sbatch option may not be given, or None. Matches `--name`, `--name=v`, `-x`, `-xv`."""
    if not option.startswith("-"):
        return "each item is one option, such as --qos=high"
    name = option.split("=", 1)[0]
    for long, (short, why) in PROTECTED.items():
        if name == long or (len(name) > 2 and long.startswith(name) and name.startswith("--")):
            return why  # sbatch takes unambiguous prefixes of long options, so --out= is --output=
        if short and not option.startswith("--") and option[:2] == short:
            return why
    lowered = option.lower()
    if any(word in lowered for word in _UNLIMITED):
        return "a job with no time limit can hold its nodes forever"
    return None
