"""The daemon itself: its status and shutdown, its config, its disk use, and `tfrun doctor`'s checks."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Annotated, Optional

from tfrun.constants import (
    MAX_CONFIG_VALUES,
    MAX_NAME,
    MAX_STRING,
)
from tfrun.protocol.fields import UTF8, Limit, OsText, Text
from tfrun.protocol.wire import Message, Ok, Request, tagged


@tagged("daemon_info")
@dataclass
class DaemonInfo(Message):
    pid: int
    version: str
    protocol: int
    home: str
    socket: str
    started_at: float
    jobs: dict[str, int]  # count of jobs by state


@dataclass
class Setting:
    """One key of the daemon's config as it is in use."""

    key: str  # "notify", or "alerts.cooldown" for a key in a table
    value: str  # JSON; URLs masked past scheme and host, unless the request asked for secrets
    source: str  # "config.toml", "default" (or how the default is found), or the variable that overrides the file


@tagged("config")
@dataclass
class ConfigReply(Message):
    path: str  # the daemon's config.toml
    settings: list[Setting]
    changes: list[str] = field(default_factory=list)  # after a reload: each key that changed, and from when


@dataclass
class Check:
    """One line of `tfrun doctor`: `status` is "ok", "warn" (works, but see `advice`) or "fail"."""

    name: str
    status: str
    detail: str
    advice: Optional[str] = None


@tagged("doctor_report")
@dataclass
class DoctorReport(Message):
    checks: list[Check]


@tagged("doctor")
@dataclass
class Doctor(Request[DoctorReport]):
    """Check the box's health for training (runner/doctor.py); answered by `DoctorReport`.
    `python`: the job interpreter to check (default: the one jobs get)."""

    python: Optional[OsText] = None


@tagged("daemon_status")
@dataclass
class DaemonStatus(Request[DaemonInfo]):
    """Ask for `DaemonInfo`."""


@tagged("daemon_key")
@dataclass
class DaemonKey(Message):
    """The daemon's key, as hex: a secret (tfrun/protocol/proof.py). Only the daemon's own user reaches its
    socket; the client keeps it in its private cache and never prints it."""

    key: str


@tagged("get_daemon_key")
@dataclass
class GetDaemonKey(Request[DaemonKey]):
    """Ask for the key with which the daemon proves, on a remembered socket path, that it is the user's own
    (asked through the exec channel only, whose far end runs as the user); answered by `DaemonKey`."""


@tagged("shutdown")
@dataclass
class Shutdown(Request[Ok]):
    """Stop the daemon. Jobs keep running; the next daemon re-adopts them."""


@tagged("get_config")
@dataclass
class GetConfig(Request[ConfigReply]):
    """The daemon's config as it uses it now, its URLs masked past scheme and host unless `secrets` (`tfrun
    config --show-secrets`: only the daemon's own user reaches its socket); answered by `ConfigReply`."""

    secrets: bool = False


@tagged("reload_config")
@dataclass
class ReloadConfig(Request[ConfigReply]):
    """Read config.toml again and use it from now on, as SIGHUP does; answered by `ConfigReply` with what
    changed. A file the daemon cannot use is refused with an `Error`, and the running config stays."""


@tagged("set_config")
@dataclass
class SetConfig(Request[ConfigReply]):
    """Set `key` ("notify", "alerts.cooldown") in config.toml to `values` (one word, or a list's items), or
    remove it with `unset`: the would-be file is loaded first, then only the key's lines are rewritten (every
    comment stays), then it is reloaded. Answered by `ConfigReply` with what changed. `values` may hold
    notify URLs: secret, never echoed."""

    key: Annotated[str, UTF8, Limit(chars=MAX_NAME)]
    values: Annotated[list[Text], Limit(items=MAX_CONFIG_VALUES, chars=MAX_STRING)] = field(default_factory=list)
    unset: bool = False
