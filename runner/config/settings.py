"""The daemon's settings: `$TFRUN_HOME/config.toml`, overridden by environment variables.

checkpoint_root = "/mnt/checkpoints"   # TFRUN_CHECKPOINT_ROOT; each job gets a folder under it
job_python = "/usr/bin/python3"        # TFRUN_JOB_PYTHON; runs .py scripts unless --python says
                                       # (default: python3 on tfrund's PATH, else tfrund's own Python)
notify = ["mailto://user:pass@smtp.example.com?to=me@example.com",
          "slack://T0/B0/XXX"]         # TFRUN_NOTIFY (URLs apart by spaces); where every alert goes: apprise URLs
gpus = ["0", "1"]                      # TFRUN_GPUS=0,1; the devices jobs get (default: those NVML sees)
default_gpus = 1                       # GPUs a job gets without --gpus (default: 1 where there are GPUs, else 0)
max_cpu_jobs = 4                       # CPU-only jobs running at once (default: no cap)
max_blob_bytes = "20GB"                # cap on uploaded contents kept (default: none); oldest unneeded go first
blob_grace = "1h"                      # an uploaded content younger than this is never collected
name = "box2"                          # the box's name in alerts and `tfrun top` (default: the hostname)
executor = "local"                     # "slurm": submit jobs with sbatch ([slurm] below); restart to change

[alerts]
rules = ["oom", "spike=2", "stall=30m", "failed", "done", "lost", "gpu-memory=90%", "disk-full",
         "storage"]  # the rules every job is watched by, and the box's (default: all)
cooldown = "15m"        # one message per job and rule in this long: one incident, one message
expire = "24h"          # keep retrying a delivery this long, then give up (it stays in `tfrun alerts`)
gpu_memory_for = "1m"   # gpu-memory fires when a GPU stays above its threshold this long
metric_patterns = ['val_f1=(?P<val_f1>[0-9.]+)']   # more metrics to read from every job's log

[slurm]                 # with executor = "slurm" (runner/executors/slurm/settings.py)
partition = "gpu"       # sbatch --partition (default: the cluster's default)
account = "ml"          # sbatch --account
time = "4:00:00"        # the default time limit (Slurm's form, or 2h); never unlimited
sbatch_options = ["--qos=normal"]   # added to every sbatch; tfrun's own options are refused

[storage]               # checkpoints copied to object storage (runner/storage/, docs/how-to/checkpoints.md)
checkpoints_to = "s3://bucket/prefix"  # TFRUN_CHECKPOINTS_TO; every job's, unless submit --checkpoints-to says
max_bandwidth = "100MB"                # bytes a second for all uploads together (default: no bound)
alert_after = "10m"                    # the storage alert once uploads have failed this long
"""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional

from tfrun import tomltext
from tfrun.constants import BLOB_GRACE_S, CONFIG_FILE
from tfrun.duration import parse_duration
from tfrun.paths import Layout
from tfrun.shorten import shorten
from tfrun.sizes import parse_size
from tfrun.storage import place

from ..alerts import rules
from ..executors.slurm import settings as slurm_settings
from ..metrics import LogMetrics, PatternError

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - exercised on the 3.9 and 3.10 the daemon supports
    import tomli as tomllib

DEFAULT_COOLDOWN_S = 15 * 60.0
DEFAULT_EXPIRE_S = 24 * 3600.0
DEFAULT_GPU_MEMORY_FOR_S = 60.0
DEFAULT_STORAGE_ALERT_AFTER_S = 10 * 60.0
MAX_BOX_NAME = 64


class ConfigError(Exception):
    """The config file cannot be used; the message names the file and the key."""


# What `tfrun config set KEY VALUE...` makes of its words, by key.
STRING, COUNT, STRINGS, DURATION = "a string", "a whole number", "a list of strings", "a duration such as 15m"


@dataclass(frozen=True)
class Key:
    """One setting of config.toml: what its words are, when a reload's change of it takes effect, and the
    variable in tfrund's environment that overrides it (read once, at start: changing it needs a restart)."""

    kind: str
    applies: str
    env: Optional[str] = None


# Every key the file may hold, "table.key" for those in a table; a key missing here is refused as unknown.
KEYS: dict[str, Key] = {
    "checkpoint_root": Key(STRING, "to jobs submitted from now on", "TFRUN_CHECKPOINT_ROOT"),
    "job_python": Key(STRING, "to jobs submitted from now on", "TFRUN_JOB_PYTHON"),
    "notify": Key(STRINGS, "now, to the alerts of every job", "TFRUN_NOTIFY"),
    "gpus": Key(STRINGS, "now (a job keeps the GPUs it holds)", "TFRUN_GPUS"),
    "default_gpus": Key(COUNT, "to jobs submitted from now on"),
    "max_cpu_jobs": Key(COUNT, "now"),
    "max_blob_bytes": Key(STRING, "after the next submit"),  # a size: "20GB", "500MB"
    "blob_grace": Key(DURATION, "now"),
    "name": Key(STRING, "now, to every alert and test message"),
    "executor": Key(STRING, "when tfrund restarts"),
    "alerts.rules": Key(STRINGS, "to jobs submitted from now on (the box's rules, gpu-memory and disk-full: now)"),
    "alerts.cooldown": Key(DURATION, "now"),
    "alerts.expire": Key(DURATION, "to alerts recorded from now on"),
    "alerts.gpu_memory_for": Key(DURATION, "now"),
    "alerts.metric_patterns": Key(STRINGS, "to jobs started from now on"),
    "slurm.partition": Key(STRING, "to jobs started from now on"),
    "slurm.account": Key(STRING, "to jobs started from now on"),
    "slurm.time": Key(STRING, "to jobs started from now on"),
    "slurm.sbatch_options": Key(STRINGS, "to jobs started from now on"),
    "storage.checkpoints_to": Key(STRING, "to jobs submitted from now on", "TFRUN_CHECKPOINTS_TO"),
    "storage.max_bandwidth": Key(STRING, "now"),  # a size a second: "100MB"
    "storage.alert_after": Key(DURATION, "now"),
}
EXECUTORS = ("local", "slurm")


def schema() -> tomltext.Schema:
    """KEYS as the table structure `tomltext.unknown_key` checks a file against."""
    tree: tomltext.Schema = {}
    for name in KEYS:
        *tables, leaf = name.split(".")
        node = tree
        for table in tables:
            sub = node.setdefault(table, {})
            assert isinstance(sub, dict)
            node = sub
        node[leaf] = None
    return tree


@dataclass(frozen=True)
class Config:
    checkpoint_root: Path
    job_python: Optional[str] = None
    notify: list[str] = field(default_factory=list)  # secret: never logged or sent to a client
    rules: dict[str, Optional[float]] = field(default_factory=lambda: dict(rules.DEFAULT_RULES))
    cooldown: float = DEFAULT_COOLDOWN_S
    expire: float = DEFAULT_EXPIRE_S
    gpu_memory_for: float = DEFAULT_GPU_MEMORY_FOR_S
    metric_patterns: list[str] = field(default_factory=list)
    gpus: Optional[list[str]] = None  # None: ask NVML
    default_gpus: Optional[int] = None
    max_cpu_jobs: int = 0  # 0: no cap
    max_blob_bytes: int = 0  # 0: no cap on the uploaded contents kept (runner/housekeeping.py)
    blob_grace: float = BLOB_GRACE_S  # an uploaded content younger than this is never collected
    name: Optional[str] = None  # the box's name in alerts; None: the machine's hostname
    executor: str = "local"  # where jobs run: "local" (a shim each, here) or "slurm" (sbatch)
    slurm: slurm_settings.SlurmSettings = field(default_factory=slurm_settings.SlurmSettings)
    checkpoints_to: Optional[str] = None  # [storage]: where every job's checkpoints are copied; None: nowhere
    storage_bandwidth: int = 0  # bytes a second for all uploads; 0: no bound
    storage_alert_after: float = DEFAULT_STORAGE_ALERT_AFTER_S
    sources: dict[str, str] = field(default_factory=dict)  # key -> "config.toml", or the variable that set it

    @classmethod
    def load(cls, layout: Layout) -> Config:
        text = ""
        if layout.config_file.exists():
            try:
                text = layout.config_file.read_text()
            except (OSError, UnicodeDecodeError) as exc:
                raise ConfigError(f"{layout.config_file}: {getattr(exc, 'strerror', None) or exc}") from None
        return cls.parse(text, layout)

    @classmethod
    def parse(cls, text: str, layout: Layout) -> Config:
        """The config that `text`, as the layout's config.toml, gives: what tfrund starts with, and what
        `tfrun config set` checks a would-be file with before writing it."""
        where = str(layout.config_file)
        try:
            raw = tomllib.loads(text)
        except tomllib.TOMLDecodeError as exc:
            raise ConfigError(tomltext.decode_error(where, exc, text)) from None
        unknown = tomltext.unknown_key(where, text, raw, schema()) or tomltext.nul_byte(where, text, raw)
        if unknown:
            raise ConfigError(unknown)
        alerts, storage = raw.get("alerts", {}), raw.get("storage", {})
        if not isinstance(alerts, dict):
            raise ConfigError(f"{where}: [alerts] must be a table")
        if not isinstance(storage, dict):
            raise ConfigError(f"{where}: [storage] must be a table")
        root = os.environ.get("TFRUN_CHECKPOINT_ROOT") or _string(raw, "checkpoint_root", where)
        python = os.environ.get("TFRUN_JOB_PYTHON") or _string(raw, "job_python", where)
        notify = (
            os.environ["TFRUN_NOTIFY"].split() if os.environ.get("TFRUN_NOTIFY") else _strings(raw, "notify", where)
        )
        try:
            chosen = rules.parse_all(_strings(alerts, "rules", where)) if "rules" in alerts else rules.DEFAULT_RULES
        except rules.RuleError as exc:
            raise ConfigError(f"{where}: [alerts] rules: {exc}") from None
        patterns = _strings(alerts, "metric_patterns", where)
        try:
            LogMetrics(patterns)
        except PatternError as exc:
            raise ConfigError(f"{where}: [alerts] metric_patterns: {exc}") from None
        return cls(
            checkpoint_root=Path(root).expanduser().absolute() if root else layout.default_checkpoint_root,
            job_python=python or None,
            notify=notify,
            rules=dict(chosen),
            cooldown=_seconds(alerts, "cooldown", DEFAULT_COOLDOWN_S, f"{where}: [alerts]"),
            expire=_seconds(alerts, "expire", DEFAULT_EXPIRE_S, f"{where}: [alerts]"),
            gpu_memory_for=_seconds(alerts, "gpu_memory_for", DEFAULT_GPU_MEMORY_FOR_S, f"{where}: [alerts]"),
            metric_patterns=patterns,
            gpus=_devices(raw, where),
            default_gpus=_count(raw, "default_gpus", where),
            max_cpu_jobs=_count(raw, "max_cpu_jobs", where) or 0,
            max_blob_bytes=_size(raw, "max_blob_bytes", where),
            blob_grace=_seconds(raw, "blob_grace", BLOB_GRACE_S, f"{where}:"),
            name=_box_name(raw, where),
            executor=_executor(raw, text, where),
            slurm=_slurm(raw, text, where),
            checkpoints_to=_destination(storage, where),
            storage_bandwidth=_size(storage, "max_bandwidth", f"{where}: [storage]"),
            storage_alert_after=_seconds(storage, "alert_after", DEFAULT_STORAGE_ALERT_AFTER_S, f"{where}: [storage]"),
            sources=_sources(raw),
        )


def _sources(raw: dict[str, Any]) -> dict[str, str]:
    """Where each key that is not a default comes from: the environment wins over the file."""
    found = {}
    for name, key in KEYS.items():
        table, _, leaf = name.rpartition(".")
        if key.env and os.environ.get(key.env):
            found[name] = key.env
        elif leaf in (raw.get(table, {}) if table else raw):
            found[name] = CONFIG_FILE
    return found


def _executor(raw: dict[str, Any], text: str, where: str) -> str:
    value = _string(raw, "executor", where) or "local"
    if value not in EXECUTORS:
        line = tomltext.line_of(text, ("executor",))
        raise ConfigError(f"{where}{f' line {line}' if line else ''}: executor must be one of {', '.join(EXECUTORS)}")
    return value


def _destination(storage: dict[str, Any], where: str) -> Optional[str]:
    """[storage] checkpoints_to (TFRUN_CHECKPOINTS_TO first), checked as submit --checkpoints-to is."""
    value = os.environ.get("TFRUN_CHECKPOINTS_TO") or _string(storage, "checkpoints_to", f"{where}: [storage]")
    if not value:
        return None
    try:
        return place.parse(value).url
    except place.PlaceError as exc:
        raise ConfigError(f"{where}: [storage] checkpoints_to: {exc}") from None


def _slurm(raw: dict[str, Any], text: str, where: str) -> slurm_settings.SlurmSettings:
    try:
        return slurm_settings.parse(raw.get("slurm", {}), text, where)
    except slurm_settings.SettingsError as exc:
        raise ConfigError(str(exc)) from None


def _devices(raw: dict[str, Any], where: str) -> Optional[list[str]]:
    """The GPUs jobs are given, by CUDA index or UUID: TFRUN_GPUS ("0,1", "none"), else the config's list."""
    named = os.environ.get("TFRUN_GPUS")
    if named:
        return [] if named.strip() == "none" else [d.strip() for d in named.split(",") if d.strip()]
    if "gpus" not in raw:
        return None
    value = raw["gpus"]
    if not isinstance(value, list) or not all(isinstance(v, (str, int)) and not isinstance(v, bool) for v in value):
        raise ConfigError(f"{where}: gpus must be a list of device indices or UUIDs")
    return [str(v) for v in value]


def _box_name(raw: dict[str, Any], where: str) -> Optional[str]:
    """The box's own name for its alerts: in a fleet the hostname is often a container's id, which says
    nothing in a message. Checked as a job name is (1 to 64 printable characters, no spaces; no ':' either,
    which ends a host's name in a job address), since it stands in one-line summaries and headers."""
    value = _string(raw, "name", where)
    if value is not None and (
        not 1 <= len(value) <= MAX_BOX_NAME or any(c.isspace() or not c.isprintable() or c == ":" for c in value)
    ):
        rule = f"1 to {MAX_BOX_NAME} printable characters, no spaces or ':'"
        raise ConfigError(f"{where}: name {shorten(value, 70)!r} cannot name the box: {rule}")
    return value


def _count(raw: dict[str, Any], key: str, where: str) -> Optional[int]:
    value = raw.get(key)
    if value is not None and (not isinstance(value, int) or isinstance(value, bool) or value < 0):
        raise ConfigError(f"{where}: {key} must be a whole number, 0 or more")
    return value


def _size(raw: dict[str, Any], key: str, where: str) -> int:
    """Bytes: a whole number, or text such as "20GB" or "500MB"; 0 when the key is not there."""
    if key not in raw:
        return 0
    size = parse_size(raw[key])
    if size is None:
        raise ConfigError(f"{where}: {key} must be a size such as 20GB or 500MB, or a number of bytes")
    return size


def _string(raw: dict[str, Any], key: str, where: str) -> Optional[str]:
    value = raw.get(key)
    if value is not None and not isinstance(value, str):
        raise ConfigError(f"{where}: {key} must be a string")
    return value


def _strings(raw: dict[str, Any], key: str, where: str) -> list[str]:
    value = raw.get(key, [])
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise ConfigError(f"{where}: {key} must be a list of strings")
    return value


def _seconds(raw: dict[str, Any], key: str, default: float, where: str) -> float:
    """A duration setting ("15m", "1h") in seconds; `where` names the file (and table) in the error."""
    value = raw.get(key)
    if value is None:
        return default
    seconds = parse_duration(value) if isinstance(value, str) else None
    if seconds is None:
        raise ConfigError(f"{where} {key} must be a duration such as 15m")
    return seconds
