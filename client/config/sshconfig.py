"""`tfrun ssh-config`: the OpenSSH `Host` block that names a box, and its place in ~/.ssh/config.

One block serves plain `ssh`, VS Code Remote-SSH (which lists the Hosts of ~/.ssh/config) and tfrun itself
(asyncssh reads ~/.ssh/config too), so a box's address, user, port and key are written down once.
~/.ssh/config belongs to the user: only the lines between our marker comments are ever rewritten, everything
else is kept byte for byte, and a `Host NAME` the user wrote is never overridden.

Imports nothing heavy: `tfrun ssh-config` never connects, so it must start as fast as `tfrun --help`.
"""

from __future__ import annotations

import dataclasses
import os
import re
import shlex
import stat
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

from tfrun.constants import EXIT_USAGE
from tfrun.numerals import is_digits

from ..errors import TfrunError
from . import settings as config

# Keep an idle connection (a VS Code window, `logs -f` on a quiet job) from being dropped by a NAT or firewall
# that forgets silent flows, and notice a dead link after about two minutes instead of hanging. No
# ControlMaster: VS Code's Remote-SSH on Windows fails with it, and tfrun keeps its own connection anyway.
KEEPALIVE = (("ServerAliveInterval", "30"), ("ServerAliveCountMax", "4"), ("TCPKeepAlive", "yes"))

# A NAME is an alias that `ssh NAME`, VS Code and `tfrun --host NAME` must all take as it is: no pattern
# characters (* ? ! would make the Host line match other hosts), nothing ssh reads as user@, :port or an
# option (leading -), nothing that ends or splits the line (whitespace, #, quotes).
_BAD_NAME = re.compile(r'[\s*?!#"\'\\@:/,]|^-|[\x00-\x1f\x7f]')
# A value that cannot be written as one ssh_config argument, quoted or not.
_BAD_VALUE = re.compile(r'["\\\x00-\x1f\x7f]')
_MARKER = re.compile(r"^# (>>>|<<<) tfrun ssh-config (\S+) (>>>|<<<)$")


def begin_marker(name: str) -> str:
    return f"# >>> tfrun ssh-config {name} >>>"


def end_marker(name: str) -> str:
    return f"# <<< tfrun ssh-config {name} <<<"


def check_name(name: str) -> None:
    """Refuse a NAME that cannot be a plain ssh alias (see _BAD_NAME), or that tfrun reads otherwise."""
    if not name or _BAD_NAME.search(name):
        raise TfrunError(
            f"{name!r} cannot name an ssh host: no spaces, * ? ! # , quotes, @ : / or a leading -", EXIT_USAGE
        )
    if name == config.LOCAL:
        raise TfrunError(f"{name!r} cannot name an ssh host: `--host {name}` means this machine to tfrun", EXIT_USAGE)


@dataclass(frozen=True)
class Entry:
    """What one Host block says: where NAME leads, as who, with which key, through which jump hosts."""

    name: str
    hostname: str
    port: Optional[int] = None
    user: Optional[str] = None
    identity_file: Optional[str] = None
    jump: Optional[str] = None

    def lines(self) -> list[str]:
        """The block as ssh_config lines (no line ends): a comment, `Host NAME`, then its options."""
        options: list[tuple[str, str]] = [("HostName", self.hostname)]
        if self.port is not None:
            options.append(("Port", str(self.port)))
        if self.user:
            options.append(("User", self.user))
        if self.jump:
            options.append(("ProxyJump", self.jump))
        if self.identity_file:
            # IdentitiesOnly: offer only this key, not every key in the agent first (a server cuts a client
            # off after MaxAuthTries keys). `%` starts a token in IdentityFile, so a literal one is doubled.
            options.append(("IdentityFile", _quote(self.identity_file.replace("%", "%%"))))
            options.append(("IdentitiesOnly", "yes"))
        options.extend(KEEPALIVE)
        return [
            f"# Written by `tfrun ssh-config {self.name}`; run it again to change this block.",
            f"Host {self.name}",
            *(f"    {key} {value}" for key, value in options),
        ]

    def block(self) -> str:
        return "".join(line + "\n" for line in self.lines())


def _quote(value: str) -> str:
    """One ssh_config argument: double quotes around a value with spaces, which OpenSSH and asyncssh undo."""
    return f'"{value}"' if re.search(r"\s", value) else value


def _check_value(what: str, value: str, spaces: bool = False) -> None:
    """Refuse what cannot be written as one ssh_config argument (or could be read as an option)."""
    if not value or _BAD_VALUE.search(value) or value.startswith("-") or (not spaces and re.search(r"\s", value)):
        raise TfrunError(f"{what} {value!r} cannot be written to an ssh config", EXIT_USAGE)


def entry_for(
    name: str,
    destination: Optional[str],
    user: Optional[str] = None,
    port: Optional[int] = None,
    identity_file: Optional[str] = None,
    jump: Optional[str] = None,
) -> Entry:
    """The block `tfrun ssh-config NAME` makes: from DESTINATION, else from tfrun's host NAME (its destination,
    identity file and jump hosts), else, for a host that reaches NAME through the block already (after
    `--write`, or `tfrun hosts add NAME NAME`), from that block as written, so running the command again
    changes only what its options say. The options win over all of these."""
    if destination is not None:
        return make_entry(name, destination, user, port, identity_file, jump)
    hosts = config.load().hosts
    if name not in hosts:
        raise TfrunError(
            f"{name!r} is not a tfrun host (tfrun hosts list): give DESTINATION, e.g. tfrun ssh-config {name} "
            "tf@gpu-host:2222",
            EXIT_USAGE,
        )
    host = hosts[name]
    if host.destination != name:
        return make_entry(name, host.destination, user, port, identity_file or host.identity_file, jump or host.jump)
    written = read_entry(name)
    if written is None:  # a Host NAME of the user's own, or none at all
        raise TfrunError(
            f"tfrun's host {name} reaches {name} through ~/.ssh/config: give the box's address as DESTINATION",
            EXIT_USAGE,
        )
    hostname = f"[{written.hostname}]" if ":" in written.hostname else written.hostname
    return make_entry(
        name,
        hostname,
        user if user is not None else written.user,
        port if port is not None else written.port,
        identity_file if identity_file is not None else written.identity_file,
        jump if jump is not None else written.jump,
    )


def read_entry(name: str, path: Optional[Path] = None) -> Optional[Entry]:
    """NAME's block as `write` left it in the ssh config, or None where there is none (or it lost HostName)."""
    try:
        lines = (path or config_path()).read_text(errors="surrogateescape").split("\n")
    except OSError:
        return None
    start = next((i for i, line in enumerate(lines) if line.strip() == begin_marker(name)), None)
    if start is None:
        return None
    values: dict[str, str] = {}
    for line in lines[start + 1 :]:
        if line.strip() == end_marker(name):
            break
        keyword, args = _keyword(line)
        values.setdefault(keyword, args.strip())
    else:
        return None
    port = values.get("port", "")
    identity = values.get("identityfile")
    if identity:
        identity = identity[1:-1] if len(identity) > 1 and identity[0] == identity[-1] == '"' else identity
        identity = identity.replace("%%", "%")
    if not values.get("hostname"):
        return None
    return Entry(name, values["hostname"], int(port) if is_digits(port) else None, values.get("user"), identity,
                 values.get("proxyjump"))  # fmt: skip


def point_host_at_block(name: str) -> bool:
    """After `--write`: tfrun's host NAME, if there is one, reaches the box through the block just written,
    which now holds its address, user, port, key and jump hosts. One place for them, whichever of `hosts add`
    and `ssh-config --write` came first, so plain ssh, VS Code and tfrun can never disagree."""
    cfg = config.load()
    host = cfg.hosts.get(name)
    if host is None:
        return False
    cfg.hosts[name] = dataclasses.replace(host, destination=name, identity_file=None, jump=None)
    cfg.save()
    return True


def make_entry(
    name: str,
    destination: str,
    user: Optional[str] = None,
    port: Optional[int] = None,
    identity_file: Optional[str] = None,
    jump: Optional[str] = None,
) -> Entry:
    """The Entry for NAME at DESTINATION, --user and --port winning over what DESTINATION says; the identity
    file checked and written as `config.identity_path` says, the jump hosts as `config.check_jump` reads them.
    """
    check_name(name)
    try:
        dest_user, hostname, dest_port = config.parse_destination(destination)
    except TfrunError as exc:
        raise TfrunError(exc.message, EXIT_USAGE) from None
    _check_value("host", hostname)
    alias = _configured(hostname)  # `gpu-box`, a Host of the user's own: what it says, or the block loses it
    if alias:
        hostname = alias.get("hostname", hostname)
        dest_user = dest_user if dest_user is not None else alias.get("user")
        dest_port = dest_port if dest_port is not None else _port(alias.get("port"))
        identity_file = identity_file if identity_file is not None else alias.get("identityfile")
        jump = jump if jump is not None else alias.get("proxyjump")
        _check_value("host", hostname)  # what the user's block says is written into ours as one argument too
    user = user if user is not None else dest_user
    if user is not None:
        _check_value("user", user)
    if identity_file is not None:
        _check_value("identity file", identity_file, spaces=True)
    if identity_file is not None and not (alias and identity_file == alias.get("identityfile")):
        identity_file = config.identity_path(identity_file)
    if jump is not None:
        _check_value("jump host", config.check_jump(jump))
    return Entry(name, hostname, port if port is not None else dest_port, user, identity_file, jump)


_ALIAS_OPTIONS = ("hostname", "port", "user", "identityfile", "proxyjump")


def _configured(hostname: str) -> dict[str, str]:
    """What the user's ssh config says of `hostname` where a Host block of theirs names it (`Host gpu-box` with
    its HostName, Port, User, IdentityFile, ProxyJump): OpenSSH's own reading (`ssh -G`, which connects to
    nothing), less what it would use for a name no block names. A block that says `HostName gpu-box` would
    otherwise lose the rest: ssh does not read the config again for a HostName. {} where the config says
    nothing of it, or there is no ssh to ask (then the block is written as given)."""
    path = config_path()
    if not path.is_file():
        return {}
    said, plain = _ssh_reading(hostname, str(path)), _ssh_reading(hostname, os.devnull)
    if said is None or plain is None:
        return {}
    return {key: value for key, value in said.items() if value != plain.get(key)}


def _ssh_reading(hostname: str, config_file: str) -> Optional[dict[str, str]]:
    """`ssh -G -F FILE HOST`'s first value of each of _ALIAS_OPTIONS (a later `identityfile` is a default's)."""
    import subprocess  # only where a destination is read: `tfrun ssh-config --help` starts without it

    try:
        done = subprocess.run(
            ["ssh", "-G", "-F", config_file, "--", hostname],
            capture_output=True,
            text=True,
            timeout=10,
            stdin=subprocess.DEVNULL,
        )
    except (OSError, subprocess.SubprocessError):
        return None
    if done.returncode != 0:
        return None
    found: dict[str, str] = {}
    for line in done.stdout.splitlines():
        key, _, value = line.partition(" ")
        if key.lower() in _ALIAS_OPTIONS and value and value != "none":
            found.setdefault(key.lower(), value)
    return found


def _port(text: Optional[str]) -> Optional[int]:
    return int(text) if text is not None and is_digits(text) and len(text) <= 5 else None


def config_path() -> Path:
    """The user's ssh config: the one file plain ssh, VS Code and asyncssh all read by default."""
    return Path.home() / ".ssh" / "config"


def write(entry: Entry, path: Optional[Path] = None) -> Path:
    """Put `entry`'s block into the ssh config between its markers; return the file written.

    A block written before for the same name is replaced where it stands, so writing twice changes nothing.
    Otherwise the block goes at the very top: ssh takes the first value it finds for each option, so a
    `Host *` further down must not win over it. A `Host` line of the user's own for the same name is an
    error, never overridden. A symlinked config is written where it points, so dotfile managers keep
    working. The new file replaces the old one in one rename, keeping its permissions (new: 0600, in a
    0700 ~/.ssh), so a crash leaves either file whole.
    """
    path = path or config_path()
    folder = path.parent
    try:
        if not folder.exists() and not folder.is_symlink():
            folder.mkdir(mode=0o700)
            folder.chmod(0o700)  # whatever the umask: ssh refuses keys in a folder others can write
        target = path.resolve() if path.is_symlink() else path
        try:
            old: Optional[bytes] = target.read_bytes()
            mode = stat.S_IMODE(target.stat().st_mode)
        except FileNotFoundError:
            old, mode = None, 0o600
    except (OSError, RuntimeError) as exc:  # RuntimeError: a symlink loop, before Python 3.13
        raise TfrunError(f"cannot open {path}: {getattr(exc, 'strerror', None) or exc}", EXIT_USAGE) from None
    # surrogateescape: bytes that are not UTF-8 come back out exactly as they went in.
    text = (old or b"").decode("utf-8", "surrogateescape")
    new = merge(text, entry, str(path)).encode("utf-8", "surrogateescape")
    if new == old:
        return target
    tmp: Optional[str] = None
    try:
        fd, tmp = tempfile.mkstemp(dir=target.parent, prefix=f".{target.name}.", suffix=".tfrun-tmp")
        with os.fdopen(fd, "wb") as file:
            file.write(new)
            file.flush()
            os.fchmod(file.fileno(), mode)
            os.fsync(file.fileno())
        os.replace(tmp, target)
    except OSError as exc:
        if tmp is not None:
            Path(tmp).unlink(missing_ok=True)
        raise TfrunError(f"cannot write {target}: {exc.strerror or exc}", EXIT_USAGE) from None
    return target


def merge(text: str, entry: Entry, where: str = "ssh config") -> str:
    """`text` (an ssh config) with `entry`'s managed block in it; see `write`. `where` names it in errors."""
    lines = text.split("\n")  # joined back with "\n", the text is exactly what it was
    cr = "\r" if "\n" in text and text.count("\n") == text.count("\r\n") else ""  # a CRLF file gets CRLF lines
    name = entry.name
    start = next((i for i, line in enumerate(lines) if line.strip() == begin_marker(name)), None)
    end = None
    if start is not None:
        end = next((i for i in range(start + 1, len(lines)) if lines[i].strip() == end_marker(name)), None)
        if end is None:
            raise TfrunError(
                f"{where}:{start + 1}: `{begin_marker(name)}` has no `{end_marker(name)}` after it; "
                "mend or remove the block by hand",
                EXIT_USAGE,
            )
    clash = user_host_line(lines, name)
    if clash is not None:
        raise TfrunError(
            f"{where}:{clash + 1}: a `Host {name}` of your own is there already (not written by tfrun "
            f"ssh-config); remove it, or choose another NAME",
            EXIT_USAGE,
        )
    following = lines[end + 1 :] if end is not None else lines
    block = [begin_marker(name), *entry.lines()]
    if _has_global_options(following):
        # Lines before a file's first Host apply to every host. Below our block they would apply to NAME only,
        # so the block ends by opening a `Host *` that gives them back to every host.
        block += ["# (what follows applies to every host again)", "Host *"]
    block = [line + cr for line in [*block, end_marker(name)]]
    if start is not None and end is not None:
        return "\n".join([*lines[:start], *block, *lines[end + 1 :]])
    if not text:
        return "\n".join([*block, ""])
    return "\n".join([*block, cr, text])  # the block, a blank line, then the file as it was


def _keyword(line: str) -> tuple[str, str]:
    """(lower-case keyword, its arguments) of an ssh_config line; ("", "") for a blank or comment line.

    ssh_config separates a keyword from its arguments with spaces or one `=`.
    """
    stripped = line.strip()
    if not stripped or stripped.startswith("#"):
        return "", ""
    match = re.match(r"([^\s=]+)\s*=?\s*(.*)$", stripped)
    assert match is not None  # a non-blank line always has a first word
    return match[1].lower(), match[2]


def user_host_line(lines: list[str], name: str) -> Optional[int]:
    """The index of the first `Host` line outside our managed blocks with exactly `name` among its patterns."""
    managed = _managed(lines)
    for index, line in enumerate(lines):
        keyword, args = _keyword(line)
        if keyword != "host" or index in managed:
            continue
        try:
            patterns = shlex.split(args)
        except ValueError:  # an unbalanced quote: ssh refuses the file anyway; read it as plain words
            patterns = args.split()
        if name in patterns:
            return index
    return None


def _managed(lines: list[str]) -> set[int]:
    """Indexes of the lines inside our blocks (any name's), markers included. A begin marker without its end
    is only a comment: what follows it is the user's."""
    inside: set[int] = set()
    index = 0
    while index < len(lines):
        marker = _MARKER.match(lines[index].strip())
        if marker and marker[1] == ">>>":
            end = end_marker(marker[2])
            close = next((i for i in range(index + 1, len(lines)) if lines[i].strip() == end), None)
            if close is not None:
                inside.update(range(index, close + 1))
                index = close
        index += 1
    return inside


def _has_global_options(lines: list[str]) -> bool:
    """Whether `lines` start with options that are not under any Host or Match (they apply to every host)."""
    for line in lines:
        keyword, _ = _keyword(line)
        if keyword in ("host", "match"):
            return False
        if keyword:
            return True
    return False
