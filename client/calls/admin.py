"""Calls on the daemon itself (tfrun/protocol/admin.py): its config, its checks of the box, its status."""

from __future__ import annotations

from typing import Optional

from tfrun.protocol.admin import (
    Check,
    ConfigReply,
    DaemonInfo,
    DaemonStatus,
    Doctor,
    DoctorReport,
    GetConfig,
    ReloadConfig,
    SetConfig,
)

from . import Call, whole


def config(secrets: bool = False) -> Call[ConfigReply, ConfigReply]:
    """The daemon's config as it uses it now; its URLs whole only with `secrets`."""
    return Call(GetConfig(secrets=secrets), whole)


def set_config(key: str, values: list[str]) -> Call[ConfigReply, ConfigReply]:
    """KEY set to VALUES in the box's config.toml, then reloaded; what changed."""
    return Call(SetConfig(key=key, values=values), whole)


def unset_config(key: str) -> Call[ConfigReply, ConfigReply]:
    """KEY removed from the box's config.toml (back to its default), then reloaded; what changed."""
    return Call(SetConfig(key=key, unset=True), whole)


def reload_config() -> Call[ConfigReply, ConfigReply]:
    """config.toml read again and used from now on, as SIGHUP does; what changed."""
    return Call(ReloadConfig(), whole)


def doctor(python: Optional[str] = None) -> Call[DoctorReport, list[Check]]:
    """The box's checks for training, with `python` as the job interpreter (None: the one jobs get)."""
    return Call(Doctor(python=python), lambda reply: reply.checks)


def daemon_status() -> Call[DaemonInfo, DaemonInfo]:
    """The daemon's pid, version, protocol, home and socket, when it started, and its jobs by state."""
    return Call(DaemonStatus(), whole)
