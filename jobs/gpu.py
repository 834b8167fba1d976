"""GPU setup for a training job: memory growth on every GPU, optional mixed precision, a strategy that
uses every visible GPU (and every node of a `submit --nodes N` job), and one line saying what was found.

    strategy = setup_gpus()            # prints: tfrun: TensorFlow 2.9.0, 2 GPU(s) ...
    with strategy.scope():
        model = build_model()

Without memory growth TensorFlow takes nearly all of every GPU's memory at start, so a second process
(another job, an evaluation, nvidia-smi's own context) fails with an out-of-memory error; tfrund also sets
TF_FORCE_GPU_ALLOW_GROWTH=true for jobs unless the job's environment says otherwise. Growth has to be set
before TensorFlow first touches a GPU: call this first.

Where TF_CONFIG names more than one worker (a `submit --nodes N` job on Slurm, runner/shim/slurmtask.py), the
strategy is MultiWorkerMirroredStrategy over them all, each with its local GPUs (TensorFlow wants it made at
the start too, before other ops). With Keras 3, `model.fit` under it fails (keras-team/keras#20585): use
tf-keras (`pip install tf-keras`, TF_USE_LEGACY_KERAS=1). Python 3.8, standard library and TensorFlow only.
"""

import tensorflow as tf

from .cluster import num_workers, task_index


def setup_gpus(mixed_precision=False, memory_growth=True, report=True):
    """Configure TensorFlow's GPUs and return the distribution strategy to build the model under."""
    gpus = tf.config.list_physical_devices("GPU")
    growth = "off"
    if memory_growth and gpus:
        growth = "on"
        for gpu in gpus:
            try:
                tf.config.experimental.set_memory_growth(gpu, True)
            except RuntimeError:  # TensorFlow already initialised the GPUs: too late to change
                growth = "unchanged (GPUs already initialised; call setup_gpus() first)"
    if mixed_precision:
        tf.keras.mixed_precision.set_global_policy("mixed_float16")
    workers = num_workers()
    if workers > 1:
        strategy = tf.distribute.MultiWorkerMirroredStrategy()
        spread = f"MultiWorkerMirroredStrategy over {workers} workers, this one {task_index()}"
    elif len(gpus) > 1:
        strategy = tf.distribute.MirroredStrategy()
        spread = f"MirroredStrategy over {len(gpus)} GPUs"
    else:
        strategy, spread = tf.distribute.get_strategy(), "one device"
    if report:
        names = ", ".join(_name(gpu) for gpu in gpus) or "none, training on the CPU"
        print(
            "tfrun: TensorFlow {}, {} GPU(s): {}; memory growth {}; mixed precision {}; {}".format(
                tf.__version__,
                len(gpus),
                names,
                growth if gpus else "n/a",
                "on" if mixed_precision else "off",
                spread,
            ),
            flush=True,
        )
    return strategy


def _name(gpu):
    try:
        return tf.config.experimental.get_device_details(gpu).get("device_name", gpu.name)
    except (AttributeError, ValueError, RuntimeError):
        return gpu.name
