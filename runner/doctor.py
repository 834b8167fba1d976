"""`tfrund doctor` / `tfrun doctor`: is this box ready to train? One line per check, each passing or saying
what to do, after the check script of ../shared/seeds/004: the job interpreter and its TensorFlow (built
with CUDA, the GPUs it sees, memory growth), the driver as nvidia-smi reports it, and the checkpoint root.

TensorFlow is probed in the job interpreter (tfrun/jobs/probe.py), never in the daemon's, which may have
none. No GPU at all is a warning, not a failure: CPU boxes are allowed; a GPU that nvidia-smi sees and
TensorFlow does not is a failure, since that job would silently train on the CPU.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any, Optional

import tfrun
from tfrun.protocol import Check

OK, WARN, FAIL = "ok", "warn", "fail"
_PROBE = Path(tfrun.__file__).parent / "jobs" / "probe.py"
_PROBE_TIMEOUT_S = 180  # importing TensorFlow on a cold disk takes a while
_LOW_SPACE_BYTES = 10 * 10**9


def run_checks(checkpoint_root: Path, python: str) -> list[Check]:
    """Every check, in the order a person would fix things."""
    checks: list[Check] = []
    interpreter = _interpreter(python)
    checks.append(interpreter[0])
    smi = _nvidia_smi()
    checks.extend(smi[0])
    if interpreter[1] is not None:
        checks.extend(_tensorflow(interpreter[1], gpus_by_driver=smi[1]))
    checks.append(_growth_default())
    checks.append(_checkpoint_root(checkpoint_root))
    return checks


def job_python(configured: Optional[str]) -> str:
    """The interpreter a .py job gets by default: the setting, else python3 on the daemon's PATH, else the
    daemon's own."""
    return configured or shutil.which("python3") or sys.executable


def _interpreter(python: str) -> tuple[Check, Optional[str]]:
    found = python if os.sep in python else shutil.which(python)
    if found is None or not os.access(found, os.X_OK):
        return Check("job python", FAIL, f"{python} is not an executable", "set job_python to one"), None
    return Check("job python", OK, found), found


def _tensorflow(python: str, gpus_by_driver: int) -> list[Check]:
    try:
        result = subprocess.run(
            [python, str(_PROBE)], capture_output=True, text=True, timeout=_PROBE_TIMEOUT_S, stdin=subprocess.DEVNULL
        )
        found: dict[str, Any] = json.loads(result.stdout.strip().splitlines()[-1])
    except (OSError, subprocess.TimeoutExpired, ValueError, IndexError) as exc:
        return [Check("tensorflow", FAIL, f"could not run the probe in {python}: {exc}")]
    if "error" in found:
        advice = f"install TensorFlow for {python}, or point job_python at an interpreter that has it"
        return [Check("tensorflow", FAIL, f"not importable ({found['error']})", advice)]
    checks = [Check("tensorflow", OK, f"{found['tensorflow']} on Python {found['python']}")]
    cuda = found.get("cuda_build")
    versions = ", ".join(f"{k} {found[k]}" for k in ("cuda", "cudnn") if found.get(k)) or "no CUDA"
    if cuda:
        checks.append(Check("built with CUDA", OK, versions))
    else:
        checks.append(Check("built with CUDA", WARN if not gpus_by_driver else FAIL, "no: a CPU-only build",
                            "install the GPU build (the tensorflow/tensorflow:*-gpu image has it)"))  # fmt: skip
    gpus = found.get("gpus") or []
    if gpus:
        checks.append(Check("GPUs seen by TensorFlow", OK, f"{len(gpus)}: {', '.join(gpus)}"))
    elif gpus_by_driver:
        checks.append(Check("GPUs seen by TensorFlow", FAIL, f"none, though nvidia-smi sees {gpus_by_driver}",
                            "a CUDA/cuDNN this TensorFlow was not built for (TF 2.9 needs CUDA 11.2 and cuDNN "
                            "8.1), or LD_LIBRARY_PATH lacks the CUDA libraries"))  # fmt: skip
    else:
        checks.append(Check("GPUs seen by TensorFlow", WARN, "none: jobs train on the CPU"))
    growth = found.get("memory_growth")
    if gpus:
        status = OK if growth == "ok" else FAIL
        checks.append(Check("memory growth", status, "applied on every GPU" if status == OK else str(growth)))
    return checks


def _nvidia_smi() -> tuple[list[Check], int]:
    """(checks, how many GPUs the driver reports)."""
    smi = shutil.which("nvidia-smi")
    if smi is None:
        advice = "on a GPU host, run the container with --gpus all (NVIDIA Container Toolkit)"
        return [Check("NVIDIA driver", WARN, "nvidia-smi not found: no GPU visible", advice)], 0
    try:
        listing = subprocess.run(
            [smi, "--query-gpu=name,driver_version,memory.total", "--format=csv,noheader"],
            capture_output=True, text=True, timeout=60,
        )  # fmt: skip
        header = subprocess.run([smi], capture_output=True, text=True, timeout=60).stdout
    except (OSError, subprocess.TimeoutExpired) as exc:
        return [Check("NVIDIA driver", FAIL, f"nvidia-smi failed: {exc}")], 0
    if listing.returncode != 0:
        reason = (listing.stderr or listing.stdout).strip().splitlines()
        return [Check("NVIDIA driver", FAIL, f"nvidia-smi: {reason[0] if reason else 'failed'}")], 0
    rows = [[part.strip() for part in line.split(",")] for line in listing.stdout.strip().splitlines() if line]
    cuda = next(
        (line.split("CUDA Version:")[1].split()[0] for line in header.splitlines() if "CUDA Version:" in line), "?"
    )
    driver = rows[0][1] if rows and len(rows[0]) > 1 else "?"
    names = "; ".join(f"{row[0]} ({row[2]})" if len(row) > 2 else row[0] for row in rows)
    return [Check("NVIDIA driver", OK, f"driver {driver}, CUDA {cuda}; {len(rows)} GPU(s): {names}")], len(rows)


def _growth_default() -> Check:
    value = os.environ.get("TF_FORCE_GPU_ALLOW_GROWTH")
    if value is None or value.lower() == "true":
        return Check("GPU memory growth for jobs", OK, "TF_FORCE_GPU_ALLOW_GROWTH=true unless a job sets it")
    return Check("GPU memory growth for jobs", WARN, f"the daemon's environment sets TF_FORCE_GPU_ALLOW_GROWTH={value}",
                 "each job takes all of every GPU's memory; unset it to share GPUs")  # fmt: skip


def _checkpoint_root(root: Path) -> Check:
    try:
        root.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=root, prefix=".tfrun-doctor-"):
            pass
        free = shutil.disk_usage(root).free
    except OSError as exc:
        return Check("checkpoint root", FAIL, f"{root} is not writable: {exc.strerror or exc}",
                     "mount a writable volume there, or set checkpoint_root")  # fmt: skip
    detail = f"{root}: writable, {free / 1e9:.1f} GB free"
    if free < _LOW_SPACE_BYTES:
        return Check("checkpoint root", WARN, detail, "under 10 GB: checkpoints of a large model may not fit")
    return Check("checkpoint root", OK, detail)
