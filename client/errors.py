"""The one exception the CLI turns into a one-line message and an exit code, and the errors made in one place."""

from __future__ import annotations

from typing import Optional

from tfrun.constants import EXIT_DAEMON, EXIT_FAILURE, EXIT_NO_SUCH_JOB, EXIT_USAGE


def error_line(message: str) -> str:
    """`tfrun: error: MESSAGE`: the one form of an error on stderr (docs/reference/exit-codes.md), also for a verb that
    reports a failure per job (rm, cancel) and goes on to the next one."""
    return f"tfrun: error: {message}"


class TfrunError(Exception):
    """A failure said in one line (bad input, no daemon to reach), with the exit code the CLI gives it."""

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


def remote_exit(code: str) -> int:
    """The exit code of a verb that the daemon answered with an Error of `code` (docs/reference/exit-codes.md). A daemon
    that answered was reached: a failure of its own (the box's disk full, a bug) is the verb's failure, 1, never
    the 125 of a daemon that cannot be reached, which a version mismatch, a daemon that cannot start and a code
    this client does not know (a daemon of another version's) stay."""
    from tfrun.protocol.fields import ErrorCode  # here: the message classes are imported only by verbs that talk

    exits = {
        ErrorCode.NO_SUCH_JOB: EXIT_NO_SUCH_JOB,
        ErrorCode.INVALID_INPUT: EXIT_USAGE,
        ErrorCode.BAD_REQUEST: EXIT_USAGE,
        ErrorCode.NO_ROOM: EXIT_FAILURE,
        ErrorCode.INTERNAL: EXIT_FAILURE,
    }
    return exits.get(code, EXIT_DAEMON)
