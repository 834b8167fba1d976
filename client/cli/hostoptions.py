"""Where a verb's requests go: its --host (a host, `local`, or a pool for the verbs that take one) and
--accept-new-host-key, and job addresses (`status box2:12`), which send the verb to the host they name."""

from __future__ import annotations

import functools
from typing import TYPE_CHECKING, Any, Callable, Optional, TypeVar

import click

from tfrun.constants import EXIT_USAGE

from ..errors import TfrunError
from .main import complete_hosts, complete_hosts_and_pools, fail, job_refs

if TYPE_CHECKING:
    from ..config.settings import Host

F = TypeVar("F", bound=Callable[..., Any])
_POOL = "tfrun.pool"  # where --host leaves a pool: (its name, its members)
_ADDRESSED = "tfrun.addressed"  # the host a job address named
_HOST_OPTION = "tfrun.host_option"  # --host as typed on the command line (TFRUN_HOST yields to an address)
_MOVES = "tfrun.moves"  # the verb runs a job elsewhere (`restart box1:3 --host box2`): an address is its source
_SOURCE = "tfrun.source"  # where the job such a verb moves ran: the host its address named


def host_options(command: F) -> F:
    """--host and --accept-new-host-key, shared by every verb that talks to a daemon; and job addresses:
    a JOB (or JOB...) argument of the form HOST:ID selects that configured host (see `_addressed`)."""
    return _host_options(command, pools=False)


def pool_options(command: F) -> F:
    """`host_options` for the verbs that also take a pool as --host (`ps`, `submit`): see `pool`."""
    return _host_options(command, pools=True)


def moving_options(command: F) -> F:
    """`pool_options` for `restart`, which may run a job again on another box: given an address (`box1:3`) and
    a --host (a host or a pool) that differ, the address names where the job ran (`source`) and --host where it
    runs again; alone, either means what it means for every verb."""
    return _host_options(command, pools=True, moves=True)


def source() -> Optional[str]:
    """For a moving verb, the host the job's address named when --host named another (or a pool); else None."""
    found: Optional[str] = click.get_current_context().meta.get(_SOURCE)
    return found


def every_box_options(command: F) -> F:
    """`pool_options` for a verb that shows every box unless --host names some (`ui`): its help says so."""
    return _host_options(command, pools=True, default="this machine's daemon and every configured host")


def _host_options(command: F, pools: bool, default: str = "", moves: bool = False) -> F:
    @functools.wraps(command)
    def verb(*args: Any, **kwargs: Any) -> Any:
        ctx = click.get_current_context()
        ctx.meta[_MOVES] = moves
        for key in ("job", "jobs"):
            if kwargs.get(key):
                kwargs[key] = job_refs(_addressed(ctx, kwargs[key]))
        if not pools and ctx.meta.get(_POOL) is not None:
            name = ctx.meta[_POOL][0]
            fail(f"{name} is a pool: {ctx.info_name} needs one host (--host NAME) or a job address HOST:ID", EXIT_USAGE)
        return command(*args, **kwargs)

    verb = click.option(
        "--accept-new-host-key",
        is_flag=True,
        expose_value=False,
        is_eager=True,
        callback=_set_accept_new,
        help="Trust a box's host key the first time it is seen (like StrictHostKeyChecking=accept-new).",
    )(verb)
    pool_help = " or a pool (every member: tfrun pools; 'all': every host)" if pools else ""
    verb = click.option(
        "--host",
        envvar="TFRUN_HOST",
        expose_value=False,
        metavar="HOST",
        callback=_set_target,
        shell_complete=complete_hosts_and_pools if pools else complete_hosts,
        help=f"The box: a configured host (tfrun hosts list), or user@host[:port]{pool_help}. Default: "
        + (default or "the configured default host, else the daemon on this machine ('local')")
        + ".",
    )(verb)
    return verb  # type: ignore[return-value]


def pool() -> Optional[tuple[str, list[Host]]]:
    """The pool --host named (its name and members), or None for one host."""
    found: Optional[tuple[str, list[Host]]] = click.get_current_context().meta.get(_POOL)
    return found


def addressed() -> Optional[str]:
    """The host a job address given to the verb named (`status box2:12`, `submit --after box2:12`), if any."""
    host: Optional[str] = click.get_current_context().meta.get(_ADDRESSED)
    return host


def address(job_id: int) -> str:
    """How to name job `job_id` again: `box2:12` when the verb was given an address, else `12`."""
    host = addressed()
    return f"{host}:{job_id}" if host else str(job_id)


def _addressed(ctx: click.Context, refs: Any) -> Any:
    """JOB (a str) or JOB... (a tuple) with the host part of their addresses taken off, the verb's target set
    to that host. An address names a configured host or `local`; anything else is a job name as it stands.
    The jobs of one verb live on one box, and an explicit --host must be the address's own."""
    many = isinstance(refs, tuple)
    if not any(":" in ref and "://" not in ref for ref in (refs if many else (refs,))):
        return refs  # no address (a job's stored folder, s3://..., is none)
    from ..config import settings as config
    from ..link.connection import Target
    from ..pools.members import split_address

    try:
        cfg = config.load()
        split = [split_address(ref, cfg) for ref in (refs if many else (refs,))]
    except TfrunError as exc:
        fail(exc.message, exc.exit_code)
    named = {host for host, _ in split if host is not None}
    if not named:
        return refs
    if len(named) > 1 or (len(split) > 1 and None in (host for host, _ in split)):
        fail("these jobs are on different hosts: name the jobs of one host at a time", EXIT_USAGE)
    (name,) = named
    given = ctx.meta.get(_HOST_OPTION)
    if given is not None and given != name and ctx.meta.get(_MOVES):
        ctx.meta[_SOURCE] = name  # the target stays --host's
        jobs = tuple(job for _, job in split)
        return jobs if many else jobs[0]
    if given is not None and given != name:
        fail(f"--host {given} but job {refs[0] if many else refs} is on {name}: give one or the other", EXIT_USAGE)
    ctx.obj = Target(config.resolve(name, cfg), bool(ctx.meta.get("accept_new")))
    ctx.meta[_ADDRESSED] = name
    ctx.meta.pop(_POOL, None)  # a standing pool (TFRUN_HOST=gpu) yields to the host an address names
    jobs = tuple(job for _, job in split)
    return jobs if many else jobs[0]


def addressed_jobs(refs: tuple[str, ...]) -> tuple[str, ...]:
    """Job references given in an option (submit --after), read as a JOB... argument is: an address
    among them sends the verb to its host and loses its host part (see `_addressed`)."""
    found: tuple[str, ...] = job_refs(_addressed(click.get_current_context(), refs))
    return found


def _set_accept_new(ctx: click.Context, _: click.Parameter, value: bool) -> None:
    ctx.meta["accept_new"] = value  # eager: read by _set_target, whatever the order on the command line


def _set_target(ctx: click.Context, param: click.Parameter, value: Optional[str]) -> None:
    from click.core import ParameterSource

    from ..config import settings as config
    from ..link.connection import Target

    if value is None and isinstance(ctx.obj, Target):
        return  # a subcommand without --host keeps its group's: `tfrun config --host box set ...`
    if value is not None and ctx.get_parameter_source(param.name or "host") == ParameterSource.COMMANDLINE:
        ctx.meta[_HOST_OPTION] = value
    try:
        cfg = config.load()
        members = config.pool_members(value, cfg)
        host = None if members is not None else config.resolve(value, cfg)
    except TfrunError as exc:
        if ctx.resilient_parsing:  # completing a command line (Tab): the verb itself says what is wrong
            return
        fail(exc.message, exc.exit_code)
    if members is not None:
        ctx.meta[_POOL] = (value, members)
    ctx.obj = Target(host, bool(ctx.meta.get("accept_new")))
