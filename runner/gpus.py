"""The GPUs' memory, through NVML (nvidia-ml-py): what the gpu-memory alert rule watches.

No GPU, no driver or no NVML is a normal state: the answer is then an empty list, quietly. On machines that
cannot have a GPU, TFRUN_GPU_STANDIN names a JSON file that stands in for NVML's answer (a list of
{"index", "name", "used", "total"}, bytes), read afresh at each look; tests use it, nothing else should.
"""

from __future__ import annotations

import json
import logging
import os
from dataclasses import dataclass

log = logging.getLogger("tfrund")
STANDIN_ENV = "TFRUN_GPU_STANDIN"


@dataclass(frozen=True)
class GpuMemory:
    index: int
    name: str
    used: int  # bytes
    total: int


def read_gpu_memory() -> list[GpuMemory]:
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
            name = pynvml.nvmlDeviceGetName(handle)
            gpus.append(
                GpuMemory(index, name.decode() if isinstance(name, bytes) else str(name), memory.used, memory.total)
            )
        return gpus
    except pynvml.NVMLError as exc:
        log.warning("NVML: %s", exc)
        return []
    finally:
        pynvml.nvmlShutdown()


def _from_standin(path: str) -> list[GpuMemory]:
    try:
        with open(path) as f:
            return [GpuMemory(int(g["index"]), str(g["name"]), int(g["used"]), int(g["total"])) for g in json.load(f)]
    except (OSError, ValueError, KeyError, TypeError) as exc:
        log.warning("%s: %s", STANDIN_ENV, exc)
        return []
