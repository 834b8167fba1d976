"""Each job's GPUs over its life: the memory and load of the GPUs a job holds, sampled by the daemon every
GPU_USE_EVERY_S into the job's gpus.jsonl (runner/shim/jobdir.py), for its page in `tfrun ui`: how much of
a GPU's memory a run needed is what a user sizes the next one by.

Sampled only while a job of this daemon holds a GPU (nothing is read on a box whose jobs hold none), in a
thread as `tfrun gpus` reads NVML; not for jobs whose GPUs Slurm places (NVML here sees the login node's).
A sample is a device's figures, not the job's alone: the job holds the GPU, whose lease keeps other jobs off it.
While the daemon is down nothing is sampled; the file shows the gap. The file is in the job's folder, so
nothing read back from it is trusted.
"""

from __future__ import annotations

import asyncio
import json
import logging
import math
import os
import stat
import time
from pathlib import Path
from typing import Any, Callable, Optional

from tfrun.protocol.watching import GpuUse

from ..records.store import Store
from ..shim import jobdir
from .devices import GpuReading, read_gpu_memory

log = logging.getLogger("tfrund")

GPU_USE_EVERY_S = 5.0  # a held GPU sampled this often: about 1.4 MB a GPU a day
READ_MAX_BYTES = 64 << 20  # the most of a gpus.jsonl one answer reads (~45 GPU-days); the next goes on from there


class GpuHistory:
    """The sampling loop: `held()` names the devices jobs hold (device -> job id); `store` has their folders."""

    def __init__(self, held: Callable[[], dict[str, int]], store: Store) -> None:
        self.held = held
        self.store = store

    async def run(self) -> None:
        """Forever: every GPU_USE_EVERY_S, the held GPUs' figures appended to their jobs' files."""
        loop = asyncio.get_running_loop()
        while True:
            await asyncio.sleep(GPU_USE_EVERY_S)
            held = self.held()
            if held:
                readings = await loop.run_in_executor(None, read_gpu_memory)
                self.record(held, readings, time.time())

    def record(self, held: dict[str, int], readings: list[GpuReading], now: float) -> None:
        """One line a held GPU that NVML (or the stand-in) reports, in its job's gpus.jsonl."""
        lines: dict[int, list[str]] = {}
        for device, job in sorted(held.items()):
            reading = next((r for r in readings if r.is_device(device)), None)
            if reading is not None:
                sample = {"time": round(now, 3), "device": device, "used": reading.used, "total": reading.total,
                          "load": reading.utilization}  # fmt: skip
                lines.setdefault(job, []).append(json.dumps(sample, separators=(",", ":")) + "\n")
        for job, text in lines.items():
            row = self.store.get(job)
            if row is not None:  # not a job removed meanwhile
                try:
                    _append(Path(row.job_dir) / jobdir.GPU_USE, "".join(text).encode())
                except OSError as exc:  # a full disk, a folder removed meanwhile: the next sample tries again
                    log.debug("job %d: GPU sample not kept: %s", job, exc)


def _append(path: Path, data: bytes) -> None:
    """Append `data` to the job's file: never through a link, never to anything but a regular file."""
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, 0o644)
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise OSError(f"{path.name} is not a regular file")
        os.write(fd, data)
    finally:
        os.close(fd)


def read_gpu_use(job_dir: Path, since: int, buckets: Optional[int]) -> tuple[list[GpuUse], int, bool]:
    """The samples written at or after byte `since` of the job's gpus.jsonl (from its start if the file is
    shorter: another file), thinned to `buckets` time ranges where they are more (`thinned`); the byte the next
    read starts at (after the last whole line)."""
    try:
        fd = os.open(job_dir / jobdir.GPU_USE, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError:  # none yet (a job that holds no GPU), or a link the job put in its place: no samples
        return [], 0, False
    with os.fdopen(fd, "rb") as f:
        size = os.fstat(f.fileno()).st_size
        if not stat.S_ISREG(os.fstat(f.fileno()).st_mode):
            return [], 0, False
        start = since if since <= size else 0
        f.seek(start)
        data = f.read(min(size - start, READ_MAX_BYTES))
    whole = data[: data.rfind(b"\n") + 1]
    samples = [sample for sample in map(_sample, whole.splitlines()) if sample is not None]
    thin = buckets is not None and len(samples) > 2 * buckets
    return (_thinned(samples, buckets) if thin and buckets else samples), start + len(whole), thin


def _sample(line: bytes) -> Optional[GpuUse]:
    """A line of gpus.jsonl, or None: the file is the job's."""
    try:
        record: Any = json.loads(line)
        at, device = float(record["time"]), str(record["device"])[:64]
        used, total, load = record["used"], record["total"], record.get("load")
    except (ValueError, KeyError, TypeError):
        return None
    if not math.isfinite(at) or not all(_count(value) for value in (used, total)):
        return None
    return GpuUse(time=at, device=device, used=used, total=total, load=load if _count(load) else None)


def _count(value: object) -> bool:
    return type(value) is int and 0 <= value < 2**63


def _thinned(samples: list[GpuUse], buckets: int) -> list[GpuUse]:
    """Of each GPU, in each of `buckets` equal ranges of time, the samples of its highest memory and its highest
    load (and the range's first): what a right-sizing reads is the peak, which an even thinning would miss."""
    low = min(sample.time for sample in samples)
    span = max(sample.time for sample in samples) - low or 1.0
    kept: dict[tuple[str, int, str], int] = {}
    for index, sample in enumerate(samples):
        bucket = min(buckets - 1, int((sample.time - low) * buckets / span))
        kept.setdefault((sample.device, bucket, "first"), index)
        for what, value in (("used", sample.used), ("load", sample.load or 0)):
            best = kept.get((sample.device, bucket, what))
            if best is None or value > _figure(samples[best], what):
                kept[(sample.device, bucket, what)] = index
    return [samples[index] for index in sorted(set(kept.values()))]


def _figure(sample: GpuUse, what: str) -> int:
    return sample.used if what == "used" else sample.load or 0
