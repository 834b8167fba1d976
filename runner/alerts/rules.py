"""The alert rules, their settings, and how a job's own choices combine with the daemon's.

A rule's *text* is `NAME` or `NAME=VALUE` wherever rules are named (the daemon's config, `submit --alert`);
VALUE is its *setting*:

    oom              out of memory: a fatal OOM message in the output, or a kill by the kernel's OOM killer
    spike[=FACTOR]   the loss is NaN or infinite, or stays above FACTOR x its recent level (default 2, spikes.py)
    stall[=TIME]     no output (log or metrics) for TIME while the job runs (default 30m)
    failed           the job ended with a non-zero code or a signal
    done             the job succeeded
    lost             the job's supervisor vanished (the machine rebooted, the shim was killed)
    gpu-memory[=P%]  a GPU's memory above P% (default 90) for [alerts] gpu_memory_for (default 1m); the box's
                     rule, not a job's
    disk-full        the disk of the daemon's home (its database, every job's log) is full; the box's rule too
    storage          copying the job's checkpoints to object storage has failed for [storage] alert_after
                     (default 10m), or at once where the credentials are refused or the bucket is missing

All are on unless the daemon's config says otherwise; a job adds or tunes rules with `--alert` and drops them
with `--no-alert` (`--no-alert all` for none).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Optional, Protocol

from tfrun.duration import format_duration, parse_duration


class AlertConfig(Protocol):
    """What the alert path takes of the daemon's config: the box's name, its receivers, its rules and the
    metric patterns every job's log is read with. runner/config/settings.py's Config is one; the alert path
    never reads the rest of it (where jobs run, the content store, the Slurm settings)."""

    @property
    def name(self) -> Optional[str]: ...  # None: the machine's hostname

    @property
    def notify(self) -> list[str]: ...  # secret: the box's receivers' URLs

    @property
    def rules(self) -> dict[str, Optional[float]]: ...

    @property
    def gpu_memory_for(self) -> float: ...  # seconds above the gpu-memory threshold before it fires

    @property
    def metric_patterns(self) -> list[str]: ...


class RuleError(ValueError):
    """A rule that cannot be used; the message names it and says what is expected."""


@dataclass(frozen=True)
class Rule:
    name: str
    default: Optional[float]  # the setting when none is given; None for rules without one
    parse: Optional[Callable[[str], Optional[float]]] = None
    show: Callable[[float], str] = lambda value: f"{value:g}"
    expects: str = ""


def _factor(text: str) -> Optional[float]:
    try:
        value = float(text.rstrip("x"))
    except ValueError:
        return None
    return value if value > 1 else None


def _percent(text: str) -> Optional[float]:
    try:
        value = float(text.rstrip("%"))
    except ValueError:
        return None
    return value if 0 < value <= 100 else None


def _duration(text: str) -> Optional[float]:
    seconds = parse_duration(text)
    return seconds if seconds else None


RULES: dict[str, Rule] = {
    rule.name: rule
    for rule in (
        Rule("oom", None),
        Rule("spike", 2.0, _factor, expects="a factor above 1, such as 2 or 3x"),
        Rule("stall", 1800.0, _duration, format_duration, "a duration such as 30m or 2h"),
        Rule("failed", None),
        Rule("done", None),
        Rule("lost", None),
        Rule("gpu-memory", 90.0, _percent, lambda value: f"{value:g}%", "a percentage such as 90%"),
        Rule("disk-full", None),
        Rule("storage", None),
    )
}
BOX_RULES = ("gpu-memory", "disk-full")  # the box's own: set in the daemon's config, never by a job
JOB_RULES = tuple(name for name in RULES if name not in BOX_RULES)
ALL_RULES = "all"


def parse(text: str) -> tuple[str, Optional[float]]:
    """(rule name, its setting or None) from `NAME` or `NAME=VALUE`; RuleError when either is wrong."""
    name, has_value, value_text = text.strip().partition("=")
    rule = RULES.get(name.strip())
    if rule is None:
        raise RuleError(f"unknown alert rule {name.strip()!r}; the rules are: {', '.join(RULES)}")
    if not has_value:
        return rule.name, rule.default
    if rule.parse is None:
        raise RuleError(f"the alert rule {rule.name!r} takes no value")
    value = rule.parse(value_text.strip())
    if value is None:
        raise RuleError(f"{text.strip()!r}: {rule.name} takes {rule.expects}")
    return rule.name, value


def parse_all(texts: list[str]) -> dict[str, Optional[float]]:
    """Rules and their settings from their texts, such as ["oom", "stall=10m"]; later ones win."""
    return dict(parse(text) for text in texts)


def combine(daemon: dict[str, Optional[float]], on: list[str], off: list[str]) -> dict[str, Optional[float]]:
    """A job's rules: the daemon's, less those in `off` ("all" for every one), plus or retuned by `on`."""
    names = [name.strip() for name in off]
    for name in names:
        if name != ALL_RULES and name not in RULES:
            raise RuleError(f"unknown alert rule {name!r}; the rules are: {', '.join(RULES)}")
    rules = {} if ALL_RULES in names else {k: v for k, v in daemon.items() if k not in names}
    rules.update(parse_all(on))
    return rules


def texts(rules: dict[str, Optional[float]]) -> list[str]:
    """The rules' texts: ["oom", "stall=30m", ...], in the order of RULES."""
    out = []
    for name, rule in RULES.items():
        if name in rules:
            value = rules[name]
            out.append(name if value is None else f"{name}={rule.show(value)}")
    return out


DEFAULT_RULES: dict[str, Optional[float]] = {name: rule.default for name, rule in RULES.items()}
