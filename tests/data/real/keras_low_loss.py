"""How keras3_low_loss.log was made: Keras 3 `model.fit` (verbose=1) on an easy synthetic problem, so that the
loss falls below 0.01 and Keras's 4-digit running means leave little room for the interval means decoded from
them. Output captured without a TTY, as tfrun does; a short sleep per batch makes Keras redraw every batch.

    .venv/bin/python tests/data/real/keras_low_loss.py > tests/data/real/keras3_low_loss.log 2>&1
"""

import time

import numpy as np
import tensorflow as tf

tf.keras.utils.set_random_seed(0)
x = np.random.default_rng(0).normal(size=(900, 4)).astype("float32")  # synthetic
x = x[np.abs(x[:, 0] + x[:, 1]) > 0.5][:640]  # a margin between the classes: the loss goes to ~0
y = (x[:, 0] + x[:, 1] > 0).astype("float32")
model = tf.keras.Sequential([tf.keras.Input((4,)), tf.keras.layers.Dense(1, activation="sigmoid")])
model.compile(optimizer=tf.keras.optimizers.Adam(0.1), loss="binary_crossentropy")
slow = tf.keras.callbacks.LambdaCallback(on_train_batch_end=lambda batch, logs: time.sleep(0.06))
model.fit(x, y, batch_size=4, epochs=4, callbacks=[slow])
