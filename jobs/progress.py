"""The same for a custom training loop (`for batch in dataset: train_step(batch)`): counting, metrics,
checkpoints, resume, and a stop on NaN, with the loop kept as the user wrote it.

    checkpoints = Checkpoints(model=model, optimizer=optimizer)
    progress = Progress(checkpoints, save_every_steps=100)
    for epoch in progress.epochs(10):                       # starts at the restored epoch
        for batch in dataset.skip(progress.step_in_epoch):  # and, mid-epoch, at the restored step
            loss = train_step(batch)
            if not progress.report(loss=loss):              # False after a NaN loss: stop
                break

Python 3.8, standard library and TensorFlow (through Checkpoints) only.
"""

from .metrics import MetricWriter, is_bad


class Progress:
    """Counts steps and epochs from where the checkpoint left them; saves every N steps and each epoch."""

    def __init__(self, checkpoints=None, save_every_steps=None, save_every_epochs=1, stop_on_nan=True,
                 metrics=None):  # fmt: skip
        self.checkpoints = checkpoints
        self.save_every_steps = save_every_steps
        self.save_every_epochs = save_every_epochs
        self.stop_on_nan = stop_on_nan
        self.metrics = metrics if metrics is not None else MetricWriter()
        self.step = checkpoints.step if checkpoints is not None else 0
        self.epoch = checkpoints.epoch if checkpoints is not None else 0
        self._epoch_started_at = checkpoints.epoch_step if checkpoints is not None else 0
        self.stopped = False

    @property
    def step_in_epoch(self):
        """Steps of the current epoch already trained (by an earlier run of the job): batches to skip."""
        return self.step - self._epoch_started_at

    def epochs(self, total):
        """The epoch numbers still to train, from the restored one; a checkpoint after each finished one."""
        while self.epoch < total and not self.stopped:
            yield self.epoch
            if self.stopped:
                break
            self.epoch += 1
            self._epoch_started_at = self.step
            if self.save_every_epochs and self.epoch % self.save_every_epochs == 0:
                self.save()
        self.metrics.flush()

    def report(self, loss=None, **values):
        """One step done, with its loss and other metrics; False once training should stop (NaN loss)."""
        self.step += 1
        if loss is not None:
            values["loss"] = loss
        self.metrics.write(self.step, self.epoch, **values)
        if self.stop_on_nan and loss is not None and is_bad(loss):
            print(f"tfrun: loss is {float(loss)} at step {self.step}: stopping", flush=True)
            self.stopped = True
            return False
        if self.save_every_steps and self.step % self.save_every_steps == 0:
            self.save()
        return True

    def save(self):
        """A checkpoint now, of the step and epoch reached (`Checkpoints.save`): its path, or None without
        checkpoints."""
        if self.checkpoints is not None:
            return self.checkpoints.save(step=self.step, epoch=self.epoch, epoch_step=self._epoch_started_at)
        return None
