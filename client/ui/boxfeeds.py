"""What the Alerts and GPUs pages follow: every box's alerts, asked as `tfrun alerts` asks, and each box's GPUs
sampled as `tfrun top` samples them.

The GPUs feed keeps each box's samples for up to GPU_HISTORY_S in the UI server's memory, for as long as a page
shows them (and a feed's linger after): a page opened, or opened again, draws the history so far.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Sequence
from typing import Any, Optional

from tfrun.protocol.channel import Channel, RemoteError
from tfrun.protocol.watching import Gpu

from ..calls import watching as watch_calls
from ..views import reports
from . import extras
from .boxes import Box, Unreachable
from .feeds import Feed

ALERTS_EVERY_S = 5.0  # the alerts asked again: a delivery's retry changes its state
ALERTS_SHOWN = 200  # the newest alerts of each box the page shows, and of all of them together
GPU_EVERY_S = 1.0  # as `tfrun top` samples (its default interval)
GPU_HISTORY_S = 3600.0  # the history a GPUs page draws: the last hour at most


class AlertsFeed(Feed):
    """Every box's newest alerts, newest first, asked every ALERTS_EVERY_S; an event when they changed. Only the
    latest is kept: a reader wants the list as it is."""

    def __init__(self, shown: Sequence[Box]) -> None:
        super().__init__(kept=1)
        self.shown = shown

    async def run(self) -> None:
        last = None
        while True:
            answers = await asyncio.gather(*(_alerts_of(box) for box in self.shown))
            found = sorted((alert for alerts, _ in answers for alert in alerts), key=lambda a: a["at"], reverse=True)
            listed = {
                "alerts": found[:ALERTS_SHOWN],
                "boxes": {box.name: {"up": why is None, "why": why} for box, (_, why) in zip(self.shown, answers)},
            }
            if listed != last:
                self.publish("alerts", listed)
                last = listed
            await asyncio.sleep(ALERTS_EVERY_S)


async def _alerts_of(box: Box) -> tuple[list[dict[str, Any]], Optional[str]]:
    """The box's newest alerts, and None; or none and why the box did not say."""
    try:
        alerts = await box.ask(watch_calls.alerts(None, ALERTS_SHOWN).on)
    except Unreachable as exc:
        return [], str(exc)
    except RemoteError as exc:
        return [], exc.message
    return [extras.alert_shown(box.name, alert) for alert in alerts], None


class GpusFeed(Feed):
    """Each box's GPUs, sampled every GPU_EVERY_S as `tfrun top` samples them (one `Top` round trip: the GPUs
    and the jobs that hold them, by name), a `sample` event each, each box on its own so that one that does not
    answer holds up no other. The last GPU_HISTORY_S of samples are kept for a reader that joins."""

    def __init__(self, shown: Sequence[Box]) -> None:
        super().__init__(kept=max(1, len(shown)) * int(GPU_HISTORY_S / GPU_EVERY_S))
        self.shown = shown

    async def run(self) -> None:
        await asyncio.gather(*(self._sample(box) for box in self.shown))

    async def _sample(self, box: Box) -> None:
        while True:
            started = time.monotonic()
            sample: dict[str, Any] = {"box": box.name, "at": time.time(), "up": True, "why": None, "gpus": []}
            try:
                sample["gpus"] = await box.ask(_gpus)
            except Unreachable as exc:
                sample.update(up=False, why=str(exc))
            except RemoteError as exc:
                sample.update(up=False, why=exc.message)
            self.publish("sample", sample)
            await asyncio.sleep(max(0.0, GPU_EVERY_S - (time.monotonic() - started)))


async def _gpus(channel: Channel) -> list[dict[str, Any]]:
    frame = await watch_calls.top(recent=0, losses=0).on(channel)
    names = {job.id: job.name for job in frame.jobs}
    return [gpu_shown(gpu, names) for gpu in frame.gpus]


def gpu_shown(gpu: Gpu, names: dict[int, Optional[str]]) -> dict[str, Any]:
    """A GPU's sample: its memory and load, and its job (with the job's name), or who holds it outside tfrun's
    jobs here, in `tfrun gpus`' words."""
    return {
        "device": gpu.device,
        "name": gpu.name,
        "used": gpu.memory_used,
        "total": gpu.memory_total,
        "memory": reports.gpu_cells(gpu)[2],  # `tfrun gpus`' words: 30.0 GB / 141.0 GB (21%)
        "load": gpu.utilization,
        "job": gpu.job,
        "job_name": names.get(gpu.job) if gpu.job is not None else None,
        "held_by": gpu.held_by,
    }
