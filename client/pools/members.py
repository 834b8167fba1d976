"""Many boxes as one: a pool's members asked at once, each given a short time to answer.

A pool is a name that hosts carry (`tfrun hosts add NAME DEST --pool gpu`; `all` is every host). A verb that
takes a pool (`ps`, `submit`, `pools`) asks every member concurrently through the same `AsyncClient` and
keepers as a single-host verb, but waits at most `member_wait()` seconds for each (TFRUN_POOL_TIMEOUT, else the
client config's pool_timeout, else 5 s): one dead box (a stopped sshd, a refused port, no route) must cost a
few seconds and one line on stderr, never the whole verb. A job on one box of many is named by its address,
`HOST:ID` (or `HOST:NAME`), which `split_address` reads.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Generic, Optional, TypeVar

import click

from tfrun.constants import EXIT_USAGE
from tfrun.protocol.wire import Message

from ..calls import Call
from ..config import settings as config
from ..config.settings import ClientConfig, Host
from ..errors import TfrunError
from ..link.connection import Target

M = TypeVar("M", bound=Message)
T = TypeVar("T")

TIMEOUT_ENV = "TFRUN_POOL_TIMEOUT"
OLD_TIMEOUT_ENV = "TFRUN_FLEET_TIMEOUT"  # its name before tfrun said "pool" everywhere: still read
DEFAULT_TIMEOUT_S = 5.0


@dataclass
class Answer(Generic[T]):
    """One member's reply (what its call gives of it), or why it gave none (`skipped`)."""

    host: Host
    reply: Optional[T] = None
    skipped: Optional[str] = None
    refused: bool = False  # the daemon answered, with an error: reachable, but the request failed there


def member_wait(cfg: ClientConfig) -> float:
    """How long a pool verb waits for each box: TFRUN_POOL_TIMEOUT (or its old name), else the config's
    pool_timeout, else 5 s."""
    for name in (TIMEOUT_ENV, OLD_TIMEOUT_ENV):
        text = os.environ.get(name)
        if text:
            return config.duration(text, name)
    return DEFAULT_TIMEOUT_S if cfg.pool_timeout is None else cfg.pool_timeout


def distinct(hosts: Sequence[Host]) -> list[Host]:
    """`hosts` with each daemon once: two names for one box and TFRUN_HOME would list its jobs twice."""
    seen: set[str] = set()
    found = []
    for host in hosts:
        if host.identity not in seen:
            seen.add(host.identity)
            found.append(host)
    return found


async def ask_all(hosts: Sequence[Host], asked: Call[M, T], wait: float, accept_new: bool = False) -> list[Answer[T]]:
    """`asked` (a call, client/calls/) of every host at once; each answer in the order of `hosts`, a reply or the reason
    there is none (no answer within `wait` seconds, a refused connection, a daemon that cannot start)."""
    return list(await asyncio.gather(*(ask_one(host, asked, wait, accept_new) for host in hosts)))


async def ask_one(host: Host, asked: Call[M, T], wait: float, accept_new: bool = False) -> Answer[T]:
    """One member's answer to `asked` within `wait` seconds, never an exception: `tfrun top` over a pool
    asks each member on its own clock, so a slow one never holds up the others' next frame."""
    from tfrun.protocol.channel import RemoteError

    from ..library.asyncclient import AsyncClient

    client = AsyncClient(Target(host, accept_new, wait))
    try:
        reply = await asyncio.wait_for(client.call(asked), wait)
        return Answer(host, reply=reply)
    except asyncio.TimeoutError:
        return Answer(host, skipped=f"no answer within {wait:g}s")
    except RemoteError as exc:  # it answered, with a refusal (e.g. notify-test on a box with no notify URL)
        return Answer(host, skipped=exc.message, refused=True)
    except TfrunError as exc:
        return Answer(host, skipped=exc.message)
    except Exception as exc:  # any other way a box fails to answer is one line too, never a traceback
        reason = getattr(exc, "strerror", None) or getattr(exc, "message", None) or str(exc)
        return Answer(host, skipped=reason or type(exc).__name__)


def note_skipped(answers: Sequence[Answer[T]]) -> list[Answer[T]]:
    """Say on stderr which boxes did not answer, a line each; return those that did."""
    for answer in answers:
        if answer.skipped is not None:
            click.echo(f"tfrun: {answer.host.label} skipped: {answer.skipped}", err=True)
    return [answer for answer in answers if answer.reply is not None]


def split_address(ref: str, cfg: ClientConfig) -> tuple[Optional[str], str]:
    """(host, job) from a job address `box2:12` or `box2:train`; (None, ref) when the part before the first
    ':' is neither a configured host nor `local`: `a:b` stays a job name on the default host."""
    host, sep, job = ref.partition(":")
    members = config.pool_members(host, cfg) if sep and job else None
    if members is not None:  # `gpu:3`: which member's job 3?
        names = ", ".join(member.label for member in members) or "none"
        raise TfrunError(f"{host} is a pool (members: {names}): a job address names one host, HOST:ID", EXIT_USAGE)
    if not sep or (host not in cfg.hosts and host != config.LOCAL):
        return None, ref
    if not job:
        raise TfrunError(f"{ref!r} names no job: write HOST:ID or HOST:NAME", EXIT_USAGE)
    return host, job


def check_names(name: str, pools: Sequence[str], cfg: ClientConfig) -> None:
    """What `hosts add NAME --pool P...` may write: `all` and `local` name neither, and no pool is named like
    a host (`--host X` must mean one thing)."""
    from tfrun.protocol.fields import validate_name

    reserved = (config.ALL_HOSTS, config.LOCAL)
    if name in reserved or validate_name(name) or ":" in name:  # the ':' of an address ends a host's name
        raise TfrunError(f"{name!r} cannot name a host", EXIT_USAGE)
    if name in config.pools(cfg):
        raise TfrunError(f"{name!r} names a pool already; a host needs a name of its own", EXIT_USAGE)
    for pool in pools:
        if pool in reserved or validate_name(pool) or ":" in pool:
            raise TfrunError(f"{pool!r} cannot name a pool", EXIT_USAGE)
        if pool in cfg.hosts or pool == name:
            raise TfrunError(f"{pool!r} names a host; a pool needs a name of its own", EXIT_USAGE)
