"""How tests/data/curves/*.jsonl and tests/data/keras3_spike.log were made: real small Keras models trained on the CPU.

    python tests/data/make_curves.py        # TensorFlow 2.21 (Keras 3), half a minute on two cores

The loss detector is judged on real loss curves, not on numbers invented to suit it. Each curve file starts
with one JSON line that says how it was made (and `spike_at`, the global step of the learning-rate bump, or
null), then one line per training step: `{"step": 1, "loss": 1.6094}`, the loss of that batch alone. A custom
loop with tf.GradientTape records it exactly: in model.fit, Keras 3 hands callbacks the epoch's running mean.

    healthy.jsonl   Adam, batch 32: the curve of a normal run
    noisy.jsonl     plain SGD, batch 4: per-batch losses that jump about while training is healthy
    spike.jsonl     Adam, batch 32, learning rate x100 from step `spike_at` on: a real divergence

keras3_spike.log is the output of model.fit (verbose=1) for the same bump, written to a file and not a TTY,
as tfrun captures a job: the progress bar with its \\r, \\b and colours, the running means and their epochs.
A short sleep per batch lets Keras redraw the bar at every step (it redraws at most every 0.05 s).
"""

import json
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import tensorflow as tf

HERE = Path(__file__).parent
FEATURES, CLASSES, SAMPLES = 20, 5, 2048
SPIKE_AT = 400  # global step (1-based) of the first batch trained with the bumped learning rate
# The same for keras3_spike.log: batch 13 of its fifth epoch (25 batches an epoch), so that the running mean Keras
# prints for that epoch hides the jump that the decoded interval means show.
LOG_SPIKE_AT = 113
BUMP = 100.0
NOISE = 0.02  # labels flipped at random: the floor of the loss


def dataset(seed):
    """A task a small network learns gradually: labels of a random linear teacher, a few of them flipped."""
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(SAMPLES, FEATURES)).astype("float32")
    y = np.argmax(x @ rng.normal(size=(FEATURES, CLASSES)), axis=1)
    flip = rng.random(SAMPLES) < NOISE
    y[flip] = rng.integers(0, CLASSES, size=int(flip.sum()))
    return x, y.astype("int32")


def model():
    return tf.keras.Sequential(
        [
            tf.keras.Input((FEATURES,)),
            tf.keras.layers.Dense(64, activation="relu"),
            tf.keras.layers.Dense(64, activation="relu"),
            tf.keras.layers.Dense(CLASSES),
        ]
    )


def train(optimizer, batch_size, steps, spike_at=None, seed=0):
    """Per-batch losses of `steps` steps; from global step `spike_at` on the learning rate is BUMP times larger."""
    tf.keras.utils.set_random_seed(seed)
    x, y = dataset(seed)
    net = model()
    loss_fn = tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True)

    @tf.function
    def step(xb, yb):
        with tf.GradientTape() as tape:
            loss = loss_fn(yb, net(xb, training=True))
        optimizer.apply_gradients(zip(tape.gradient(loss, net.trainable_variables), net.trainable_variables))
        return loss

    batches = tf.data.Dataset.from_tensor_slices((x, y)).shuffle(SAMPLES, seed=seed).batch(batch_size).repeat()
    losses = []
    for number, (xb, yb) in enumerate(batches.take(steps), start=1):
        if number == spike_at:
            optimizer.learning_rate.assign(optimizer.learning_rate * BUMP)
        losses.append(float(step(xb, yb)))
    return losses


def write_curve(name, about, losses):
    with open(HERE / "curves" / f"{name}.jsonl", "w") as out:
        out.write(json.dumps(about) + "\n")
        for number, loss in enumerate(losses, start=1):
            out.write(json.dumps({"step": number, "loss": float(f"{loss:.5g}")}) + "\n")


class Bump(tf.keras.callbacks.Callback):
    """Multiplies the learning rate by BUMP before global step `at` (1-based), and sleeps so Keras redraws."""

    def __init__(self, at):
        super().__init__()
        self.at = at
        self.seen = 0

    def on_train_batch_begin(self, batch, logs=None):
        self.seen += 1
        if self.seen == self.at:
            rate = self.model.optimizer.learning_rate
            rate.assign(rate * BUMP)

    def on_train_batch_end(self, batch, logs=None):
        time.sleep(0.06)


def write_fit_log():
    """model.fit's own progress output for a run with the bump, through a file as under tfrun."""
    tf.keras.utils.set_random_seed(1)
    x, y = dataset(1)
    net = model()
    net.compile(
        optimizer=tf.keras.optimizers.Adam(3e-3),
        loss=tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        metrics=["accuracy"],
    )
    held_out = (x[800:1000], y[800:1000])
    net.fit(x[:800], y[:800], batch_size=32, epochs=6, validation_data=held_out, callbacks=[Bump(LOG_SPIKE_AT)])


def main():
    (HERE / "curves").mkdir(exist_ok=True)
    about = {"model": "MLP 20-64-64-5", "data": f"linear teacher, {NOISE:.0%} label noise", "seed": 0}
    adam = {**about, "optimizer": "Adam 1e-3", "batch_size": 32}
    write_curve("healthy", {**adam, "spike_at": None}, train(tf.keras.optimizers.Adam(1e-3), 32, 640))
    sgd = {**about, "optimizer": "SGD 0.05", "batch_size": 4}
    write_curve("noisy", {**sgd, "spike_at": None}, train(tf.keras.optimizers.SGD(0.05), 4, 1000))
    spike = {**adam, "spike_at": SPIKE_AT, "bump": BUMP}
    write_curve("spike", spike, train(tf.keras.optimizers.Adam(1e-3), 32, 560, spike_at=SPIKE_AT))
    with open(HERE / "keras3_spike.log", "wb") as log:  # stdout and stderr to one file, no TTY: as tfrun runs it
        subprocess.run([sys.executable, __file__, "fit-log"], stdout=log, stderr=subprocess.STDOUT, check=True)


if __name__ == "__main__":
    if sys.argv[1:] == ["fit-log"]:
        write_fit_log()
    else:
        main()
