"""Usage errors as one line, `tfrun: error: No such option '--frob' (see tfrun ps --help)`, exit code 2.

click prints a three-line block (Usage, Try, Error) for a bad option, a missing argument, a bad value or an
unknown command. Every other error of tfrun and tfrund is one line that starts with `PROG: error:`, and
the README promises the same for usage errors, so scripts and people read one shape. The top group
converts them all, raised while parsing or while running any verb or subgroup, in one place.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import IO, Any, Optional

import click

from tfrun.constants import EXIT_USAGE

# click 8.2+ shows the help of a group given no verb through a usage error of its own; 8.1 has none.
_HELP_SHOWN: Any = getattr(click.exceptions, "NoArgsIsHelpError", ())


class UsageLine(click.ClickException):
    """A usage error that click's main shows as one line (click calls `show`, then exits with exit_code)."""

    exit_code = EXIT_USAGE

    def __init__(self, prog: str, error: click.UsageError) -> None:
        # A message can span lines (a BadParameter's text, a suggestion): fold it onto the one line.
        message = " ".join(line.strip() for line in error.format_message().splitlines() if line.strip())
        message = message.removesuffix(".")  # click ends most with a full stop; the hint follows
        if error.ctx is not None and error.ctx.command.get_help_option(error.ctx) is not None:
            message += f" (see {error.ctx.command_path} --help)"
        super().__init__(message)
        self.prog = prog

    def show(self, file: Optional[IO[Any]] = None) -> None:
        click.echo(f"{self.prog}: error: {self.message}", file=file, err=True)


class OneLineUsageGroup(click.Group):
    """The top group of a CLI (`prog` names it in errors) whose usage errors, its own or any verb's, are
    UsageLine. Help asked for by giving a group no arguments is click's too (NoArgsIsHelpError), and stays."""

    def __init__(self, *args: Any, prog: str, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.prog = prog

    def make_context(
        self, info_name: Optional[str], args: list[str], parent: Optional[click.Context] = None, **extra: Any
    ) -> click.Context:
        with self._one_line():
            return super().make_context(info_name, args, parent, **extra)

    def invoke(self, ctx: click.Context) -> Any:
        with self._one_line():
            return super().invoke(ctx)

    @contextmanager
    def _one_line(self) -> Iterator[None]:
        try:
            yield
        except click.UsageError as exc:
            if isinstance(exc, _HELP_SHOWN):
                raise
            raise UsageLine(self.prog, exc) from None
