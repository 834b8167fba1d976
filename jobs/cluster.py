"""Which worker of a multi-worker job this process is, from TF_CONFIG (TensorFlow's own variable, which tfrun
sets in every task of a `submit --nodes N` job on Slurm, runner/shim/slurmtask.py).

Under MultiWorkerMirroredStrategy every worker runs the same script and trains the same model, so the job's
outputs would be written N times: tfrun.jobs writes its metrics and checkpoints on the chief only (the task
TF_CONFIG names "chief", else worker 0, as TensorFlow decides), and other code can ask the same:

    from tfrun.jobs import is_chief
    if is_chief():
        model.save("final.keras")

A process without TF_CONFIG (any job of one node) is the chief of a cluster of one. Standard library only,
Python 3.8.
"""

import json
import os


def tf_config():
    """TF_CONFIG as a dict; empty where it is unset or not a JSON object."""
    try:
        config = json.loads(os.environ.get("TF_CONFIG") or "{}")
    except ValueError:
        return {}
    return config if isinstance(config, dict) else {}


def num_workers():
    """How many processes train together: the chief and the workers TF_CONFIG names, at least 1."""
    cluster = tf_config().get("cluster") or {}
    return max(1, sum(len(cluster.get(kind) or ()) for kind in ("chief", "worker")))


def task_index():
    """This process's task index among its kind (0 without TF_CONFIG)."""
    return int((tf_config().get("task") or {}).get("index") or 0)


def is_chief():
    """Whether this process writes the job's outputs: TF_CONFIG's chief, else worker 0, else True alone."""
    config = tf_config()
    task = config.get("task") or {}
    if task.get("type") in (None, "chief"):
        return True
    has_chief = bool((config.get("cluster") or {}).get("chief"))
    return task.get("type") == "worker" and int(task.get("index") or 0) == 0 and not has_chief
