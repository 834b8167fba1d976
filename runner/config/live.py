"""The daemon's config while it runs: shown as it is in use (secrets masked), read again on request or on
SIGHUP, and changed one key at a time in config.toml for `tfrun config set`.

Every key of config.toml takes effect without a restart; KEYS says from when (now, or for jobs submitted
from now on). What a restart alone changes is what tfrund reads from its environment at start: TFRUN_HOME
(its state, its socket) and the TFRUN_* variables that override keys of the file.
"""

from __future__ import annotations

import difflib
import json
import logging
import os
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from tfrun import tomltext
from tfrun.constants import CONFIG_COUNT_DIGITS, CONFIG_FILE
from tfrun.duration import format_duration
from tfrun.numerals import is_digits
from tfrun.protocol.admin import Setting
from tfrun.shorten import shorten
from tfrun.sizes import shown as shown_size

from ..alerts import rules
from ..alerts.outbox import diagnose, shown_url, usable
from ..doctor import job_python
from .settings import COUNT, KEYS, STRINGS, Config, ConfigError

if TYPE_CHECKING:
    from tfrun.paths import Layout

    from ..alerts.watch import Alerts
    from ..queue.scheduler import Scheduler

log = logging.getLogger("tfrund")


class Context(Protocol):
    """What reading, reloading and setting the config need of the daemon (runner/daemon.py's Daemon is one)."""

    config: Config
    layout: Layout
    alerts: Alerts
    scheduler: Scheduler

    def apply_config(self, config: Config) -> None: ...


def effective(daemon: Context, secrets: bool = False) -> list[Setting]:
    """Every key as the daemon uses it now, with where it came from; URLs masked unless its user asked for
    `secrets`. A key with no way of its own here shows the Config field of its name, as JSON."""
    config, scheduler = daemon.config, daemon.scheduler
    shown: dict[str, Any] = {
        "checkpoint_root": str(config.checkpoint_root),
        "job_python": job_python(config.job_python),
        "notify": [shown_url(url, secrets) for url in config.notify],
        "gpus": list(scheduler.devices),
        "default_gpus": scheduler.default_gpus(),
        "max_cpu_jobs": config.max_cpu_jobs,
        "alerts.rules": rules.texts(config.rules),
        "alerts.cooldown": format_duration(config.cooldown),
        "alerts.expire": format_duration(config.expire),
        "alerts.gpu_memory_for": format_duration(config.gpu_memory_for),
        "alerts.metric_patterns": list(config.metric_patterns),
        "blob_grace": format_duration(config.blob_grace),
        "name": daemon.alerts.host,
        "executor": config.executor,
        "slurm.partition": config.slurm.partition,
        "slurm.account": config.slurm.account,
        "slurm.time": config.slurm.time,
        "slurm.sbatch_options": list(config.slurm.sbatch_options),
        "storage.checkpoints_to": config.checkpoints_to,
        "storage.max_bandwidth": shown_size(config.storage_bandwidth) + "/s" if config.storage_bandwidth else None,
        "storage.alert_after": format_duration(config.storage_alert_after),
    }
    default = {"gpus": "default: those NVML sees"} if config.gpus is None else {}
    if config.name is None:
        default["name"] = "default: the hostname"
    values = {name: shown[name] if name in shown else getattr(config, name.rpartition(".")[2], None) for name in KEYS}
    return [
        Setting(name, json.dumps(values[name], default=str), config.sources.get(name) or default.get(name, "default"))
        for name in KEYS
    ]


def reload(daemon: Context, how: str) -> list[str]:
    """Read config.toml again and use it: one line per key whose value changed, saying from when it applies.
    A file that cannot be used raises ConfigError, and the daemon keeps the config it has."""
    config = Config.load(daemon.layout)
    before = {s.key: s.value for s in effective(daemon)}
    daemon.apply_config(config)
    changed = [s.key for s in effective(daemon) if before.get(s.key) != s.value]
    log.info("config reloaded (%s): %s", how, ", ".join(changed) or "nothing changed")
    return [f"{name}: applies {KEYS[name].applies}" for name in changed]


def set_key(daemon: Context, name: str, words: list[str], unset: bool) -> list[str]:
    """Set (or remove) one key in config.toml, only its own lines edited, once the whole would-be file has
    loaded as the daemon would load it; then reload. The change lines, as `reload` gives them."""
    key = KEYS.get(name)
    if key is None:
        hint = difflib.get_close_matches(name, list(KEYS), n=1)
        advice = f"; did you mean {hint[0]!r}?" if hint else f" (the keys: {', '.join(KEYS)})"
        raise ConfigError(f"unknown key {name!r}{advice}")
    path = daemon.layout.config_file
    try:
        text = path.read_text() if path.exists() else ""
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"{path}: {getattr(exc, 'strerror', None) or exc}") from None
    parts = tuple(name.split("."))
    if unset:
        edited = tomltext.remove_key(text, parts)
        if edited is None:  # not in the file: it has its default already
            return reload(daemon, f"tfrun config unset {name}")
    else:
        edited = tomltext.set_key(text, parts, tomltext.render(_value(name, key.kind, words)))
    Config.parse(edited, daemon.layout)  # the would-be file, as the next start or reload would read it
    try:
        _write(path, edited)
    except OSError as exc:
        raise ConfigError(f"cannot write {path}: {exc.strerror or exc}") from None
    changes = reload(daemon, f"tfrun config {'unset' if unset else 'set'} {name}")
    if key.env and os.environ.get(key.env):
        changes.append(f"{name}: {key.env} in tfrund's environment overrides {CONFIG_FILE}; restart tfrund without it")
    return changes


def _value(name: str, kind: str, words: list[str]) -> Any:
    """The TOML value that the words of `tfrun config set NAME WORD...` stand for."""
    if kind == STRINGS:
        if name == "notify":
            for url in words:
                if not usable(url):
                    raise ConfigError(f"notify: {diagnose(url)}")
        return list(words)
    if len(words) != 1:
        raise ConfigError(f"{name} takes one value ({kind}), not {len(words)}")
    word = words[0]
    if kind == COUNT:
        if not is_digits(word) or len(word) > CONFIG_COUNT_DIGITS:
            raise ConfigError(f"{name} must be {kind} (0 to {10**CONFIG_COUNT_DIGITS - 1}), not {shorten(word, 40)!r}")
        return int(word)
    return word  # a string or a duration: the loader checks it, as it checks the file


def _write(path: Path, text: str) -> None:
    """Replace the file whole (write, then rename), keeping its mode; a new one is the user's alone, since it
    may hold passwords in notify URLs. A config.toml that is a link to a file kept elsewhere stays a link:
    the file it points to is the one replaced."""
    path = path.resolve()
    mode = path.stat().st_mode & 0o7777 if path.exists() else 0o600
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode)
    with os.fdopen(fd, "w") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())
    os.chmod(tmp, mode)
    os.replace(tmp, path)
