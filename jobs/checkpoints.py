"""Training state on the checkpoint volume: restored when a job starts, saved as it trains.

A job that was cancelled, lost, OOM-killed or restarted runs the same script again with the same
TFRUN_CHECKPOINT_DIR; `Checkpoints` finds the latest checkpoint there and restores the model, the
optimizer and the epoch and step counters from it, so training continues where it stopped. Saving goes
through tf.train.CheckpointManager, which writes a new checkpoint beside the old ones and keeps the last
`keep`: a job killed in the middle of a save still has the previous one.

    checkpoints = Checkpoints(model=model, optimizer=optimizer)     # restores, if there is anything
    model.fit(data, epochs=10, initial_epoch=checkpoints.epoch, callbacks=[TfrunCallback(checkpoints)])

With object storage (submit --checkpoints-to), the daemon copies each checkpoint there once it is complete,
and `keep` deletes an old checkpoint only once the daemon has stored it (it names those in the file that
TFRUN_CHECKPOINTS_STORED gives): a storage outage makes the folder grow, never lose a checkpoint.

In a job of several workers (MultiWorkerMirroredStrategy) every worker must call `save`, since saving takes
part in the strategy's collective ops, but only the chief's checkpoint is kept: the others save into a
temporary folder of their own, removed when the process exits (TensorFlow's documented pattern). Every
worker restores from the job's folder, so all of them resume from the chief's checkpoint.

Uses tf.train.Checkpoint, which Keras 2.9 and Keras 3 (TensorFlow backend) models both support.
Python 3.8, standard library and TensorFlow only.
"""

import atexit
import json
import os
import shutil
import tempfile

import tensorflow as tf

from .cluster import is_chief, task_index

CHECKPOINT_DIR_ENV = "TFRUN_CHECKPOINT_DIR"
STORED_ENV = "TFRUN_CHECKPOINTS_STORED"  # set by tfrund for a job with object storage: the file naming what is stored
_COUNTERS = ("step", "epoch", "epoch_step")  # steps trained, epochs finished, the step the epoch began at


class Checkpoints:
    """The job's checkpoints: restored at construction (unless `restore=False`), saved by `save()`.

    `trackables` are what tf.train.Checkpoint takes: `model=`, `optimizer=`, anything with variables.
    """

    def __init__(self, directory=None, keep=3, restore=True, **trackables):
        self.directory = directory or os.environ.get(CHECKPOINT_DIR_ENV) or "checkpoints"
        self._counters = {
            name: tf.Variable(0, dtype=tf.int64, trainable=False, name="tfrun_" + name) for name in _COUNTERS
        }
        model = trackables.get("model")
        _build_optimizer(trackables.get("optimizer"), model)
        if model is not None and getattr(model, "built", False):
            # Keras 3 models do not list their variables to tf.train.Checkpoint: list them ourselves.
            trackables["tfrun_model_weights"] = list(model.weights)
        self.checkpoint = tf.train.Checkpoint(
            **{"tfrun_" + name: variable for name, variable in self._counters.items()}, **trackables
        )
        saved_in = self.directory
        if not is_chief():
            saved_in = tempfile.mkdtemp(prefix=f"tfrun-worker{task_index()}-")
            atexit.register(shutil.rmtree, saved_in, True)
            keep = 1
        self.keep = keep
        self._stored_list = os.environ.get(STORED_ENV) if saved_in == self.directory else None
        # With storage, the manager keeps everything and `save` deletes only what the daemon stored.
        managed = None if self._stored_list else keep
        self.manager = tf.train.CheckpointManager(self.checkpoint, saved_in, max_to_keep=managed)
        self.step, self.epoch, self.epoch_step = 0, 0, 0
        self.restored_from = None
        if restore:
            self.restore()

    def restore(self):
        """Load the latest checkpoint in the folder, if there is one; return its path or None."""
        latest = tf.train.latest_checkpoint(self.directory)  # the chief's, on every worker
        if latest is None:
            return None
        self.checkpoint.restore(latest).expect_partial()
        self.step, self.epoch, self.epoch_step = (int(self._counters[n].numpy()) for n in _COUNTERS)
        self.restored_from = latest
        print(f"tfrun: resumed from {latest} (epoch {self.epoch}, step {self.step})", flush=True)
        return latest

    def save(self, step, epoch, epoch_step=None):
        """A checkpoint of everything after `step` steps and `epoch` finished epochs (`epoch_step`: the step
        at which the unfinished epoch began, by default the step itself). Keeps the last `keep`."""
        self.step, self.epoch = int(step), int(epoch)
        self.epoch_step = self.step if epoch_step is None else int(epoch_step)
        for name in _COUNTERS:
            self._counters[name].assign(getattr(self, name))
        path = self.manager.save(checkpoint_number=self.step)
        if self._stored_list:
            self._delete_stored_beyond_keep()
        return path

    def _delete_stored_beyond_keep(self):
        """Delete the checkpoints older than the newest `keep` that the daemon has stored; the others wait."""
        try:
            with open(self._stored_list) as f:
                stored = set(json.load(f))
        except (OSError, ValueError):
            return
        kept = getattr(self.manager, "_maybe_delete", None)
        record = getattr(self.manager, "_record_state", None)
        if kept is None or record is None:  # a TensorFlow without them: keep everything rather than guess
            return
        for prefix in list(self.manager.checkpoints)[: -self.keep or None]:
            if os.path.basename(prefix) not in stored:
                continue
            for path in tf.io.gfile.glob(prefix + ".*"):
                tf.io.gfile.remove(path)
            kept.pop(prefix, None)
        record()


def _build_optimizer(optimizer, model):
    """Create the optimizer's variables before a restore, where its Keras makes them only at the first step.

    Keras 3 (and Keras 2.11 and later) build optimizer variables lazily, and a restore into an optimizer
    that has none would leave its state (Adam's moments, its step count) behind. Keras 2.9's optimizers
    take a deferred restore by themselves.
    """
    build = getattr(optimizer, "build", None)
    if callable(build) and model is not None and getattr(model, "built", False) and not _built(optimizer):
        build(model.trainable_variables)


def _built(optimizer):
    """Whether the optimizer has its variables: Keras 3 says `built`, Keras 2.11+ `_built`."""
    for attribute in ("built", "_built"):
        if hasattr(optimizer, attribute):
            return bool(getattr(optimizer, attribute))
    return False
