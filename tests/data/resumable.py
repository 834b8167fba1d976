"""A job for the resume tests: trains a small model with tfrun.jobs, reports what it restored and saved.

    resumable.py fit|loop EPOCHS STEPS_PER_EPOCH HANG_AT_STEP

Prints `start step S epoch E digest D` after restoring, `saved step S epoch E digest D` after each save,
and `done step S iterations I` at the end; D is a SHA-256 of every weight. The first time a save reaches
HANG_AT_STEP it leaves a marker in the checkpoint folder and hangs, for the test to kill it with SIGKILL;
a restarted run finds the marker and trains on. Python 3.8 syntax: it also runs under TF 2.15.
"""

import hashlib
import os
import sys
import time

import numpy as np
import tensorflow as tf

from tfrun.jobs import Checkpoints, Progress, TfrunCallback

mode, epochs, steps, hang_at = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
marker = os.path.join(os.environ["TFRUN_CHECKPOINT_DIR"], "hung-once")
tf.keras.utils.set_random_seed(0)
x = np.random.rand(steps * 8, 4).astype("float32")
y = (x.sum(axis=1) > 2).astype("float32")
layers = [tf.keras.Input((4,)), tf.keras.layers.Dense(8, activation="relu"), tf.keras.layers.Dense(1)]
model = tf.keras.Sequential(layers)
model.compile(optimizer=tf.keras.optimizers.Adam(0.01), loss=tf.keras.losses.BinaryCrossentropy(from_logits=True))


def digest():
    h = hashlib.sha256()
    for weight in model.weights:
        h.update(np.ascontiguousarray(weight.numpy()).tobytes())
    return h.hexdigest()[:16]


class Reporting(Checkpoints):
    def save(self, step, epoch, epoch_step=None):
        path = super().save(step, epoch, epoch_step)
        print(f"saved step {self.step} epoch {self.epoch} digest {digest()}", flush=True)
        if self.step >= hang_at and not os.path.exists(marker):
            open(marker, "w").close()
            print("hanging", flush=True)
            time.sleep(600)
        return path


checkpoints = Reporting(model=model, optimizer=model.optimizer)
print(f"start step {checkpoints.step} epoch {checkpoints.epoch} digest {digest()}", flush=True)


class Slow(tf.keras.callbacks.Callback):
    def on_train_batch_end(self, batch, logs=None):
        time.sleep(0.01)


if mode == "fit":
    model.fit(x, y, batch_size=8, epochs=epochs, initial_epoch=checkpoints.epoch, verbose=0,
              callbacks=[TfrunCallback(checkpoints), Slow()])  # fmt: skip
    final = checkpoints.step
else:
    progress = Progress(checkpoints, save_every_steps=7)
    dataset = tf.data.Dataset.from_tensor_slices((x, y)).batch(8)
    loss_fn = tf.keras.losses.BinaryCrossentropy(from_logits=True)

    @tf.function
    def train_step(features, labels):
        with tf.GradientTape() as tape:
            loss = loss_fn(labels[:, None], model(features, training=True))
        grads = tape.gradient(loss, model.trainable_variables)
        model.optimizer.apply_gradients(zip(grads, model.trainable_variables))
        return loss

    for _ in progress.epochs(epochs):
        for features, labels in dataset.skip(progress.step_in_epoch):
            progress.report(loss=float(train_step(features, labels)))
            time.sleep(0.01)
    final = progress.step
print(f"done step {final} iterations {int(model.optimizer.iterations.numpy())}", flush=True)
