"""Whom a kept connection may serve (client/link/keeper.py): a keeper's socket is named by the box and by everything
that decides whom the connection trusts and as whom it logs in (HOME, the local user, the agent, accept-new,
and what ~/.ssh holds), so no caller rides a connection it could not open. A caller whose known_hosts lacks
the box's key, or whose known_hosts changed since (`ssh-keygen -R`), gets a keeper of its own, which checks
the key afresh."""

from __future__ import annotations

import getpass
import glob
import hashlib
import json
import os
import re
import shlex
from pathlib import Path
from typing import Any

from tfrun.constants import SSH_GLOBAL_KNOWN_HOSTS, SSH_USER_KNOWN_HOSTS
from tfrun.private import private_dir, runtime_dir

from ..config.settings import Host


def socket_path(host: Host, accept_new: bool) -> Path:
    """Where the keeper for `host` listens, for this caller: short, per user, named by what identifies the
    daemon, by the way there (jump hosts, identity file) and by what decides trust (see `_trust`), so no caller
    rides a connection it could not open. Its folder is made and checked here, before anyone connects: one that
    is not this user's alone raises NotPrivate (tfrun/private.py)."""
    base = private_dir(runtime_dir(), "keepers", fix="remove it, or set XDG_RUNTIME_DIR to a folder of your own")
    login = [host.jump, host.identity_file and _fingerprint(Path(host.identity_file).expanduser())]
    key = json.dumps([host.identity, login, _trust(accept_new or host.accept_new_host_key)])
    digest = hashlib.sha256(key.encode()).hexdigest()[:20]
    return base / f"{digest}.sock"


# What asyncssh reads from ~/.ssh when no option says otherwise: the config, the CA bundle for X.509 host
# certificates, and the default identities with their certificates; besides them, the known_hosts files
# OpenSSH reads by default (client/link/knownhosts.py: tfrun reads them too), the global ones in /etc/ssh included.
_KEY_NAMES = ("id_ed25519_sk", "id_ecdsa_sk", "id_ed448", "id_ed25519", "id_ecdsa", "id_rsa", "id_dsa")
_SSH_FILES = ("config", "ca-bundle.crt", *_KEY_NAMES, *(f"{name}-cert.pub" for name in _KEY_NAMES))
# ssh_config keywords that name files deciding trust or identity, in any Host block (a superset is safe).
_FILE_KEYWORDS = {"include", "userknownhostsfile", "globalknownhostsfile", "identityfile", "certificatefile"}
_KEYWORD = re.compile(r"\s*([A-Za-z]+)\s*(?:=\s*|\s+)(.*)")
_FINGERPRINT_BYTES = 1 << 20  # bigger files (only a stray pattern names them) are told apart by their stat


def _trust(accept_new: bool) -> list[Any]:
    """Everything that decides whom a new SSH connection trusts and as whom it logs in, as this caller's
    asyncssh would read it: HOME, the local user, the agent, accept-new, and each file that can hold a host
    key or a login key, with a digest of its contents (a changed known_hosts must not ride an old connection)."""
    home = Path.home()
    try:
        user = getpass.getuser()
    except (KeyError, OSError):  # no name for this uid: asyncssh refuses to connect, and says so
        user = ""
    defaults = (Path(os.path.expanduser(name)) for name in (*SSH_USER_KNOWN_HOSTS, *SSH_GLOBAL_KNOWN_HOSTS))
    files = sorted({*(home / ".ssh" / name for name in _SSH_FILES), *defaults, *_named_by_config(home)})
    fingerprints = [[str(path), _fingerprint(path)] for path in files]
    return [str(home), user, os.environ.get("SSH_AUTH_SOCK", ""), accept_new, fingerprints]


def _named_by_config(home: Path) -> set[Path]:
    """Files that ~/.ssh/config and what it includes name as known_hosts, identities or certificates.

    Host-dependent tokens (%h, %r, ...) become wildcards: every file they could name counts, a superset."""
    found: set[Path] = set()
    pending = [home / ".ssh" / "config"]
    while pending:
        config = pending.pop()
        found.add(config)
        try:
            lines = config.read_text(errors="replace").splitlines()
        except OSError:
            continue
        for line in lines:
            match = _KEYWORD.match(line)
            if not match or match[1].lower() not in _FILE_KEYWORDS:
                continue
            include = match[1].lower() == "include"
            for word in _words(match[2]):
                pattern = os.path.expandvars(word.replace("%d", str(home)).replace("%%", "%"))
                pattern = re.sub(r"%.", "*", os.path.expanduser(pattern))
                # A relative Include is under ~/.ssh; any other relative path, under the working directory.
                for name in glob.glob(str(home / ".ssh" / pattern) if include else pattern):
                    path = Path(name).absolute()
                    if include and path not in found:
                        pending.append(path)
                    found.add(path)
    return found


def _words(text: str) -> list[str]:
    """An ssh_config line's arguments, quoted as ssh_config quotes them."""
    try:
        return shlex.split(text)
    except ValueError:  # an unbalanced quote: ssh refuses the line, and so would asyncssh
        return []


def _fingerprint(path: Path) -> str:
    """A digest of the file's contents; its stat when big; why it cannot be read when it cannot (missing
    counts too: a known_hosts that appears changes what is trusted)."""
    try:
        info = path.stat()
        if info.st_size > _FINGERPRINT_BYTES:
            return f"{info.st_ino}:{info.st_size}:{info.st_mtime_ns}"
        return hashlib.sha256(path.read_bytes()).hexdigest()
    except OSError as exc:
        return f"errno {exc.errno}"
