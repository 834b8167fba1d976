"""The one exception the CLI turns into a one-line message and an exit code, and the errors made in one place."""

from __future__ import annotations

from typing import Optional

from tfrun.constants import EXIT_DAEMON


def error_line(message: str) -> str:
    """`tfrun: error: MESSAGE`: the one form of an error on stderr (docs/exit-codes.md), also for a verb that
    reports a failure per job (rm, cancel) and goes on to the next one."""
    return f"tfrun: error: {message}"


class TfrunError(Exception):
    def __init__(self, message: str, exit_code: int) -> None:
        super().__init__(message)
        self.message = message
        self.exit_code = exit_code


def cannot_start(where: Optional[str], reason: str) -> TfrunError:
    """The one line for a daemon that could not start, whichever way its reason came (its log, its
    stderr, an `Error` from dial-stdio): `tfrund cannot start on box: config.toml line 2: ...`; `where`: the
    host's label, None for this machine."""
    on = f" on {where}" if where is not None else ""
    return TfrunError(f"tfrund cannot start{on}: {reason}", EXIT_DAEMON)
