"""How keras3_mnist_convnet[.nan|.diverge].log and keras2_mnist_convnet[.nan|.diverge].log were made: keras-io's
"Simple MNIST convnet" (keras-team/keras-io examples/vision/mnist_convnet.py, the version that imports
`from tensorflow import keras`, so that one script runs on Keras 3 / TF 2.21 and on Keras 2 / TF 2.15), copied
as published except:
- synthetic MNIST-shaped data instead of keras.datasets.mnist.load_data() (which downloads): 2880 training and
  512 test images, uint8 28x28, with a learnable label (each class has its own faint blocky template under
  strong noise; 20% of labels are random, so the loss stays well above 0), then scaled, expanded and one-hot
  encoded exactly as published;
- 6 epochs (published: 15) of 21 batches of 128 (2592 training images after validation_split=0.1; the last
  batch holds 32): a batch took 25-45 ms here, and Keras redraws the bar at most every 0.05 s (and always at
  an epoch's end), so about half the batches' redraws reach the log: 11-15 of 21 an epoch on Keras 3 (which
  ones varies), 11 on Keras 2 (1/21, 3/21, ..., 21/21); at least 42 printed before the injection, 24 after;
- one thread (tf.config.threading), a seed (keras.utils.set_random_seed(0));
- fit() gets two callbacks: Truth records the logs Keras hands to on_train_batch_end (the epoch's running mean
  of the loss, which the progress bar prints) and on_epoch_end; Inject acts on CORPUS_INJECT in
  on_train_batch_begin before the batch whose 0-based global index (epoch_index * 21 + batch) is STEP:
  `nan:STEP` sets one kernel weight of the Dense layer to NaN (Variable.assign), so the loss of that batch
  (global count STEP + 1) and every later one is NaN (a NaN put in the first Conv2D's kernel was tried first:
  with Keras 3 / TF 2.21: the ReLU after it turns it into 0 in the compiled step, and the loss stayed
  finite); `diverge:STEP` multiplies the Adam learning rate (1e-3, the default of optimizer="adam") by 1000,
  which first shows in the loss of the next batch (global count STEP + 2).
fit() keeps its default verbose=1 (a progress bar). The output goes to a file, not a terminal, as tfrun writes a
job's output.log; TF's own stderr lines are left in. Both Keras versions still draw the bar as for a terminal
(their Progbar counts "posix" in sys.modules as a dynamic display): each redraw is backspaces over the last one,
then \r, then the bar; only an epoch's final redraw (with val_ metrics) ends in \n. As printed:
- Keras 3: `\r\x1b[1m 9/21\x1b[0m \x1b[32m━━━━━━━━\x1b[0m\x1b[37m━━━━━━━━━━━━\x1b[0m \x1b[1m1s\x1b[0m 92ms/step -
  accuracy: 0.8099 - loss: 1.5383` (ANSI bold and colours even into a file; metrics in alphabetical order);
- Keras 2: `\r 9/21 [===========>..................] - ETA: 0s - loss: 2.3033 - accuracy: 0.1120`, the last
  `21/21 [==============================] - 2s 60ms/step - loss: 2.2693 - accuracy: 0.1678 - val_loss: ...`.

Made with (from the repository root; PY is .venv/bin/python for Keras 3.15.1 / TF 2.21.0, .venv-keras2/bin/python
for Keras 2.15.0 / TF 2.15.1, and K is keras3 or keras2 to match):

    PY tests/data/real/keras_mnist_convnet.py > tests/data/real/K_mnist_convnet.log 2>&1
    CORPUS_INJECT=nan:80 PY tests/data/real/keras_mnist_convnet.py > tests/data/real/K_mnist_convnet.nan.log 2>&1
    CORPUS_INJECT=diverge:80 PY tests/data/real/keras_mnist_convnet.py \\
        > tests/data/real/K_mnist_convnet.diverge.log 2>&1

then, for each RUN (K_mnist_convnet, K_mnist_convnet.nan, K_mnist_convnet.diverge):

    PY tests/data/real/keras_mnist_convnet.py --truth-from-log tests/data/real/RUN.log

A training run writes RUN.truth.json (RUN named from the Keras major version and CORPUS_INJECT) holding every
batch's logged loss; --truth-from-log reads the bar redraws that the log really shows (after each \\r or \\n
within an epoch, ANSI codes removed: `\\s*(\\d+)/(\\d+) `), checks the loss each prints against the recorded
value, and rewrites RUN.truth.json with exactly those in "printed" ("running_mean": true; "epoch" as printed
in "Epoch E/6", "step" the bar's count, "global" (E - 1) * 21 + count).
"""

import importlib.metadata
import json
import math
import os
import re
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
STEPS_PER_EPOCH = 21
ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")


def truth_from_log(log_path):
    run = os.path.basename(log_path)[: -len(".log")]
    truth_path = os.path.join(os.path.dirname(log_path), run + ".truth.json")
    with open(truth_path) as f:
        draft = json.load(f)
    batches = draft.pop("batches")  # batches[epoch_index][batch] = logs["loss"] at on_train_batch_end
    epoch_ends = draft.pop("epoch_ends")
    with open(log_path, encoding="utf-8", errors="replace") as f:
        text = ANSI.sub("", f.read()).replace("\b", "")
    printed, epoch = [], None
    for segment in re.split(r"[\r\n]", text):
        m = re.match(r"Epoch (\d+)/(\d+)", segment)
        if m:
            epoch = int(m.group(1))
            continue
        m = re.match(r"\s*(\d+)/(\d+) ", segment)
        if not m or epoch is None:
            continue
        step, total = int(m.group(1)), int(m.group(2))
        assert total == STEPS_PER_EPOCH, segment
        loss = batches[epoch - 1][step - 1]
        if step == total:
            assert loss == epoch_ends[epoch - 1] or (loss != loss and epoch_ends[epoch - 1] != epoch_ends[epoch - 1])
        shown = re.search(r"(?<![\w])loss: ?(\S+)", segment).group(1)
        assert (shown == "nan" and loss != loss) or abs(float(shown) - loss) <= 5e-05 + 1e-9, (segment, loss)
        printed.append({"epoch": epoch, "step": step, "global": (epoch - 1) * total + step, "loss": loss})
    for row in printed:  # JSON has no NaN: written as a string, as the README allows
        row["loss"] = row["loss"] if math.isfinite(row["loss"]) else str(row["loss"])
    draft["printed"] = printed
    with open(truth_path, "w") as f:
        json.dump(draft, f, indent=1)
    print(f"{truth_path}: {len(printed)} printed losses")


if len(sys.argv) == 3 and sys.argv[1] == "--truth-from-log":
    truth_from_log(sys.argv[2])
    sys.exit(0)

"""
## Setup
"""

import numpy as np
import tensorflow as tf
from tensorflow import keras
from tensorflow.keras import layers

tf.config.threading.set_intra_op_parallelism_threads(1)
tf.config.threading.set_inter_op_parallelism_threads(1)
keras.utils.set_random_seed(0)
INJECT = os.environ.get("CORPUS_INJECT")  # "nan:STEP", "diverge:STEP" or unset
INJECT_KIND, INJECT_STEP = (INJECT.split(":")[0], int(INJECT.split(":")[1])) if INJECT else (None, None)
KERAS_VERSION = importlib.metadata.version("keras")  # tf.keras 2.15 has no __version__
RUN = f"keras{KERAS_VERSION.split('.')[0]}_mnist_convnet" + (f".{INJECT_KIND}" if INJECT_KIND else "")


def synthetic_mnist(n_train=2880, n_test=512):
    """MNIST's shapes and dtypes ((n, 28, 28) uint8 images, uint8 labels 0-9), made up: each class a template."""
    rng = np.random.default_rng(0)
    templates = rng.random((10, 7, 7)) > 0.6
    templates = np.kron(templates, np.ones((4, 4))).astype("float32")  # 28x28 blocks

    def make(n):
        y = rng.integers(0, 10, size=n).astype("uint8")
        x = 0.25 * templates[y] + 0.75 * rng.random((n, 28, 28))
        y = np.where(rng.random(n) < 0.2, rng.integers(0, 10, size=n), y).astype("uint8")  # 20% noisy labels
        return (np.clip(x, 0, 1) * 255).astype("uint8"), y

    return make(n_train), make(n_test)


"""
## Prepare the data
"""

# Model / data parameters
num_classes = 10
input_shape = (28, 28, 1)

# Load the data and split it between train and test sets
(x_train, y_train), (x_test, y_test) = synthetic_mnist()  # published: keras.datasets.mnist.load_data()

# Scale images to the [0, 1] range
x_train = x_train.astype("float32") / 255
x_test = x_test.astype("float32") / 255
# Make sure images have shape (28, 28, 1)
x_train = np.expand_dims(x_train, -1)
x_test = np.expand_dims(x_test, -1)
print("x_train shape:", x_train.shape)
print(x_train.shape[0], "train samples")
print(x_test.shape[0], "test samples")


# convert class vectors to binary class matrices
y_train = keras.utils.to_categorical(y_train, num_classes)
y_test = keras.utils.to_categorical(y_test, num_classes)

"""
## Build the model
"""

model = keras.Sequential(
    [
        keras.Input(shape=input_shape),
        layers.Conv2D(32, kernel_size=(3, 3), activation="relu"),
        layers.MaxPooling2D(pool_size=(2, 2)),
        layers.Conv2D(64, kernel_size=(3, 3), activation="relu"),
        layers.MaxPooling2D(pool_size=(2, 2)),
        layers.Flatten(),
        layers.Dropout(0.5),
        layers.Dense(num_classes, activation="softmax"),
    ]
)

model.summary()


class Truth(keras.callbacks.Callback):
    def __init__(self):
        super().__init__()
        self.batches, self.epoch_ends = [], []

    def on_epoch_begin(self, epoch, logs=None):
        self.batches.append([])

    def on_train_batch_end(self, batch, logs=None):
        self.batches[-1].append(float(logs["loss"]))

    def on_epoch_end(self, epoch, logs=None):
        self.epoch_ends.append(float(logs["loss"]))


class Inject(keras.callbacks.Callback):
    def __init__(self):
        super().__init__()
        self.seen = 0

    def on_train_batch_begin(self, batch, logs=None):
        if self.seen == INJECT_STEP:
            if INJECT_KIND == "nan":
                kernel = self.model.layers[-1].kernel  # the Dense layer's (NaN in a Conv2D dies in its ReLU)
                value = np.array(kernel.numpy())
                value[0, 0] = np.nan
                kernel.assign(value)
            elif INJECT_KIND == "diverge":
                lr = self.model.optimizer.learning_rate
                lr.assign(float(lr.numpy()) * 1000)
        self.seen += 1


"""
## Train the model
"""

batch_size = 128
epochs = 6  # published: 15

model.compile(loss="categorical_crossentropy", optimizer="adam", metrics=["accuracy"])

truth = Truth()
model.fit(
    x_train, y_train, batch_size=batch_size, epochs=epochs, validation_split=0.1, callbacks=[truth, Inject()]
)

"""
## Evaluate the trained model
"""

score = model.evaluate(x_test, y_test, verbose=0)
print("Test loss:", score[0])
print("Test accuracy:", score[1])

sys.stdout.flush()
with open(os.path.join(HERE, RUN + ".truth.json"), "w") as f:
    json.dump(
        {
            "script": "keras_mnist_convnet.py",
            "source": "keras-team/keras-io examples/vision/mnist_convnet.py",
            "framework": f"Keras {KERAS_VERSION} / TensorFlow {tf.__version__}",
            "inject": {"kind": INJECT_KIND, "step": INJECT_STEP} if INJECT_KIND else None,
            "tolerance": 5e-05,
            "running_mean": True,
            "printed": [],
            "batches": truth.batches,
            "epoch_ends": truth.epoch_ends,
        },
        f,
    )
