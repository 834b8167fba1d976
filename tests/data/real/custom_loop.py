"""How custom_loop.log was made: keras-io's guide "Writing a training loop from scratch in TensorFlow"
(guides/writing_a_custom_training_loop_in_tensorflow.py, Keras 3), its two loops copied as published except:
synthetic MNIST-shaped data (the guide downloads MNIST), 41 batches an epoch and a print every 10 steps (the
guide: 60000 samples, every 100), so that an epoch's last batch is printed.

    .venv/bin/python tests/data/real/custom_loop.py > tests/data/real/custom_loop.log 2>&1

Beside the log, custom_loop.truth.json: each printed loss as the script computed it, with its epoch, its step as
printed and its global step (batches since the start of training).
"""

import json
import os
import sys
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
import keras
import numpy as np
import tensorflow as tf

HERE = os.path.dirname(os.path.abspath(__file__))
EVERY = 10
keras.utils.set_random_seed(0)
truth = []


def get_model():
    inputs = keras.Input(shape=(784,), name="digits")
    x1 = keras.layers.Dense(64, activation="relu")(inputs)
    x2 = keras.layers.Dense(64, activation="relu")(x1)
    outputs = keras.layers.Dense(10, name="predictions")(x2)
    return keras.Model(inputs=inputs, outputs=outputs)


model = get_model()
optimizer = keras.optimizers.Adam(learning_rate=1e-3)
loss_fn = keras.losses.SparseCategoricalCrossentropy(from_logits=True)

batch_size = 32
rng = np.random.default_rng(0)
x_all = rng.random((1312 + 320, 784), dtype=np.float32)  # synthetic, MNIST-shaped: 784 pixels in [0, 1)
y_all = (x_all[:, :10].argmax(axis=1)).astype("int64")  # a learnable label
x_train, y_train = x_all[:1312], y_all[:1312]
x_val, y_val = x_all[1312:], y_all[1312:]
train_dataset = tf.data.Dataset.from_tensor_slices((x_train, y_train))
train_dataset = train_dataset.shuffle(buffer_size=1024).batch(batch_size)
val_dataset = tf.data.Dataset.from_tensor_slices((x_val, y_val))
val_dataset = val_dataset.batch(batch_size)

# The guide's first loop.
epochs = 3
global_step = 0
for epoch in range(epochs):
    print(f"\nStart of epoch {epoch}")
    for step, (x_batch_train, y_batch_train) in enumerate(train_dataset):
        with tf.GradientTape() as tape:
            logits = model(x_batch_train, training=True)
            loss_value = loss_fn(y_batch_train, logits)
        grads = tape.gradient(loss_value, model.trainable_weights)
        optimizer.apply(grads, model.trainable_weights)
        if step % EVERY == 0:
            print(f"Training loss (for 1 batch) at step {step}: {float(loss_value):.4f}")
            print(f"Seen so far: {(step + 1) * batch_size} samples")
            truth.append({"epoch": epoch, "step": step, "global_step": global_step, "loss": float(loss_value)})
        global_step += 1
    sys.stdout.flush()

# The guide's second loop: metrics, and a compiled train step.
model = get_model()
optimizer = keras.optimizers.Adam(learning_rate=1e-3)
train_acc_metric = keras.metrics.SparseCategoricalAccuracy()
val_acc_metric = keras.metrics.SparseCategoricalAccuracy()


@tf.function
def train_step(x, y):
    with tf.GradientTape() as tape:
        logits = model(x, training=True)
        loss_value = loss_fn(y, logits)
    grads = tape.gradient(loss_value, model.trainable_weights)
    optimizer.apply(grads, model.trainable_weights)
    train_acc_metric.update_state(y, logits)
    return loss_value


@tf.function
def test_step(x, y):
    val_logits = model(x, training=False)
    val_acc_metric.update_state(y, val_logits)


second = []
global_step = 0
for epoch in range(epochs):
    print(f"\nStart of epoch {epoch}")
    start_time = time.time()
    for step, (x_batch_train, y_batch_train) in enumerate(train_dataset):
        loss_value = train_step(x_batch_train, y_batch_train)
        if step % EVERY == 0:
            print(f"Training loss (for 1 batch) at step {step}: {float(loss_value):.4f}")
            print(f"Seen so far: {(step + 1) * batch_size} samples")
            second.append({"epoch": epoch, "step": step, "global_step": global_step, "loss": float(loss_value)})
        global_step += 1
    train_acc = train_acc_metric.result()
    print(f"Training acc over epoch: {float(train_acc):.4f}")
    train_acc_metric.reset_state()
    for x_batch_val, y_batch_val in val_dataset:
        test_step(x_batch_val, y_batch_val)
    val_acc = val_acc_metric.result()
    val_acc_metric.reset_state()
    print(f"Validation acc: {float(val_acc):.4f}")
    print(f"Time taken: {time.time() - start_time:.2f}s")

with open(os.path.join(HERE, "custom_loop.truth.json"), "w") as f:
    json.dump({"loops": [truth, second], "steps_per_epoch": 41}, f, indent=0)
