"""Keras 3 `model.fit` (verbose=1) on an easy synthetic problem, so that the loss falls below 0.01 and Keras's
4-digit running means leave little room for the interval means decoded from them. Not a published script: a
logistic regression (one Dense, sigmoid) on 640 points of 4 normal features whose label is the sign of the sum of
the first two, with a margin between the classes; Adam(0.1), batches of 4, 4 epochs of 160 batches.

Output captured without a TTY, as tfrun does; a sleep of 0.06 s after each batch (longer than the progress bar's
0.05 s redraw interval) makes Keras redraw the bar at every batch, so that each batch's running mean is in the log.
TensorFlow on 1 thread (intra- and inter-op).

    cd tests/data/real
    CORPUS_RUN=keras3_low_loss ../../../.venv/bin/python keras_low_loss.py > keras3_low_loss.log 2>&1

Beside the log, keras3_low_loss.truth.json (RUN.truth.json, RUN from the CORPUS_RUN variable): for every batch,
the running mean of the epoch's loss that Keras's callback logs hold after it (what the bar prints, to 4 digits),
with the epoch as `Epoch k/4` prints it, the bar's batch (1-based) and the global batch.
"""

import json
import os
import time

import numpy as np
import tensorflow as tf

tf.config.threading.set_intra_op_parallelism_threads(1)
tf.config.threading.set_inter_op_parallelism_threads(1)

HERE = os.path.dirname(os.path.abspath(__file__))
RUN = os.environ.get("CORPUS_RUN", "keras3_low_loss")
tf.keras.utils.set_random_seed(0)
x = np.random.default_rng(0).normal(size=(900, 4)).astype("float32")  # synthetic
x = x[np.abs(x[:, 0] + x[:, 1]) > 0.5][:640]  # a margin between the classes: the loss goes to ~0
y = (x[:, 0] + x[:, 1] > 0).astype("float32")
model = tf.keras.Sequential([tf.keras.Input((4,)), tf.keras.layers.Dense(1, activation="sigmoid")])
model.compile(optimizer=tf.keras.optimizers.Adam(0.1), loss="binary_crossentropy")
slow = tf.keras.callbacks.LambdaCallback(on_train_batch_end=lambda batch, logs: time.sleep(0.06))

printed = []
epoch_now = [0]


def record(batch, logs):
    steps = 160  # 640 samples, batches of 4
    printed.append(
        {"epoch": epoch_now[0] + 1, "step": batch + 1, "global": epoch_now[0] * steps + batch + 1, "loss": logs["loss"]}
    )


truth_logger = tf.keras.callbacks.LambdaCallback(
    on_epoch_begin=lambda epoch, logs: epoch_now.__setitem__(0, epoch), on_train_batch_end=record
)
model.fit(x, y, batch_size=4, epochs=4, callbacks=[slow, truth_logger])

truth = {
    "script": "keras_low_loss.py",
    "source": "none (a synthetic model.fit run, see the docstring)",
    "framework": f"Keras {tf.keras.__version__} / TensorFlow {tf.__version__}",
    "inject": None,
    "tolerance": 5e-05,
    "running_mean": True,
    "printed": [{**row, "loss": float(row["loss"])} for row in printed],
}
with open(os.path.join(HERE, f"{RUN}.truth.json"), "w") as f:
    json.dump(truth, f, indent=1)
    f.write("\n")
