"""The gpu-memory rule: the box's GPUs read through NVML every few seconds, and a GPU whose memory stays above the
threshold for the config's gpu_memory_for is one alert, the box's own rather than a job's."""

from __future__ import annotations

import asyncio
import time

from ..gpus.devices import GpuReading, read_gpu_memory
from ..records.store import Store
from . import alertmessage
from .outbox import Outbox
from .rules import AlertConfig


class GpuMemory:
    """Since when each GPU's memory has been above the threshold (none: below it)."""

    def __init__(self) -> None:
        self._high_since: dict[int, float] = {}

    async def look(self, config: AlertConfig, host: str, store: Store, outbox: Outbox) -> None:
        """gpu-memory: a GPU above the threshold for the config's gpu_memory_for is one alert (the box's, not a
        job's; the cooldown makes a GPU that stays full one message)."""
        threshold = config.rules.get("gpu-memory") or 90.0
        gpus: list[GpuReading] = await asyncio.get_running_loop().run_in_executor(None, read_gpu_memory)
        now = time.time()
        for gpu in gpus:
            percent = 100.0 * gpu.used / gpu.total if gpu.total else 0.0
            if percent < threshold:
                self._high_since.pop(gpu.index, None)
                continue
            since = self._high_since.setdefault(gpu.index, now)
            if now - since >= config.gpu_memory_for:
                summary = (
                    f"{host}: GPU {gpu.index} ({gpu.name}) memory at {percent:.0f}% "
                    f"({gpu.used / 2**30:.1f} of {gpu.total / 2**30:.1f} GiB) for {alertmessage.minutes(now - since)}"
                )
                running = [alertmessage.label(row) for row in store.list(include_final=False)]
                body = f"{summary}\n\nRunning jobs: {', '.join(running) or 'none'}\n"
                outbox.record(None, "gpu-memory", summary, body, list(config.notify))
