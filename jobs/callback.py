"""The Keras callback: exact per-step metrics, checkpoints on the volume, a stop on NaN.

    checkpoints = Checkpoints(model=model, optimizer=model.optimizer)
    model.fit(data, epochs=10, initial_epoch=checkpoints.epoch, callbacks=[TfrunCallback(checkpoints)])

Works on Keras 2.9 (TF 2.9, Python 3.8, the container) and Keras 3: it only reads `self.model` (never
assigns it), takes no `options=`, and uses nothing from tf.keras.callbacks.experimental. The step count
lives in a Python int during training and reaches the checkpoint's variable only when it is saved, so
a step costs a dictionary walk and a buffered write, not a TensorFlow op.
"""

import tensorflow as tf

from tfrun.jobs.metrics import MetricWriter, is_bad


class TfrunCallback(tf.keras.callbacks.Callback):
    """Metrics each step, a checkpoint every `save_every_epochs` epochs and/or `save_every_steps` steps."""

    def __init__(self, checkpoints=None, save_every_epochs=1, save_every_steps=None, stop_on_nan=True, metrics=None):
        super().__init__()
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

    def on_train_begin(self, logs=None):
        self.step = self._saved_at = self.checkpoints.step if self.checkpoints is not None else 0

    def on_epoch_begin(self, epoch, logs=None):
        self.epoch = epoch
        self._epoch_began_at = self.step

    def on_train_batch_end(self, batch, logs=None):
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
        validation = {k: v for k, v in (logs or {}).items() if k.startswith("val_")}
        if validation:
            self.metrics.write(self.step, epoch, **validation)
        if self.stopped_on_nan:
            return
        if self.save_every_epochs and (epoch + 1) % self.save_every_epochs == 0:
            self._save(epoch + 1)

    def on_train_end(self, logs=None):
        self.metrics.flush()

    def _save(self, epochs_done):
        self._saved_at = self.step
        if self.checkpoints is not None:
            self.checkpoints.save(step=self.step, epoch=epochs_done)
