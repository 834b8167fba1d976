"""The box's GPUs through NVML (nvidia-ml-py): which devices jobs are given, and their memory and load for
the gpu-memory alert rule and `tfrun gpus`.

No GPU, no driver or no NVML is a normal state: the answer is then an empty list, quietly. On machines that
cannot have a GPU, TFRUN_GPU_STANDIN names a JSON file that stands in for NVML's answer (a list of
{"index", "name", "used", "total"}, bytes, and optionally "utilization", "uuid" and "processes": NVML's
per-process list, [{"pid", "used"}]), read afresh at each look; tests use it, nothing else should. Stand-in
GPUs are leased in `<the file>.leases/` (runner/shim/gpulease.py), not with the box's real ones.

A GPU is free for a job of this daemon when no job of its own holds it (runner/queue/scheduler.py), no other tfrund's
job holds its lease, and no process outside tfrun holds more than GPU_FOREIGN_BYTES of its memory: `held_outside`
says, in words, who holds the others. A configured device that NVML does not list has no lease: it is not a
GPU anyone else's daemon could see.
"""

from __future__ import annotations

import json
import logging
import os
from dataclasses import dataclass
from typing import Any, Optional

from tfrun.constants import GPU_FOREIGN_BYTES, GPU_LEASE_DIR

from ..shim import gpulease

log = logging.getLogger("tfrund")
STANDIN_ENV = "TFRUN_GPU_STANDIN"


@dataclass(frozen=True)
class GpuProcess:
    """A process using a GPU, as NVML lists it: its pid and the memory it holds there, in bytes."""

    pid: int
    used: int


@dataclass(frozen=True)
class GpuReading:
    index: int
    name: str
    used: int  # bytes of memory
    total: int
    utilization: Optional[int] = None  # percent of the last sample period the GPU was busy
    uuid: Optional[str] = None
    processes: tuple[GpuProcess, ...] = ()

    @property
    def key(self) -> str:
        """What names its lease: the UUID, the same whatever CUDA_VISIBLE_DEVICES numbering a daemon uses."""
        return self.uuid or str(self.index)

    def is_device(self, device: str) -> bool:
        """Whether `device` (a CUDA index or a UUID, as jobs are given them) names this GPU."""
        return device == str(self.index) or (self.uuid is not None and device == self.uuid)


def read_gpu_memory() -> list[GpuReading]:
    """Each GPU's memory use now; [] where there is no GPU to ask."""
    standin = os.environ.get(STANDIN_ENV)
    if standin:
        return _from_standin(standin)
    try:
        import pynvml
    except ImportError:
        return []
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError:  # no driver, no GPU: nothing to watch
        return []
    try:
        gpus = []
        for index in range(pynvml.nvmlDeviceGetCount()):
            handle = pynvml.nvmlDeviceGetHandleByIndex(index)
            memory = pynvml.nvmlDeviceGetMemoryInfo(handle)
            gpus.append(
                GpuReading(
                    index,
                    _text(pynvml.nvmlDeviceGetName(handle)),
                    memory.used,
                    memory.total,
                    pynvml.nvmlDeviceGetUtilizationRates(handle).gpu,
                    _text(pynvml.nvmlDeviceGetUUID(handle)),
                    _processes(pynvml, handle),
                )
            )
        return gpus
    except pynvml.NVMLError as exc:
        log.warning("NVML: %s", exc)
        return []
    finally:
        pynvml.nvmlShutdown()


def device_ids(configured: Optional[list[str]]) -> list[str]:
    """The GPUs jobs are given: those the config or TFRUN_GPUS names, else every GPU NVML sees ("0", "1")."""
    if configured is not None:
        return configured
    return [str(gpu.index) for gpu in read_gpu_memory()]


def _from_standin(path: str) -> list[GpuReading]:
    try:
        with open(path) as f:
            return [
                GpuReading(
                    int(g["index"]),
                    str(g["name"]),
                    int(g["used"]),
                    int(g["total"]),
                    g.get("utilization"),
                    g.get("uuid"),
                    tuple(GpuProcess(int(p["pid"]), int(p["used"])) for p in g.get("processes", [])),
                )
                for g in json.load(f)
            ]
    except (OSError, ValueError, KeyError, TypeError) as exc:
        log.warning("%s: %s", STANDIN_ENV, exc)
        return []


def _processes(pynvml: Any, handle: object) -> tuple[GpuProcess, ...]:
    """NVML's compute processes on the GPU; none where the driver will not say (a container's pid space)."""
    try:
        found = pynvml.nvmlDeviceGetComputeRunningProcesses(handle)
    except (pynvml.NVMLError, AttributeError) as exc:  # AttributeError: a binding too old for the call
        log.debug("NVML processes: %s", exc)
        return ()
    return tuple(GpuProcess(int(p.pid), int(p.usedGpuMemory or 0)) for p in found)


def lease_folder() -> str:
    """Where the box's GPU leases are: the shared GPU_LEASE_DIR, or beside the stand-in file for its GPUs."""
    standin = os.environ.get(STANDIN_ENV)
    return f"{standin}.leases" if standin else GPU_LEASE_DIR


def lease_keys(devices: list[str], readings: list[GpuReading]) -> dict[str, str]:
    """What names the lease of each device that is a GPU NVML lists (the others have none)."""
    keys = {}
    for device in devices:
        reading = next((r for r in readings if r.is_device(device)), None)
        if reading is not None:
            keys[device] = reading.key
    return keys


def held_outside(devices: list[str], readings: list[GpuReading]) -> dict[str, str]:
    """Who holds each of `devices` outside this daemon, in words, for those held: another daemon's job (its
    lease), else a process outside tfrun with more than GPU_FOREIGN_BYTES of its memory. The leases are read,
    never claimed: that could keep another daemon's job from starting."""
    found = {}
    for device, key in lease_keys(devices, readings).items():
        reading = next(r for r in readings if r.is_device(device))
        try:
            holder = gpulease.held_by(lease_folder(), key)
            why = gpulease.describe(holder) if holder is not None else foreign_use(reading)
        except gpulease.LeaseError as exc:
            why = str(exc)
        if why is not None:
            found[device] = why
    return found


def foreign_use(reading: GpuReading) -> Optional[str]:
    """The process holding the most of the GPU's memory, in words, if that is more than GPU_FOREIGN_BYTES."""
    biggest = max(reading.processes, key=lambda p: p.used, default=None)
    if biggest is None or biggest.used <= GPU_FOREIGN_BYTES:
        return None
    return f"a process of uid {_uid_of(biggest.pid)} (pid {biggest.pid}, {biggest.used / (1 << 30):.1f} GiB)"


def _uid_of(pid: int) -> str:
    try:
        return str(os.stat(f"/proc/{pid}").st_uid)
    except OSError:
        return "?"  # gone, or hidden by /proc's hidepid


def _text(value: object) -> str:
    """NVML's strings: bytes in older nvidia-ml-py releases, str in newer ones."""
    return value.decode() if isinstance(value, bytes) else str(value)
