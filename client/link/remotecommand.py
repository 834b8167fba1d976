"""A command for tfrund on the box, as sshd runs it: the host's environment travels on its stdin, never on its
command line (which every user of the box reads in `ps`). No asyncssh here: `tfrun install` builds these too."""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass

from tfrun.constants import (
    EXIT_USAGE,
)

from ..config.settings import Host
from ..errors import TfrunError

# reads K=V lines up to an empty one (from a pipe, `read` takes no byte past its line, so what follows is the
# command's own input: the protocol), exports them, and becomes the command.
_ENV_FROM_STDIN = 'while IFS= read -r kv && [ -n "$kv" ]; do export "$kv" || exit 2; done; exec "$@"'
_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


@dataclass(frozen=True)
class RemoteCommand:
    """A command for the box: `line` is what sshd runs (no secret in it); `stdin` goes first on its input."""

    line: str
    stdin: bytes = b""


def remote_command(host: Host, *args: str) -> RemoteCommand:
    """tfrund with `args` on the box, in the host's environment, which travels on stdin (`_ENV_FROM_STDIN`)."""
    tfrund = [*shlex.split(host.tfrund), *args]
    if not host.env:
        return RemoteCommand(shlex.join(tfrund))
    return RemoteCommand(shlex.join(["sh", "-c", _ENV_FROM_STDIN, "sh", *tfrund]), _env_lines(host))


def _env_lines(host: Host) -> bytes:
    """The host's environment as K=V lines and the empty line that ends them; a name or value these lines
    cannot carry is refused, naming it."""
    for key, value in host.env.items():
        if not _ENV_NAME.fullmatch(key) or "\n" in value or "\0" in value:
            raise TfrunError(
                f"host {host.label}: env {key!r} cannot be sent to the box (a name must be letters, digits and _, "
                "a value one line): fix it with `tfrun hosts add` or in the hosts config",
                EXIT_USAGE,
            )
    return "".join(f"{key}={value}\n" for key, value in sorted(host.env.items())).encode() + b"\n"
