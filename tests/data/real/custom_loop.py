"""keras-io's guide "Writing a training loop from scratch in TensorFlow" (keras-team/keras-io,
guides/writing_a_custom_training_loop_in_tensorflow.py, Keras 3, last modified 2023/06/25): its compiled loop
(`@tf.function` train_step and test_step, the guide's third loop), with the guide's prints as published:
`Start of epoch %d`, `Training loss (for 1 batch) at step %d: %.4f`, `Seen so far: %d samples`,
`Training acc over epoch: %.4f`, `Validation acc: %.4f`, `Time taken: %.2fs`.

Changes:
- only the compiled loop is run, on a fresh model (the guide runs two eager loops before it, and its compiled loop
  goes on training the model of the second);
- synthetic MNIST-shaped data (the guide downloads MNIST): 1000 training samples and 320 for validation, 784
  values in [0, 1], uniform noise with 78 pixels that the label (0-9) says 0.3 brighter;
- 25 epochs (the guide: 2) and a print every 5 batches (the guide: every 100), so that the log has 175 losses
  (the spike rule's baseline is the last 100: the injection comes after 130, when the loss has settled).
  An epoch is 32 batches (31 of 32 samples and one of 8), not a multiple of the interval plus one, as in the
  guide (938 batches, a print every 100): the log never says where an epoch ends, only that the step restarts;
- TensorFlow on 1 thread (intra- and inter-op);
- CORPUS_INJECT=nan:STEP or diverge:STEP (STEP: batches since the start of training, 0-based): before the batch
  of global step STEP, the kernel of the last Dense (the logits) is set to NaN (nan: a NaN kernel before a ReLU
  gives zeros, not a NaN loss), or the learning rate is multiplied by 1000 (diverge);
- the truth sidecar written beside the log (RUN.truth.json, RUN from the CORPUS_RUN variable).

    cd tests/data/real
    CORPUS_RUN=custom_loop ../../../.venv/bin/python custom_loop.py > custom_loop.log 2>&1
    CORPUS_RUN=custom_loop.nan CORPUS_INJECT=nan:593 ../../../.venv/bin/python custom_loop.py > custom_loop.nan.log 2>&1
    CORPUS_RUN=custom_loop.diverge CORPUS_INJECT=diverge:593 ../../../.venv/bin/python custom_loop.py \\
        > custom_loop.diverge.log 2>&1

The printed step restarts each epoch and the log holds no epoch length, so `global` is the step for the first
epoch's lines and null after. The loss line prints no epoch: `epoch` is the one the `Start of epoch %d` line
before it prints (0-based). `inject.print` is the index in `printed` of the first loss printed from STEP on.
"""

import json
import os
import time

import keras
import numpy as np
import tensorflow as tf

tf.config.threading.set_intra_op_parallelism_threads(1)
tf.config.threading.set_inter_op_parallelism_threads(1)

HERE = os.path.dirname(os.path.abspath(__file__))
RUN = os.environ.get("CORPUS_RUN", "custom_loop")
INJECT = os.environ.get("CORPUS_INJECT")
KIND, INJECT_STEP = (INJECT.split(":")[0], int(INJECT.split(":")[1])) if INJECT else (None, None)
EVERY = 5
keras.utils.set_random_seed(0)
printed = []


def get_model():
    inputs = keras.Input(shape=(784,), name="digits")
    x1 = keras.layers.Dense(64, activation="relu")(inputs)
    x2 = keras.layers.Dense(64, activation="relu")(x1)
    outputs = keras.layers.Dense(10, name="predictions")(x2)
    model = keras.Model(inputs=inputs, outputs=outputs)
    return model


# Prepare the training dataset.
batch_size = 32
rng = np.random.default_rng(0)
y_all = rng.integers(0, 10, 1000 + 320)  # synthetic, MNIST-shaped: 784 pixels in [0, 1], a label 0-9
x_all = rng.random((1000 + 320, 784), dtype=np.float32)
x_all[np.arange(1000 + 320)[:, None], y_all[:, None] * 78 + np.arange(78)] += 0.3  # the label's 78 pixels brighter
x_all = np.clip(x_all, 0, 1)
x_train, y_train = x_all[:1000], y_all[:1000]
x_val, y_val = x_all[1000:], y_all[1000:]

train_dataset = tf.data.Dataset.from_tensor_slices((x_train, y_train))
train_dataset = train_dataset.shuffle(buffer_size=1024).batch(batch_size)
val_dataset = tf.data.Dataset.from_tensor_slices((x_val, y_val))
val_dataset = val_dataset.batch(batch_size)
steps_per_epoch = int(train_dataset.cardinality())

# Get a fresh model
model = get_model()

# Instantiate an optimizer to train the model.
optimizer = keras.optimizers.Adam(learning_rate=1e-3)
# Instantiate a loss function.
loss_fn = keras.losses.SparseCategoricalCrossentropy(from_logits=True)

# Prepare the metrics.
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


def inject(global_step):
    if global_step != INJECT_STEP:
        return
    if KIND == "nan":
        kernel = model.layers[-1].kernel  # the logits layer: NaN logits, a NaN loss
        kernel.assign(np.full(kernel.shape, np.nan, dtype="float32"))
    elif KIND == "diverge":
        optimizer.learning_rate.assign(optimizer.learning_rate * 1000)


epochs = 25
first_after = None  # the index in `printed` of the first loss printed from the injection's step on
for epoch in range(epochs):
    print(f"\nStart of epoch {epoch}")
    start_time = time.time()

    # Iterate over the batches of the dataset.
    for step, (x_batch_train, y_batch_train) in enumerate(train_dataset):
        global_step = epoch * steps_per_epoch + step
        inject(global_step)
        loss_value = train_step(x_batch_train, y_batch_train)

        # Log every 5 batches.
        if step % EVERY == 0:
            print(f"Training loss (for 1 batch) at step {step}: {float(loss_value):.4f}")
            print(f"Seen so far: {(step + 1) * batch_size} samples")
            printed.append(
                {"epoch": epoch, "step": step, "global": step if epoch == 0 else None, "loss": float(loss_value)}
            )
            if INJECT and first_after is None and global_step >= INJECT_STEP:
                first_after = len(printed) - 1

    # Display metrics at the end of each epoch.
    train_acc = train_acc_metric.result()
    print(f"Training acc over epoch: {float(train_acc):.4f}")

    # Reset training metrics at the end of each epoch
    train_acc_metric.reset_state()

    # Run a validation loop at the end of each epoch.
    for x_batch_val, y_batch_val in val_dataset:
        test_step(x_batch_val, y_batch_val)

    val_acc = val_acc_metric.result()
    val_acc_metric.reset_state()
    print(f"Validation acc: {float(val_acc):.4f}")
    print(f"Time taken: {time.time() - start_time:.2f}s")

truth = {
    "script": "custom_loop.py",
    "source": "keras-team/keras-io guides/writing_a_custom_training_loop_in_tensorflow.py (compiled loop)",
    "framework": f"Keras {keras.__version__} / TensorFlow {tf.__version__}",
    "inject": {"kind": KIND, "step": INJECT_STEP, "print": first_after} if INJECT else None,
    "tolerance": 5e-05,
    "steps_per_epoch": steps_per_epoch,
    "printed": printed,
}
with open(os.path.join(HERE, f"{RUN}.truth.json"), "w") as f:
    json.dump(truth, f, indent=1)
    f.write("\n")
