"""What the job interpreter's TensorFlow sees, for `tfrund doctor`: run as a script, prints one JSON line.

    {"python": "3.8.10", "tensorflow": "2.9.0", "cuda_build": true, "cuda": "11.2", "cudnn": "8",
     "gpus": ["/physical_device:GPU:0"], "memory_growth": "ok"}

Runs in the job's own interpreter (the daemon's may have no TensorFlow), with nothing but the standard
library and TensorFlow, Python 3.8. A missing or broken TensorFlow is reported, not raised.
"""

import json
import os
import platform
import sys


def probe():
    found = {"python": platform.python_version(), "executable": sys.executable}
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    try:
        import tensorflow as tf
    except Exception as exc:  # ImportError, or a TensorFlow that fails to load its libraries
        found["error"] = f"{type(exc).__name__}: {(str(exc).splitlines() or [''])[0]}"  # the daemon shortens it
        return found
    found["tensorflow"] = tf.__version__
    found["cuda_build"] = tf.test.is_built_with_cuda()
    try:
        info = tf.sysconfig.get_build_info()
        found["cuda"] = info.get("cuda_version")
        found["cudnn"] = info.get("cudnn_version")
    except Exception:  # older builds have no build info
        pass
    gpus = tf.config.list_physical_devices("GPU")
    found["gpus"] = [gpu.name for gpu in gpus]
    growth = "n/a"
    for gpu in gpus:
        try:
            tf.config.experimental.set_memory_growth(gpu, True)
            growth = "ok"
        except RuntimeError as exc:
            growth = str(exc)
    found["memory_growth"] = growth
    return found


if __name__ == "__main__":
    print(json.dumps(probe()))
