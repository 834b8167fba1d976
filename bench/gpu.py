#!/usr/bin/env python3
"""On a machine with NVIDIA GPUs: a real GPU job under tfrund, and what it and NVML see. Run by hand.

    .venv/bin/python -m bench.gpu [--python PYTHON_WITH_TENSORFLOW]

Starts a daemon in a temporary home (devices from NVML, nothing configured), submits one `--gpus 1` job
that lists the GPUs TensorFlow sees and holds one busy with a matrix product for a few seconds, and checks:
the job's CUDA_VISIBLE_DEVICES is the device `tfrun gpus` says it holds, TensorFlow sees exactly one GPU,
and NVML's memory figure for that device rose while the job ran. Prints what it saw; exits 1 if a check
failed, 2 if there is no GPU here.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

from tests.harness import Tfrun, wait_for

JOB = """
import os, time
import tensorflow as tf
gpus = tf.config.list_physical_devices("GPU")
print("CUDA_VISIBLE_DEVICES=" + os.environ.get("CUDA_VISIBLE_DEVICES", "unset"), flush=True)
print(f"tensorflow sees {len(gpus)} GPU(s): {[g.name for g in gpus]}", flush=True)
x = tf.random.normal([8192, 8192])
end = time.time() + 8
while time.time() < end:
    x = tf.linalg.matmul(x, x) / 8192.0
print("done", float(tf.reduce_sum(x)), flush=True)
"""


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--python", default=sys.executable, help="the job interpreter (with TensorFlow)")
    python = parser.parse_args().python
    with tempfile.TemporaryDirectory() as tmp:
        tf = Tfrun(Path(tmp) / "home")
        try:
            gpus = json.loads(tf.ok("gpus", "--json"))
            if not gpus:
                print("no GPU here (NVML sees none): nothing to check")
                return 2
            print("GPUs:", ", ".join(f"{g['device']} {g['name']} {g['memory_used'] >> 20} MiB used" for g in gpus))
            before = {g["device"]: g["memory_used"] for g in gpus}
            project = Path(tmp) / "project"
            project.mkdir()
            (project / "gpu_job.py").write_text(JOB)
            job = tf.submit("--gpus", "1", "--python", python, str(project / "gpu_job.py"))
            wait_for(lambda: b"tensorflow sees" in tf.log(job), timeout=120, what="TensorFlow to start")
            time.sleep(2)
            during = {g["device"]: g for g in json.loads(tf.ok("gpus", "--json"))}
            held = [d for d, g in during.items() if g["job"] == job]
            log = tf.log(job).decode()
            seen = next(line for line in log.splitlines() if line.startswith("CUDA_VISIBLE_DEVICES="))
            checks = {
                "the job holds one device": len(held) == 1,
                "its CUDA_VISIBLE_DEVICES is that device": held and seen == f"CUDA_VISIBLE_DEVICES={held[0]}",
                "TensorFlow sees exactly one GPU": "tensorflow sees 1 GPU(s)" in log,
                "NVML's memory figure rose": held and during[held[0]]["memory_used"] > before[held[0]],
            }
            tf.run("wait", str(job), timeout=300)
            print(log)
            for what, ok in checks.items():
                print(f"{'ok  ' if ok else 'FAIL'}  {what}")
            return 0 if all(checks.values()) else 1
        finally:
            tf.cleanup()


if __name__ == "__main__":
    sys.exit(main())
