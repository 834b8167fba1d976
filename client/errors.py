"""The one exception the CLI turns into a one-line message and an exit code."""

from __future__ import annotations


class TfrunError(Exception):
    def __init__(self, message: str, exit_code: int) -> None:
        super().__init__(message)
        self.message = message
        self.exit_code = exit_code
