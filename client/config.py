"""The client's configuration: the boxes it knows, in TOML at $XDG_CONFIG_HOME/tfrun/config.toml.

default_host = "box"
reconnect_timeout = "10m"              # how long wait and logs -f keep trying to reach a daemon (default 5m)

[hosts.box]
destination = "alice@gpu-box:2222"     # anything ssh accepts; ~/.ssh/config applies
tfrund = "/opt/tfrund/bin/tfrund"      # the daemon's command on the box (default: tfrund)
python = "/usr/bin/python3"            # the job interpreter there (default: the daemon's)
accept_new_host_key = false            # like StrictHostKeyChecking=accept-new
env = { TFRUN_HOME = "/data/tfrun" }   # for the daemon: several can share a box
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional

import tomli_w

from tfrun.client.errors import TfrunError
from tfrun.constants import DEFAULT_RECONNECT_TIMEOUT_S, EXIT_DAEMON, EXIT_USAGE
from tfrun.duration import format_duration, parse_duration

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - exercised on 3.9 and 3.10
    import tomli as tomllib

LOCAL = "local"  # `--host local` picks the daemon on this machine even when a default host is set
RECONNECT_ENV = "TFRUN_RECONNECT_TIMEOUT"
_DESTINATION = re.compile(r"^(?:ssh://)?(?:(?P<user>[^@/]+)@)?(?P<host>\[[^\]]+\]|[^:/@]+)(?::(?P<port>\d+))?/?$")


def parse_destination(destination: str) -> tuple[Optional[str], str, Optional[int]]:
    """(user, host, port) from `host`, `user@host`, `user@host:port` or `ssh://user@host:port`.

    Here rather than in ssh.py, which imports asyncssh: `tfrun ssh-config` reads destinations too and
    must start as fast as the other verbs that never connect.
    """
    match = _DESTINATION.match(destination)
    if not match:
        raise TfrunError(f"cannot read {destination!r} as an ssh destination (user@host:port)", EXIT_DAEMON)
    port = int(match["port"]) if match["port"] else None
    return match["user"], match["host"].strip("[]"), port


@dataclass
class Host:
    """A box to run jobs on: a name from the config, or an ssh destination used as it is."""

    destination: str
    name: Optional[str] = None
    tfrund: str = "tfrund"
    python: Optional[str] = None
    accept_new_host_key: bool = False
    env: dict[str, str] = field(default_factory=dict)

    @property
    def label(self) -> str:
        return self.name or self.destination

    @property
    def identity(self) -> str:
        """What identifies one daemon on one box: where, which tfrund, with which environment."""
        return json.dumps([self.destination, self.tfrund, sorted(self.env.items())])

    def as_toml(self) -> dict[str, Any]:
        table: dict[str, Any] = {"destination": self.destination}
        if self.tfrund != "tfrund":
            table["tfrund"] = self.tfrund
        if self.python:
            table["python"] = self.python
        if self.accept_new_host_key:
            table["accept_new_host_key"] = True
        if self.env:
            table["env"] = dict(self.env)
        return table


@dataclass
class ClientConfig:
    path: Path
    default_host: Optional[str] = None
    hosts: dict[str, Host] = field(default_factory=dict)
    reconnect_timeout: Optional[float] = None  # seconds; None: TFRUN_RECONNECT_TIMEOUT or the default

    def save(self) -> None:
        data: dict[str, Any] = {}
        if self.default_host:
            data["default_host"] = self.default_host
        if self.reconnect_timeout is not None:
            data["reconnect_timeout"] = format_duration(self.reconnect_timeout)
        data["hosts"] = {name: host.as_toml() for name, host in sorted(self.hosts.items())}
        self.path.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.path.with_name(self.path.name + ".tmp")
        tmp.write_text(tomli_w.dumps(data))
        os.replace(tmp, self.path)


def config_path() -> Path:
    explicit = os.environ.get("TFRUN_CONFIG")
    if explicit:
        return Path(explicit).expanduser()
    base = os.environ.get("XDG_CONFIG_HOME") or str(Path.home() / ".config")
    return Path(base).expanduser() / "tfrun" / "config.toml"


def load() -> ClientConfig:
    """The config, or an empty one if the file does not exist; a broken file is a one-line error."""
    path = config_path()
    try:
        raw = tomllib.loads(path.read_text())
    except FileNotFoundError:
        return ClientConfig(path)
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError) as exc:
        raise TfrunError(f"{path}: {exc}", EXIT_USAGE) from None
    config = ClientConfig(path, default_host=_string(raw, "default_host", path))
    if "reconnect_timeout" in raw:
        config.reconnect_timeout = _duration(raw["reconnect_timeout"], f"{path}: reconnect_timeout")
    hosts = raw.get("hosts", {})
    if not isinstance(hosts, dict):
        raise TfrunError(f"{path}: [hosts] must be a table", EXIT_USAGE)
    for name, table in hosts.items():
        if not isinstance(table, dict) or not isinstance(table.get("destination"), str):
            raise TfrunError(f'{path}: hosts.{name} needs destination = "user@host"', EXIT_USAGE)
        env = table.get("env", {})
        if not isinstance(env, dict) or not all(isinstance(v, str) for v in env.values()):
            raise TfrunError(f"{path}: hosts.{name}.env must map names to strings", EXIT_USAGE)
        config.hosts[name] = Host(
            destination=table["destination"],
            name=name,
            tfrund=_string(table, "tfrund", path) or "tfrund",
            python=_string(table, "python", path),
            accept_new_host_key=bool(table.get("accept_new_host_key", False)),
            env=dict(env),
        )
    return config


def _string(table: dict[str, Any], key: str, path: Path) -> Optional[str]:
    value = table.get(key)
    if value is not None and not isinstance(value, str):
        raise TfrunError(f"{path}: {key} must be a string", EXIT_USAGE)
    return value


def _duration(value: Any, where: str) -> float:
    """Seconds from a duration as people write it (`90s`, `5m`, `1h`) or a plain number of seconds."""
    seconds = value
    if isinstance(value, str):
        seconds = parse_duration(value)
        if seconds is None:
            with contextlib.suppress(ValueError):  # plain seconds, as in TFRUN_RECONNECT_TIMEOUT=600
                seconds = float(value)
    if isinstance(seconds, bool) or not isinstance(seconds, (int, float)) or not 0 < seconds < float("inf"):
        raise TfrunError(f"{where} must be a duration such as 90s, 5m or 1h, not {value!r}", EXIT_USAGE)
    return float(seconds)


def reconnect_timeout(config: ClientConfig) -> float:
    """How long a client that lost its daemon keeps trying to reach one: TFRUN_RECONNECT_TIMEOUT, else the
    config's reconnect_timeout, else 5 minutes. Long on purpose: a daemon restarted by a supervisor or a box
    rebooting takes a while, and giving up is what leaves a script believing a live job failed."""
    text = os.environ.get(RECONNECT_ENV)
    if text:
        return _duration(text, RECONNECT_ENV)
    return DEFAULT_RECONNECT_TIMEOUT_S if config.reconnect_timeout is None else config.reconnect_timeout


def resolve(option: Optional[str], config: ClientConfig) -> Optional[Host]:
    """The host a verb talks to: --host (or TFRUN_HOST), else the default host; None for the local daemon."""
    name = option or config.default_host
    if not name or name == LOCAL:
        return None
    if name in config.hosts:
        return config.hosts[name]
    return Host(destination=name)
