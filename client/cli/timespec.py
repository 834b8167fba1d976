"""Points in time as users write them on the command line: `10m`, `1h30m`, `2026-11-30T08:00`."""

from __future__ import annotations

import datetime
from dataclasses import dataclass
from typing import Optional

import click

from tfrun.duration import parse_duration


@dataclass(frozen=True)
class Since:
    """Either seconds before now on the box's clock (a duration), or an absolute time (seconds since the
    epoch). A duration is sent as such, so a box whose clock differs from ours still gets it right."""

    ago: Optional[float] = None
    at: Optional[float] = None


def parse_since(text: str) -> Since:
    """A duration (ago) or an ISO 8601 date and time (local time unless it names its zone); ValueError else."""
    text = text.strip()
    seconds = parse_duration(text)
    if seconds is not None:
        return Since(ago=seconds)
    iso = text[:-1] + "+00:00" if text.endswith(("Z", "z")) else text
    try:
        moment = datetime.datetime.fromisoformat(iso)
    except ValueError:
        raise ValueError(
            f"{text!r} is neither a duration (90s, 10m, 1h30m, 2d) nor a date and time (2026-11-30T08:00)"
        ) from None
    return Since(at=moment.timestamp())  # a naive time is taken as local time, as `date` shows it


def since_option(ctx: click.Context, param: click.Parameter, value: Optional[str]) -> Optional[Since]:
    """click's callback for a --since option: a bad value is a usage error that names the option."""
    if value is None:
        return None
    try:
        return parse_since(value)
    except ValueError as exc:
        raise click.BadParameter(str(exc), ctx, param) from None
