"""The client's configuration: the boxes it knows, in TOML at $XDG_CONFIG_HOME/tfrun/config.toml.

default_host = "box"                   # the host of a verb given no --host nor TFRUN_HOST (--host local: here)
reconnect_timeout = "10m"              # how long wait and logs -f keep trying to reach a daemon (default 5m)
confirm_upload_bytes = "1GB"           # on a terminal, submit asks before sending more than this (0: never)
pool_timeout = "5s"                    # how long a pool verb waits for each box (default 5s)

[hosts.box]
destination = "alice@gpu-box:2222"     # anything ssh accepts; ~/.ssh/config applies
identity_file = "~/.ssh/id_box"        # the key to log in with (default: ~/.ssh/config's, the agent's)
jump = "me@bastion:22"                 # reached through these hosts in turn, like ssh -J (ProxyJump)
tfrund = "/opt/tfrund/bin/tfrund"      # the daemon's command on the box (default: tfrund)
python = "/usr/bin/python3"            # the job interpreter there (default: the daemon's)
accept_new_host_key = false            # like StrictHostKeyChecking=accept-new
env = { TFRUN_HOME = "/data/tfrun" }   # for the daemon: several can share a box
pools = ["gpu"]                        # `--host gpu` means every host of pool gpu (client/pools/members.py)

[pools.gpu]
checkpoints_to = "s3://bucket/ckpt"    # a submit to pool gpu copies checkpoints there (unless --checkpoints-to)
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import sys
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import TYPE_CHECKING, Any, Optional

from tfrun.constants import DEFAULT_CONFIRM_UPLOAD_BYTES, DEFAULT_RECONNECT_TIMEOUT_S, EXIT_USAGE
from tfrun.duration import format_duration, parse_duration
from tfrun.sizes import parse_size

from ..errors import TfrunError
from . import privatefiles

if TYPE_CHECKING:
    from tfrun import tomltext


LOCAL = "local"  # `--host local` picks the daemon on this machine even when a default host is set
ALL_HOSTS = "all"  # `--host all`: every configured host, as a pool (client/pools/members.py)
RECONNECT_ENV = "TFRUN_RECONNECT_TIMEOUT"
_DESTINATION = re.compile(r"^(?:ssh://)?(?:(?P<user>[^@/]+)@)?(?P<host>\[[^\]]+\]|[^:/@]+)(?::(?P<port>\d+))?/?$")


def parse_destination(destination: str) -> tuple[Optional[str], str, Optional[int]]:
    """(user, host, port) from `host`, `user@host`, `user@host:port` or `ssh://user@host:port`.

    Here rather than in ssh.py, which imports asyncssh: `tfrun ssh-config` reads destinations too and
    must start as fast as the other verbs that never connect.
    """
    match = _DESTINATION.match(destination)
    if not match:
        raise TfrunError(f"cannot read {destination!r} as an ssh destination (user@host:port)", EXIT_USAGE)
    port = int(match["port"]) if match["port"] else None
    return match["user"], match["host"].strip("[]"), port


def identity_path(path: str) -> str:
    """An identity file as it will be written down: it must exist now (a typo would otherwise only show as a
    refused login later); kept as given, `~` included, so it still reads right in a dotfiles repository; a
    relative path made absolute, since ssh would read it from whatever folder it is started in."""
    if not Path(path).expanduser().is_file():
        raise TfrunError(f"identity file {path} does not exist", EXIT_USAGE)
    return path if path.startswith("~") or os.path.isabs(path) else os.path.abspath(path)


def check_jump(jump: str) -> str:
    """`--jump` as given, once each comma-separated hop reads as an ssh destination (ProxyJump's form)."""
    for hop in jump.split(","):
        try:
            if not hop or re.search(r"\s", hop):
                raise TfrunError("", EXIT_USAGE)
            parse_destination(hop)
        except TfrunError:
            raise TfrunError(f"cannot read {hop!r} as a jump host (user@host[:port][,...])", EXIT_USAGE) from None
    return jump


@dataclass
class Host:
    """A box to run jobs on: a name from the config, or an ssh destination used as it is."""

    destination: str
    name: Optional[str] = None
    tfrund: str = "tfrund"
    python: Optional[str] = None
    accept_new_host_key: bool = False
    env: dict[str, str] = field(default_factory=dict)
    identity_file: Optional[str] = None
    jump: Optional[str] = None  # user@host[:port][,...], as ssh -J takes it
    pools: list[str] = field(default_factory=list)  # the pools it is a member of (`hosts add --pool`)

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
        if self.identity_file:
            table["identity_file"] = self.identity_file
        if self.jump:
            table["jump"] = self.jump
        if self.pools:
            table["pools"] = list(self.pools)
        return table


@dataclass
class PoolSettings:
    """A pool's defaults for the verbs sent to it (`[pools.NAME]`)."""

    checkpoints_to: Optional[str] = None  # submit --checkpoints-to for a submit to the pool that gives none

    def as_toml(self) -> dict[str, Any]:
        return {f.name: getattr(self, f.name) for f in fields(self) if getattr(self, f.name) is not None}


@dataclass
class ClientConfig:
    path: Path
    default_host: Optional[str] = None
    hosts: dict[str, Host] = field(default_factory=dict)
    reconnect_timeout: Optional[float] = None  # seconds; None: TFRUN_RECONNECT_TIMEOUT or the default
    confirm_upload_bytes: Optional[int] = None  # None: DEFAULT_CONFIRM_UPLOAD_BYTES
    pool_timeout: Optional[float] = None  # seconds; None: TFRUN_POOL_TIMEOUT or the default (client/pools/members.py)
    pools: dict[str, PoolSettings] = field(default_factory=dict)  # [pools.NAME]: a pool's defaults

    def save(self) -> None:
        data: dict[str, Any] = {}
        if self.default_host:
            data["default_host"] = self.default_host
        if self.reconnect_timeout is not None:
            data["reconnect_timeout"] = format_duration(self.reconnect_timeout)
        if self.confirm_upload_bytes is not None:
            data["confirm_upload_bytes"] = self.confirm_upload_bytes
        if self.pool_timeout is not None:
            data["pool_timeout"] = format_duration(self.pool_timeout)
        data["hosts"] = {name: host.as_toml() for name, host in sorted(self.hosts.items())}
        if self.pools:
            data["pools"] = {name: pool.as_toml() for name, pool in sorted(self.pools.items())}
        import tomli_w  # here, not above: every verb reads this file, few write it

        privatefiles.write(self.path, tomli_w.dumps(data).encode(), own_folder=_in_own_folder())


def config_path() -> Path:
    """$TFRUN_CONFIG, else config.toml in tfrun's folder of $XDG_CONFIG_HOME (~/.config/tfrun)."""
    explicit = os.environ.get("TFRUN_CONFIG")
    if explicit:
        return Path(explicit).expanduser()
    base = os.environ.get("XDG_CONFIG_HOME") or str(Path.home() / ".config")
    return Path(base).expanduser() / "tfrun" / "config.toml"


def _in_own_folder() -> bool:
    """Whether the config lives in tfrun's own folder, which is kept 0700 (client/config/privatefiles.py); a file
    TFRUN_CONFIG names is kept 0600 in a folder of the user's choosing, whose mode is the user's business."""
    return not os.environ.get("TFRUN_CONFIG")


def load() -> ClientConfig:
    """The config, or an empty one if the file does not exist; a broken file is a one-line error. It holds
    the hosts' --env values: only the user's own file is read (a link is followed, for dotfiles, to a file
    of the user's), and one readable by others is made 0600 first (client/config/privatefiles.py)."""
    path = config_path()
    data = privatefiles.read(path, follow=True, own_folder=_in_own_folder())
    if data is None:
        return ClientConfig(path)
    try:
        text = data.decode()
    except UnicodeDecodeError as exc:
        raise TfrunError(f"{path}: {exc}", EXIT_USAGE) from None
    # imported here: with no config file, a verb never pays for the TOML parser
    from tfrun import tomltext

    if sys.version_info >= (3, 11):
        import tomllib
    else:  # pragma: no cover - exercised on 3.9 and 3.10
        import tomli as tomllib
    try:
        raw = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise TfrunError(tomltext.decode_error(str(path), exc, text), EXIT_USAGE) from None
    unknown = tomltext.unknown_key(str(path), text, raw, _schema()) or tomltext.nul_byte(str(path), text, raw)
    if unknown:
        raise TfrunError(unknown, EXIT_USAGE)
    config = ClientConfig(path, default_host=_string(raw, "default_host", path))
    if "reconnect_timeout" in raw:
        config.reconnect_timeout = duration(raw["reconnect_timeout"], f"{path}: reconnect_timeout")
    for key in (OLD_POOL_TIMEOUT_KEY, "pool_timeout"):  # the old name, then the one that wins
        if key in raw:
            config.pool_timeout = duration(raw[key], f"{path}: {key}")
    if "confirm_upload_bytes" in raw:
        config.confirm_upload_bytes = parse_size(raw["confirm_upload_bytes"])
        if config.confirm_upload_bytes is None:
            raise TfrunError(
                f"{path}: confirm_upload_bytes must be a size such as 1GB or 500MB (0: never ask)", EXIT_USAGE
            )
    hosts = raw.get("hosts", {})
    if not isinstance(hosts, dict):
        raise TfrunError(f"{path}: [hosts] must be a table", EXIT_USAGE)
    for name, table in hosts.items():
        if not isinstance(table, dict) or not isinstance(table.get("destination"), str):
            raise TfrunError(f'{path}: hosts.{name} needs destination = "user@host"', EXIT_USAGE)
        env = table.get("env", {})
        if not isinstance(env, dict) or not all(isinstance(v, str) for v in env.values()):
            raise TfrunError(f"{path}: hosts.{name}.env must map names to strings", EXIT_USAGE)
        pools = table.get("pools", [])
        if not isinstance(pools, list) or not all(isinstance(pool, str) for pool in pools):
            raise TfrunError(f'{path}: hosts.{name}.pools must be a list of names, e.g. ["gpu"]', EXIT_USAGE)
        config.hosts[name] = Host(
            destination=table["destination"],
            name=name,
            tfrund=_string(table, "tfrund", path) or "tfrund",
            python=_string(table, "python", path),
            accept_new_host_key=bool(table.get("accept_new_host_key", False)),
            env=dict(env),
            identity_file=_string(table, "identity_file", path),
            jump=_string(table, "jump", path),
            pools=list(pools),
        )
    config.pools = _pools(raw, path)
    return config


def _pools(raw: dict[str, Any], path: Path) -> dict[str, PoolSettings]:
    """The [pools.NAME] tables, each destination checked as submit --checkpoints-to checks it."""
    from tfrun.storage import place

    tables = raw.get("pools", {})
    if not isinstance(tables, dict) or not all(isinstance(t, dict) for t in tables.values()):
        raise TfrunError(f"{path}: [pools] must hold a table a pool, e.g. [pools.gpu]", EXIT_USAGE)
    found = {}
    for name, table in tables.items():
        destination = _string(table, "checkpoints_to", path)
        if destination:
            try:
                destination = place.parse(destination).url
            except place.PlaceError as exc:
                raise TfrunError(f"{path}: pools.{name}.checkpoints_to: {exc}", EXIT_USAGE) from None
        found[name] = PoolSettings(checkpoints_to=destination or None)
    return found


def _schema() -> tomltext.Schema:
    """The keys the file may hold, from the fields of ClientConfig and Host: a setting is known as soon as it
    has a field, and anything else (a typo such as `pyhton`) is named with its line."""
    from tfrun import tomltext

    host: tomltext.Schema = {f.name: None for f in fields(Host) if f.name != "name"}
    host["env"] = tomltext.ANY  # the daemon's environment: any names
    top: tomltext.Schema = {f.name: None for f in fields(ClientConfig) if f.name not in ("path", "hosts", "pools")}
    top[OLD_POOL_TIMEOUT_KEY] = None
    top["hosts"] = {tomltext.ANY: host}
    top["pools"] = {tomltext.ANY: {f.name: None for f in fields(PoolSettings)}}
    return top


def _string(table: dict[str, Any], key: str, path: Path) -> Optional[str]:
    value = table.get(key)
    if value is not None and not isinstance(value, str):
        raise TfrunError(f"{path}: {key} must be a string", EXIT_USAGE)
    return value


MAX_CLIENT_DURATION_S = 365 * 86400
OLD_POOL_TIMEOUT_KEY = "fleet_timeout"  # pool_timeout's name before tfrun said "pool" everywhere: still read


def duration(value: Any, where: str) -> float:
    """Seconds from a duration as people write it (`90s`, `5m`, `1h`) or a plain number of seconds."""
    seconds = value
    if isinstance(value, str):
        seconds = parse_duration(value)
        if seconds is None:
            with contextlib.suppress(ValueError):  # plain seconds, as in TFRUN_RECONNECT_TIMEOUT=600
                seconds = float(value)
    if isinstance(seconds, bool) or not isinstance(seconds, (int, float)) or not 0 < seconds < float("inf"):
        raise TfrunError(f"{where} must be a duration such as 90s, 5m or 1h, not {value!r}", EXIT_USAGE)
    if seconds > MAX_CLIENT_DURATION_S:  # a timer that long is a typo, and the OS's timers overflow on some
        raise TfrunError(f"{where} must be at most 365d, not {value!r}", EXIT_USAGE)
    return float(seconds)


def confirm_upload_bytes(config: ClientConfig) -> int:
    """Above how many bytes to send `submit` asks first, on a terminal: the config's, else 1 GB."""
    return DEFAULT_CONFIRM_UPLOAD_BYTES if config.confirm_upload_bytes is None else config.confirm_upload_bytes


def reconnect_timeout(config: ClientConfig) -> float:
    """How long a client that lost its daemon keeps trying to reach one: TFRUN_RECONNECT_TIMEOUT, else the
    config's reconnect_timeout, else 5 minutes. Long on purpose: a daemon restarted by a supervisor or a box
    rebooting takes a while, and giving up is what leaves a script believing a live job failed."""
    text = os.environ.get(RECONNECT_ENV)
    if text:
        return duration(text, RECONNECT_ENV)
    return DEFAULT_RECONNECT_TIMEOUT_S if config.reconnect_timeout is None else config.reconnect_timeout


def resolve(option: Optional[str], config: ClientConfig) -> Optional[Host]:
    """The host a verb talks to: --host (or TFRUN_HOST), else the default host; None for the local daemon."""
    name = option or config.default_host
    if not name or name == LOCAL:
        return None
    if name in config.hosts:
        return config.hosts[name]
    parse_destination(name)  # one ssh cannot read is bad input, said here: past here it would read as unreachable
    return Host(destination=name)


def pools(config: ClientConfig) -> dict[str, list[Host]]:
    """Each pool the hosts name, with its members in name order; `all` is every host."""
    found: dict[str, list[Host]] = {}
    for _, host in sorted(config.hosts.items()):
        for pool in host.pools:
            found.setdefault(pool, []).append(host)
    return found


def pool_members(name: Optional[str], config: ClientConfig) -> Optional[list[Host]]:
    """The members of pool `name` (`all`: every configured host), or None when `name` names no pool."""
    if name == ALL_HOSTS:
        return [host for _, host in sorted(config.hosts.items())]
    if name is None or name in config.hosts:
        return None
    return pools(config).get(name)
