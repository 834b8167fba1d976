"""Handlers of the daemon itself: its status, shutdown, its config, and `tfrun doctor`'s checks of the box."""

from __future__ import annotations

import asyncio
import functools
import os
from typing import TYPE_CHECKING, Callable, Protocol

from tfrun import __version__
from tfrun.protocol.admin import (
    Check,
    ConfigReply,
    DaemonInfo,
    DaemonKey,
    DaemonStatus,
    Doctor,
    DoctorReport,
    GetConfig,
    GetDaemonKey,
    ReloadConfig,
    SetConfig,
    Shutdown,
)
from tfrun.protocol.fields import JobState
from tfrun.protocol.wire import PROTOCOL_VERSION, Ok

from ..config import live
from ..config.settings import ConfigError
from ..doctor import job_python, run_checks
from .base import Connection, handles, invalid

if TYPE_CHECKING:
    from ..executors.executor import Executor
    from ..records.store import Store


class Context(live.Context, Protocol):
    """What the daemon's own requests need of it: the config's, its jobs, its executor (doctor), when it started,
    its stop (runner/daemon.py's Daemon is one)."""

    store: Store
    executor: Executor
    started_at: float

    @property
    def key(self) -> bytes: ...

    def stop(self) -> None: ...


@handles(DaemonStatus)
async def daemon_status(daemon: Context, req: DaemonStatus, conn: Connection) -> None:
    await conn.send(
        DaemonInfo(
            pid=os.getpid(),
            version=__version__,
            protocol=PROTOCOL_VERSION,
            home=str(daemon.layout.home),
            socket=str(daemon.layout.socket),
            started_at=daemon.started_at,
            jobs=daemon.store.counts(),
        )
    )


@handles(GetDaemonKey)
async def daemon_key(daemon: Context, req: GetDaemonKey, conn: Connection) -> None:
    await conn.send(DaemonKey(daemon.key.hex()))


@handles(Shutdown)
async def shutdown(daemon: Context, req: Shutdown, conn: Connection) -> None:
    running = daemon.store.counts()[JobState.RUNNING]
    await conn.send(Ok(f"tfrund (pid {os.getpid()}) stopping; {running} running job(s) keep running"))
    daemon.stop()


@handles(GetConfig)
async def get_config(daemon: Context, req: GetConfig, conn: Connection) -> None:
    await conn.send(ConfigReply(str(daemon.layout.config_file), live.effective(daemon, req.secrets)))


@handles(ReloadConfig)
async def reload_config(daemon: Context, req: ReloadConfig, conn: Connection) -> None:
    changes = _reconfigured(functools.partial(live.reload, daemon, "tfrun config reload"))
    await conn.send(ConfigReply(str(daemon.layout.config_file), live.effective(daemon), changes))


@handles(SetConfig)
async def set_config(daemon: Context, req: SetConfig, conn: Connection) -> None:
    """Edit config.toml and reload it, with no await in between: no other request sees the file half done."""
    changes = _reconfigured(functools.partial(live.set_key, daemon, req.key, req.values, req.unset))
    await conn.send(ConfigReply(str(daemon.layout.config_file), live.effective(daemon), changes))


def _reconfigured(change: Callable[[], list[str]]) -> list[str]:
    try:
        return change()
    except ConfigError as exc:
        raise invalid(f"{exc} (nothing changed)") from None


@handles(Doctor)
async def doctor(daemon: Context, req: Doctor, conn: Connection) -> None:
    """The box's checks; on a Slurm login node, Slurm's too (runner/executors/slurm/checks.py)."""
    python = req.python or job_python(daemon.config.job_python)
    executor = daemon.executor

    def work() -> list[Check]:
        return run_checks(daemon.config.checkpoint_root, python, daemon.config.checkpoints_to) + executor.checks()

    await conn.send(DoctorReport(await asyncio.get_running_loop().run_in_executor(None, work)))
