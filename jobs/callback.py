"""The Keras callback: exact per-step metrics, checkpoints on the volume, a stop on NaN.

    checkpoints = Checkpoints(model=model, optimizer=model.optimizer)
    model.fit(data, epochs=10, initial_epoch=checkpoints.epoch, callbacks=[TfrunCallback(checkpoints)])

Works on Keras 2.9 (TF 2.9, Python 3.8, the container) and Keras 3: it only reads `self.model` (never
assigns it), takes no `options=`, and uses nothing from tf.keras.callbacks.experimental. The step count
lives in a Python int during training and reaches the checkpoint's variable only when it is saved, so
a step costs a dictionary walk and a buffered write, not a TensorFlow op.

With `tensorboard=True` it also writes TensorBoard summaries to TFRUN_TENSORBOARD_DIR (what `tfrun
tensorboard` shows) through Keras's own TensorBoard callback, which it carries and calls at each hook.
"""

import os

import tensorflow as tf

from .metrics import MetricWriter, is_bad

TENSORBOARD_DIR_ENV = "TFRUN_TENSORBOARD_DIR"


class TfrunCallback(tf.keras.callbacks.Callback):
    """Metrics each step, a checkpoint every `save_every_epochs` epochs and/or `save_every_steps` steps, and
    with `tensorboard` TensorBoard summaries (True: in TFRUN_TENSORBOARD_DIR, else in the folder given)."""

    def __init__(
        self,
        checkpoints=None,
        save_every_epochs=1,
        save_every_steps=None,
        stop_on_nan=True,
        metrics=None,
        tensorboard=False,
    ):
        super().__init__()
        folder = os.environ.get(TENSORBOARD_DIR_ENV) if tensorboard is True else tensorboard or None
        self.tensorboard = tf.keras.callbacks.TensorBoard(log_dir=folder) if folder else None
        self.checkpoints = checkpoints
        self.save_every_epochs = save_every_epochs
        self.save_every_steps = save_every_steps
        self.stop_on_nan = stop_on_nan
        self.metrics = metrics if metrics is not None else MetricWriter()
        self.step = 0
        self.epoch = 0
        self.stopped_on_nan = False
        self._epoch_began_at = 0  # the step count when this epoch began
        self._saved_at = 0  # the step count at the last checkpoint

    # -- Keras's TensorBoard callback, when asked for, sees every hook it uses ----------------------------

    def set_model(self, model):
        super().set_model(model)
        if self.tensorboard is not None:
            self.tensorboard.set_model(model)

    def set_params(self, params):
        super().set_params(params)
        if self.tensorboard is not None:
            self.tensorboard.set_params(params)

    def _tensorboard(self, hook, *args):
        if self.tensorboard is not None:
            getattr(self.tensorboard, hook)(*args)

    def on_train_batch_begin(self, batch, logs=None):
        self._tensorboard("on_train_batch_begin", batch, logs)

    def on_test_begin(self, logs=None):
        self._tensorboard("on_test_begin", logs)

    def on_test_end(self, logs=None):
        self._tensorboard("on_test_end", logs)

    # -- metrics, checkpoints, the stop on NaN ------------------------------------------------------------

    def on_train_begin(self, logs=None):
        self.step = self._saved_at = self.checkpoints.step if self.checkpoints is not None else 0
        self._tensorboard("on_train_begin", logs)

    def on_epoch_begin(self, epoch, logs=None):
        self.epoch = epoch
        self._epoch_began_at = self.step
        self._tensorboard("on_epoch_begin", epoch, logs)

    def on_train_batch_end(self, batch, logs=None):
        self._tensorboard("on_train_batch_end", batch, logs)
        # From Keras's batch index, not a count of calls: with steps_per_execution=N, Keras calls this once
        # every N steps, with the index of the last of them.
        self.step = self._epoch_began_at + batch + 1
        logs = logs or {}
        self.metrics.write(self.step, self.epoch, **logs)
        if self.stop_on_nan and is_bad(logs.get("loss")):
            self.stopped_on_nan = True
            print("tfrun: loss is {} at step {}: stopping".format(logs.get("loss"), self.step), flush=True)
            self.model.stop_training = True
            return
        if self.save_every_steps and self.step // self.save_every_steps > self._saved_at // self.save_every_steps:
            self._save(self.epoch)

    def on_epoch_end(self, epoch, logs=None):
        self._tensorboard("on_epoch_end", epoch, logs)
        validation = {k: v for k, v in (logs or {}).items() if k.startswith("val_")}
        if validation:
            self.metrics.write(self.step, epoch, **validation)
        if self.stopped_on_nan:
            return
        if self.save_every_epochs and (epoch + 1) % self.save_every_epochs == 0:
            self._save(epoch + 1)

    def on_train_end(self, logs=None):
        self.metrics.flush()
        self._tensorboard("on_train_end", logs)

    def _save(self, epochs_done):
        self._saved_at = self.step
        if self.checkpoints is not None:
            self.checkpoints.save(step=self.step, epoch=epochs_done)
