"""The daemon's settings: `$TFRUN_HOME/config.toml`, overridden by environment variables.

checkpoint_root = "/mnt/checkpoints"   # TFRUN_CHECKPOINT_ROOT; each job gets a folder under it
job_python = "/usr/bin/python3"        # TFRUN_JOB_PYTHON; runs .py scripts unless --python says
notify = ["mailto://user:pass@smtp.example.com?to=me@example.com", "slack://T0/B0/XXX"]  # TFRUN_NOTIFY
gpus = ["0", "1"]                      # TFRUN_GPUS=0,1; the devices jobs get (default: those NVML sees)
default_gpus = 1                       # GPUs a job gets without --gpus (default: 1 where there are GPUs, else 0)
max_cpu_jobs = 4                       # CPU-only jobs running at once (default: no cap)

[alerts]
rules = ["oom", "spike=2", "stall=30m", "failed", "done", "lost", "gpu-memory=90%"]  # the default: all
cooldown = "15m"        # one message per job and rule in this long: one incident, one message
expire = "24h"          # keep retrying a delivery this long, then give up (it stays in `tfrun alerts`)
gpu_memory_for = "1m"   # gpu-memory fires when a GPU stays above its threshold this long
metric_patterns = ['val_f1=(?P<val_f1>[0-9.]+)']   # more metrics to read from every job's log
"""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional

from tfrun.duration import parse_duration
from tfrun.paths import Layout
from tfrun.runner import rules
from tfrun.runner.metrics import LogMetrics, PatternError

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - exercised on the 3.9 and 3.10 the daemon supports
    import tomli as tomllib

DEFAULT_COOLDOWN_S = 15 * 60.0
DEFAULT_EXPIRE_S = 24 * 3600.0
DEFAULT_GPU_MEMORY_FOR_S = 60.0


class ConfigError(Exception):
    """The config file cannot be used; the message names the file and the key."""


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

    @classmethod
    def load(cls, layout: Layout) -> Config:
        raw: dict[str, Any] = {}
        where = str(layout.config_file)
        if layout.config_file.exists():
            try:
                raw = tomllib.loads(layout.config_file.read_text())
            except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError) as exc:
                raise ConfigError(f"{where}: {exc}") from None
        alerts = raw.get("alerts", {})
        if not isinstance(alerts, dict):
            raise ConfigError(f"{where}: [alerts] must be a table")
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
            cooldown=_seconds(alerts, "cooldown", DEFAULT_COOLDOWN_S, where),
            expire=_seconds(alerts, "expire", DEFAULT_EXPIRE_S, where),
            gpu_memory_for=_seconds(alerts, "gpu_memory_for", DEFAULT_GPU_MEMORY_FOR_S, where),
            metric_patterns=patterns,
            gpus=_devices(raw, where),
            default_gpus=_count(raw, "default_gpus", where),
            max_cpu_jobs=_count(raw, "max_cpu_jobs", where) or 0,
        )


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


def _count(raw: dict[str, Any], key: str, where: str) -> Optional[int]:
    value = raw.get(key)
    if value is not None and (not isinstance(value, int) or isinstance(value, bool) or value < 0):
        raise ConfigError(f"{where}: {key} must be a whole number, 0 or more")
    return value


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
    value = raw.get(key)
    if value is None:
        return default
    seconds = parse_duration(value) if isinstance(value, str) else None
    if seconds is None:
        raise ConfigError(f"{where}: [alerts] {key} must be a duration such as 15m")
    return seconds
