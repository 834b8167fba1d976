"""The one exception the CLI turns into a one-line message and an exit code, and the errors made in one place."""

from __future__ import annotations

from typing import Optional

from tfrun.constants import EXIT_DAEMON


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
