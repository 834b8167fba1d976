"""How tests/data/keras{2,3}_fit.log were made: a real `model.fit` on the CPU, output captured as tfrun does.

    python tests/data/keras_fit.py > tests/data/keras3_fit.log 2>&1    # TensorFlow 2.21, Keras 3
    python tests/data/keras_fit.py > tests/data/keras2_fit.log 2>&1    # tensorflow-cpu 2.15, Keras 2

stdout and stderr go to one file without a TTY, as under tfrun; a short sleep per batch lets Keras redraw
its progress bar at every step (it redraws at most every 0.05 s).
"""

import time

import numpy as np
import tensorflow as tf

tf.keras.utils.set_random_seed(0)
x = np.random.rand(96, 8).astype("float32")
y = (x.sum(axis=1) > 4).astype("float32")
model = tf.keras.Sequential(
    [tf.keras.Input((8,)), tf.keras.layers.Dense(16, activation="relu"), tf.keras.layers.Dense(1, activation="sigmoid")]
)
model.compile(optimizer="adam", loss="binary_crossentropy", metrics=["accuracy"])
slow = tf.keras.callbacks.LambdaCallback(on_train_batch_end=lambda batch, logs: time.sleep(0.06))
model.fit(x, y, batch_size=8, epochs=3, validation_split=0.25, callbacks=[slow])
model.evaluate(x, y, batch_size=8)
