"""Which host keys vouch for a box: every known_hosts file OpenSSH would read for it, as OpenSSH names them.

asyncssh reads only ~/.ssh/known_hosts unless told otherwise, and the files ~/.ssh/config names as they are
written (no %-tokens expanded), and `UserKnownHostsFile none` makes it trust any key without a word. OpenSSH
reads the user files (UserKnownHostsFile: ~/.ssh/known_hosts and known_hosts2 by default; ~, ${VAR} and the
%-tokens expanded) and the global ones (GlobalKnownHostsFile: /etc/ssh/ssh_known_hosts and
ssh_known_hosts2). A key an admin pinned in /etc/ssh, or a user in a file of their own, is a key tfrun must
keep too: a connection trusts exactly what those files vouch for, a key they pin differently for the host is
a changed key (never accepted, accept-new or not), and accept-new writes where ssh would, the first user file.
Where there is none (`UserKnownHostsFile none` or /dev/null), a key tfrun would accept could not be kept, so
every connection would trust whoever answers: tfrun refuses to accept one, and says why.
"""

from __future__ import annotations

import contextlib
import getpass
import hashlib
import os
import re
import socket
import stat
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional

import asyncssh

from tfrun.constants import EXIT_DAEMON, SSH_GLOBAL_KNOWN_HOSTS, SSH_USER_KNOWN_HOSTS

from ..errors import TfrunError

_TOKEN = re.compile(r"%(.)")
_VARIABLE = re.compile(r"\$\{(\w+)\}")


@dataclass(frozen=True)
class KnownHostsFiles:
    """The known_hosts files for one destination: the user's (accept-new writes to the first; none: there is
    nowhere to keep a key) and the global ones, expanded as OpenSSH expands them."""

    user: tuple[Path, ...]
    system: tuple[Path, ...]

    @property
    def keeps_keys(self) -> bool:
        """Whether a key accepted now is kept for the next connection: there is a first user file and it is
        (or will be) a regular file, not /dev/null, which would forget it."""
        if not self.user:
            return False
        try:
            return stat.S_ISREG(self.user[0].stat().st_mode)
        except FileNotFoundError:
            return True
        except OSError:
            return False

    def load(self) -> asyncssh.SSHKnownHosts:
        """Every file's entries, read once (asyncssh then checks against exactly these); a missing or unreadable
        file counts as empty, as for ssh; one that is not a known_hosts file is a TfrunError naming it."""
        known = asyncssh.SSHKnownHosts()
        for path in (*self.user, *self.system):
            try:
                known.load(_text(path))
            except ValueError as exc:
                raise TfrunError(f"{path} is not a known_hosts file ssh can read: {exc}", EXIT_DAEMON) from None
        return known

    def pinning(self, host: str, addr: str, port: int) -> Optional[Path]:
        """The first file that holds a key (or a CA) for the host: the one its old key must be removed from."""
        for path in (*self.user, *self.system):
            with contextlib.suppress(ValueError):
                if any(asyncssh.match_known_hosts(_text(path).encode(), host, addr, port)[:2]):
                    return path
        return None


def _text(path: Path) -> str:
    """A known_hosts file's text: empty when missing, unreadable or not a regular file (/dev/null)."""
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            return f.read() if stat.S_ISREG(os.fstat(f.fileno()).st_mode) else ""
    except OSError:
        return ""


def for_destination(address: str, port: Optional[int], user: Optional[str]) -> KnownHostsFiles:
    """The files OpenSSH would read for `address` (a host name, or a Host of ~/.ssh/config), as its config
    says for that host and user; `port`, `user`: the destination's own, None where it names none."""
    said = _config(address, port, user)
    users = said.get("UserKnownHostsFile", None)
    systems = said.get("GlobalKnownHostsFile", None)
    tokens = _tokens(address, said)
    return KnownHostsFiles(
        user=tuple(Path(_expand(word, tokens)) for word in (SSH_USER_KNOWN_HOSTS if users is None else users)),
        system=tuple(
            Path(os.path.expanduser(word)) for word in (SSH_GLOBAL_KNOWN_HOSTS if systems is None else systems)
        ),
    )


def _config(address: str, port: Optional[int], user: Optional[str]) -> Any:
    """What ~/.ssh/config says for the destination, as asyncssh reads it (a config it cannot read: nothing,
    and the connect says what is wrong with it)."""
    config = Path.home() / ".ssh" / "config"
    paths = [str(config)] if os.access(config, os.R_OK) else []
    where: dict[str, Any] = {"port": port} if port else {}
    if user:
        where["username"] = user
    try:
        return asyncssh.SSHClientConnectionOptions(host=address, config=paths, **where).config
    except (OSError, ValueError, asyncssh.Error):
        return {}


def _tokens(address: str, said: Any) -> dict[str, str]:
    """The %-tokens of ssh_config(5) that UserKnownHostsFile may hold, for this destination."""
    local = socket.gethostname()
    host = str(said.get("Hostname", address))
    port = str(said.get("Port", 22))
    try:
        local_user = getpass.getuser()
    except (KeyError, OSError):
        local_user = str(os.getuid())
    remote_user = str(said.get("User") or local_user)
    connection = hashlib.sha1((local + host + port + remote_user).encode()).hexdigest()  # ssh's %C
    return {"%": "%", "C": connection, "d": str(Path.home()), "h": host, "i": str(os.getuid()),
            "j": str(said.get("ProxyJump", "") or ""), "k": str(said.get("HostKeyAlias", address)),
            "L": local.split(".")[0], "l": local, "n": address, "p": port, "r": remote_user,
            "u": local_user}  # fmt: skip


def _expand(word: str, tokens: dict[str, str]) -> str:
    """A UserKnownHostsFile word as OpenSSH expands it: ~ first, then ${VAR} and the %-tokens (an unknown
    token or an unset variable is left as written: it names no file, as ssh would refuse it)."""
    word = os.path.expanduser(word)
    word = _VARIABLE.sub(lambda found: os.environ.get(found[1], found[0]), word)
    return _TOKEN.sub(lambda found: tokens.get(found[1], found[0]), word)


class HostKeyCheck(asyncssh.SSHClient):
    """Called by asyncssh for a host key that the known_hosts files do not vouch for: unknown, or changed."""

    def __init__(self, files: KnownHostsFiles, known: asyncssh.SSHKnownHosts, accept_new: bool) -> None:
        self.files = files
        self.known = known
        self.accept_new = accept_new
        self.key: Optional[asyncssh.SSHKey] = None
        self.changed = False
        self.unkept = False  # accept-new asked, with no user file to keep the key in
        self.pinned_in: Optional[Path] = None  # the file that pins another key, when changed
        self.where = ""

    def validate_host_public_key(self, host: str, addr: str, port: int, key: asyncssh.SSHKey) -> bool:
        self.key = key
        self.where = host if port == 22 else f"[{host}]:{port}"
        trusted, authorities = asyncssh.match_known_hosts(self.known, host, addr, port)[:2]
        if trusted or authorities:
            self.changed = True  # a file pins another key (or a CA) for this host: never accepted
            self.pinned_in = self.files.pinning(host, addr, port)
            return False
        if not self.accept_new:
            return False
        if not self.files.keeps_keys:
            self.unkept = True
            return False
        path = self.files.user[0]
        path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        line = f"{self.where} {key.export_public_key('openssh').decode().strip()}\n"
        with open(path, "a") as f:
            f.write(line)
        return True


def host_key_message(destination: str, check: HostKeyCheck) -> str:
    """Why the host key of `destination` was refused, and what to do, in one line."""
    if check.key is None:  # refused before our check ran: a ProxyJump of ~/.ssh/config, which asyncssh follows
        return (
            f"the host key of a jump host on the way to {destination} (ProxyJump in ~/.ssh/config) is not in "
            "~/.ssh/known_hosts: ssh to it once and check it, or give the jump with `tfrun hosts add --jump`"
        )
    fingerprint = check.key.get_fingerprint()
    if check.changed:
        return (
            f"the host key of {check.where} has CHANGED (now {fingerprint}); refusing to connect. If the box "
            f"was really rebuilt, remove its old key with: ssh-keygen -R '{check.where}'{_file_option(check.pinned_in)}"
        )
    if check.unkept:
        return (
            f"the host key of {check.where} is unknown ({fingerprint}) and is not accepted: ~/.ssh/config's "
            f"UserKnownHostsFile for it is {check.files.user[0] if check.files.user else 'none'}, so a key "
            "accepted now would be forgotten and every connection would trust whoever answers; name a known_hosts "
            "file there, or add the key you checked to one"
        )
    return (
        f"the host key of {check.where} is unknown ({fingerprint}); check it, then accept it once with "
        f"--accept-new-host-key, or set accept_new_host_key = true for this host"
    )


def _file_option(path: Optional[Path]) -> str:
    """ssh-keygen -R's ` -f FILE` for a key pinned outside ~/.ssh/known_hosts (its default file), else ''."""
    if path is None or path == Path.home() / ".ssh" / "known_hosts":
        return ""
    return f" -f '{path}'"
