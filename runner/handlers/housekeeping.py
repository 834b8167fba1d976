"""Handlers of housekeeping: removing ended jobs (`rm`, `prune`) and what tfrun's folders take (`df`); the work is
runner/housekeeping.py's."""

from __future__ import annotations

from tfrun.protocol.housekeeping import DiskUsage, Prune, Remove

from .. import housekeeping
from .base import Connection, handles


@handles(Remove)
async def remove(daemon: housekeeping.Context, req: Remove, conn: Connection) -> None:
    await conn.send(await housekeeping.remove(daemon, req.jobs, req.checkpoints, req.dry_run, req.storage))


@handles(Prune)
async def prune(daemon: housekeeping.Context, req: Prune, conn: Connection) -> None:
    await conn.send(await housekeeping.prune(daemon, req))


@handles(DiskUsage)
async def disk_usage(daemon: housekeeping.Context, req: DiskUsage, conn: Connection) -> None:
    await conn.send(await housekeeping.disk_report(daemon))
