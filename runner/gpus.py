"""The box's GPUs through NVML (nvidia-ml-py): which devices jobs are given, and their memory and load for
the gpu-memory alert rule and `tfrun gpus`.

No GPU, no driver or no NVML is a normal state: the answer is then an empty list, quietly. On machines that
cannot have a GPU, TFRUN_GPU_STANDIN names a JSON file that stands in for NVML's answer (a list of
{"index", "name", "used", "total"}, bytes, and optionally "utilization" and "uuid"), read afresh at each
look; tests use it, nothing else should.
"""

from __future__ import annotations

import json
import logging
import os
from dataclasses import dataclass
from typing import Optional

log = logging.getLogger("tfrund")
STANDIN_ENV = "TFRUN_GPU_STANDIN"


@dataclass(frozen=True)
class GpuReading:
    index: int
    name: str
    used: int  # bytes of memory
    total: int
    utilization: Optional[int] = None  # percent of the last sample period the GPU was busy
    uuid: Optional[str] = None

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
                )
                for g in json.load(f)
            ]
    except (OSError, ValueError, KeyError, TypeError) as exc:
        log.warning("%s: %s", STANDIN_ENV, exc)
        return []


def _text(value: object) -> str:
    """NVML's strings: bytes in older nvidia-ml-py releases, str in newer ones."""
    return value.decode() if isinstance(value, bytes) else str(value)
