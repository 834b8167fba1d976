"""Code that runs inside a training process, and example training jobs.

Imported by the job's own interpreter (Python 3.8 with TF 2.9 in the container, newer elsewhere), so it
uses nothing but the standard library and TensorFlow, in Python 3.8 syntax. tfrund puts a folder holding
only this package on every job's PYTHONPATH: nothing is installed into the job's interpreter.

    from tfrun.jobs import Checkpoints, TfrunCallback, Progress, setup_gpus, is_chief

    metrics.py      MetricWriter: exact per-step metrics as JSON lines for the daemon
    checkpoints.py  Checkpoints: restore at start, save to TFRUN_CHECKPOINT_DIR, keep the last K
    callback.py     TfrunCallback: the Keras callback (metrics, checkpoints, stop on NaN)
    progress.py     Progress: the same for custom training loops
    gpu.py          setup_gpus: memory growth, mixed precision, the strategy (Mirrored, or MultiWorkerMirrored
                    for a job of several nodes), a report line
    cluster.py      is_chief: which worker of a multi-worker job this is, from TF_CONFIG
    probe.py        what this interpreter's TensorFlow sees, for `tfrund doctor` (run as a script)

Names are imported on first use, so `import tfrun.jobs` costs nothing and needs no TensorFlow.
"""

import importlib

_EXPORTS = {
    "MetricWriter": "metrics",
    "Checkpoints": "checkpoints",
    "TfrunCallback": "callback",
    "Progress": "progress",
    "setup_gpus": "gpu",
    "is_chief": "cluster",
}
__all__ = sorted(_EXPORTS)


def __getattr__(name):
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'tfrun.jobs' has no attribute {name!r}")
    return getattr(importlib.import_module("tfrun.jobs." + module), name)
