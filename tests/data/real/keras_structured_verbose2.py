"""How keras3_structured_verbose2[.nan|.diverge].log and keras2_structured_verbose2[.nan|.diverge].log were made:
keras-io's "Imbalanced classification: credit card fraud detection" (keras-team/keras-io
examples/structured_data/imbalanced_classification.py: an MLP on 30 tabular features, Adam(1e-2),
binary_crossentropy with class_weight, `model.fit(..., batch_size=2048, verbose=2, ...)`, one line per epoch),
copied as published except:
- a synthetic creditcard.csv instead of Kaggle's (which needs a download): written to a temporary folder with
  the Kaggle file's columns ("Time", "V1".."V28", "Amount", "Class", quoted as there) and read by the published
  CSV loop; 50000 rows (Kaggle's: 284807), 2% fraud (Kaggle's: 0.17%), the fraud rows shifted on a few V
  columns so the task is learnable but not trivial;
- 50 epochs (published: 30), so that the log has 35 lines before the injection and 15 after it;
- ModelCheckpoint writes its fraud_model_at_epoch_{epoch}.keras files into that temporary folder;
- one thread (tf.config.threading), a seed (keras.utils.set_random_seed(0)); `import keras` is kept, which is
  Keras 3 in .venv and Keras 2 (tf.keras) in .venv-keras2;
- fit() gets two more callbacks: Truth records logs["loss"] at on_epoch_end (the epoch's mean, which the
  verbose=2 line prints) and at on_train_batch_end; Inject acts on CORPUS_INJECT in on_train_batch_begin
  before the batch whose 0-based global index (epoch_index * 20 + batch) is STEP: `nan:STEP` sets one kernel
  weight of the last Dense layer to NaN (Variable.assign; not the first, whose ReLU turns a NaN into 0 in the
  compiled step, as seen with keras_mnist_convnet.py's Conv2D), so that batch's loss and every later one is NaN;
  `diverge:STEP` multiplies Adam's learning rate (1e-2) by 1000, which first shows in the next batch's loss.
  STEP 710 is the 11th batch of epoch 36.
fit()'s verbose=2 prints one line an epoch, after "Epoch E/50", ending in \n, no ANSI codes. As printed:
- Keras 3: `20/20 - 2s - 94ms/step - fn: 171.0000 - fp: 6624.0000 - loss: 2.1222e-05 - precision: 0.0853 - ...
  - val_loss: 0.3791 - ...` (metrics in alphabetical order);
- Keras 2: `20/20 - 1s - loss: 2.1463e-05 - fn: 170.0000 - ... - val_recall: 0.7941 - 650ms/epoch - 33ms/step`.
The count 20/20 is the epoch's number of batches (40000 / 2048, the last one partial).
With class_weight = 1/count per class, as published, the weighted loss is about (mean loss of class 0 + mean
loss of class 1) / number of training samples (40000), so every healthy printed loss is below 1e-3 and Keras
prints it as `%.4e` (e.g. `loss: 2.1222e-05`), while val_loss (unweighted) is printed `%.4f`. Keras computes
binary_crossentropy from the sigmoid's logits, so the diverged loss is unbounded: the diverge runs print it
`%.4f` (e.g. `loss: 1160409.2500`, or `loss: 0.0195` with Keras 2). The truth sidecar gives both "rtol" 5e-05
(half a unit of the 4th decimal of a `%.4e` mantissa) and "tolerance" 5e-05 (half a unit of `%.4f`'s 4th
decimal): each printed loss is within the one its format calls for (checked by --truth-from-log). A healthy
run's losses are all `%.4e`, so "rtol" alone decides there; an absolute 5e-05 would let any two of them match.

Made with (from the repository root; PY is .venv/bin/python for Keras 3.15.1 / TF 2.21.0, .venv-keras2/bin/python
for Keras 2.15.0 / TF 2.15.1, and K is keras3 or keras2 to match):

    PY tests/data/real/keras_structured_verbose2.py > tests/data/real/K_structured_verbose2.log 2>&1
    CORPUS_INJECT=nan:710 PY tests/data/real/keras_structured_verbose2.py \\
        > tests/data/real/K_structured_verbose2.nan.log 2>&1
    CORPUS_INJECT=diverge:710 PY tests/data/real/keras_structured_verbose2.py \\
        > tests/data/real/K_structured_verbose2.diverge.log 2>&1

then, for each RUN (K_structured_verbose2, K_structured_verbose2.nan, K_structured_verbose2.diverge):

    PY tests/data/real/keras_structured_verbose2.py --truth-from-log tests/data/real/RUN.log

A training run writes RUN.truth.json (RUN named from the Keras major version and CORPUS_INJECT) holding the
logged losses; --truth-from-log finds each epoch's line in the log (`(\\d+)/(\\d+) - ` after "Epoch E/50"),
checks the loss it prints against the recorded epoch mean, and rewrites RUN.truth.json with one entry per line
("epoch" E as printed, "step" the line's count, 20, "global" E * 20; no "running_mean": the line prints the
epoch's mean, which the sidecar gives as is).
"""

import importlib.metadata
import json
import math
import os
import re
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
STEPS_PER_EPOCH = 20
ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")


def truth_from_log(log_path):
    run = os.path.basename(log_path)[: -len(".log")]
    truth_path = os.path.join(os.path.dirname(log_path), run + ".truth.json")
    with open(truth_path) as f:
        draft = json.load(f)
    draft.pop("batches")
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
        assert step == total == STEPS_PER_EPOCH, segment
        loss = epoch_ends[epoch - 1]
        shown = re.search(r"(?<![\w])loss: ?(\S+)", segment).group(1)
        # half a unit of the last digit: relative for %.4e, absolute for %.4f
        assert (shown == "nan" and loss != loss) or abs(float(shown) - loss) <= 5e-05 * max(abs(loss), 1), (segment, loss)
        printed.append({"epoch": epoch, "step": step, "global": epoch * total, "loss": loss})
    for row in printed:  # JSON has no NaN: written as a string, as the README allows
        row["loss"] = row["loss"] if math.isfinite(row["loss"]) else str(row["loss"])
    draft["printed"] = printed
    with open(truth_path, "w") as f:
        json.dump(draft, f, indent=1)
    print(f"{truth_path}: {len(printed)} printed losses")


if len(sys.argv) == 3 and sys.argv[1] == "--truth-from-log":
    truth_from_log(sys.argv[2])
    sys.exit(0)

import tempfile

import numpy as np

TMP = tempfile.TemporaryDirectory()


def write_synthetic_creditcard_csv(path, n=50000, fraud=0.02):
    """A made-up stand-in for Kaggle's creditcard.csv: same columns and quoting, learnable, imbalanced."""
    rng = np.random.default_rng(0)
    cls = (rng.random(n) < fraud).astype(int)
    time_ = np.sort(rng.uniform(0, 172792, n)).round()
    v = rng.normal(size=(n, 28))
    shift = np.zeros(28)
    shift[[2, 9, 11, 13, 16]] = [-1.2, -1.0, -1.5, -1.8, -1.3]  # V3, V10, V12, V14, V17
    v += cls[:, None] * shift * rng.uniform(0.2, 1.2, size=(n, 1))
    amount = np.exp(rng.normal(3.0, 1.5, n)).round(2)
    with open(path, "w") as f:
        f.write(",".join(f'"{c}"' for c in ["Time"] + [f"V{i}" for i in range(1, 29)] + ["Amount", "Class"]))
        f.write("\n")
        for i in range(n):
            row = [f"{time_[i]:g}"] + [f"{x:.6f}" for x in v[i]] + [f"{amount[i]:g}", f'"{cls[i]}"']
            f.write(",".join(row) + "\n")


"""
## First, vectorize the CSV data
"""


# Get the real data from https://www.kaggle.com/mlg-ulb/creditcardfraud/
fname = os.path.join(TMP.name, "creditcard.csv")  # published: "/Users/fchollet/Downloads/creditcard.csv"
write_synthetic_creditcard_csv(fname)

all_features = []
all_targets = []
with open(fname) as f:
    for i, line in enumerate(f):
        if i == 0:
            print("HEADER:", line.strip())
            continue  # Skip header
        fields = line.strip().split(",")
        all_features.append([float(v.replace('"', "")) for v in fields[:-1]])
        all_targets.append([int(fields[-1].replace('"', ""))])
        if i == 1:
            print("EXAMPLE FEATURES:", all_features[-1])

features = np.array(all_features, dtype="float32")
targets = np.array(all_targets, dtype="uint8")
print("features.shape:", features.shape)
print("targets.shape:", targets.shape)

"""
## Prepare a validation set
"""

num_val_samples = int(len(features) * 0.2)
train_features = features[:-num_val_samples]
train_targets = targets[:-num_val_samples]
val_features = features[-num_val_samples:]
val_targets = targets[-num_val_samples:]

print("Number of training samples:", len(train_features))
print("Number of validation samples:", len(val_features))

"""
## Analyze class imbalance in the targets
"""

counts = np.bincount(train_targets[:, 0])
print(
    f"Number of positive samples in training data: {counts[1]} ({100 * float(counts[1]) / len(train_targets):.2f}% of total)"
)

weight_for_0 = 1.0 / counts[0]
weight_for_1 = 1.0 / counts[1]

"""
## Normalize the data using training set statistics
"""

mean = np.mean(train_features, axis=0)
train_features -= mean
val_features -= mean
std = np.std(train_features, axis=0)
train_features /= std
val_features /= std

"""
## Build a binary classification model
"""

import keras
import tensorflow as tf

tf.config.threading.set_intra_op_parallelism_threads(1)
tf.config.threading.set_inter_op_parallelism_threads(1)
keras.utils.set_random_seed(0)
INJECT = os.environ.get("CORPUS_INJECT")  # "nan:STEP", "diverge:STEP" or unset
INJECT_KIND, INJECT_STEP = (INJECT.split(":")[0], int(INJECT.split(":")[1])) if INJECT else (None, None)
KERAS_VERSION = importlib.metadata.version("keras")  # tf.keras 2.15 has no __version__
RUN = f"keras{KERAS_VERSION.split('.')[0]}_structured_verbose2" + (f".{INJECT_KIND}" if INJECT_KIND else "")

model = keras.Sequential(
    [
        keras.Input(shape=train_features.shape[1:]),
        keras.layers.Dense(256, activation="relu"),
        keras.layers.Dense(256, activation="relu"),
        keras.layers.Dropout(0.3),
        keras.layers.Dense(256, activation="relu"),
        keras.layers.Dropout(0.3),
        keras.layers.Dense(1, activation="sigmoid"),
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
                kernel = self.model.layers[-1].kernel  # the last Dense layer's (a NaN before a ReLU dies there)
                value = np.array(kernel.numpy())
                value[0, 0] = np.nan
                kernel.assign(value)
            elif INJECT_KIND == "diverge":
                lr = self.model.optimizer.learning_rate
                lr.assign(float(lr.numpy()) * 1000)
        self.seen += 1


"""
## Train the model with `class_weight` argument
"""

metrics = [
    keras.metrics.FalseNegatives(name="fn"),
    keras.metrics.FalsePositives(name="fp"),
    keras.metrics.TrueNegatives(name="tn"),
    keras.metrics.TruePositives(name="tp"),
    keras.metrics.Precision(name="precision"),
    keras.metrics.Recall(name="recall"),
]

model.compile(
    optimizer=keras.optimizers.Adam(1e-2), loss="binary_crossentropy", metrics=metrics
)

callbacks = [keras.callbacks.ModelCheckpoint(os.path.join(TMP.name, "fraud_model_at_epoch_{epoch}.keras"))]
class_weight = {0: weight_for_0, 1: weight_for_1}

truth = Truth()
model.fit(
    train_features,
    train_targets,
    batch_size=2048,
    epochs=50,  # published: 30
    verbose=2,
    callbacks=callbacks + [truth, Inject()],
    validation_data=(val_features, val_targets),
    class_weight=class_weight,
)

sys.stdout.flush()
with open(os.path.join(HERE, RUN + ".truth.json"), "w") as f:
    json.dump(
        {
            "script": "keras_structured_verbose2.py",
            "source": "keras-team/keras-io examples/structured_data/imbalanced_classification.py",
            "framework": f"Keras {KERAS_VERSION} / TensorFlow {tf.__version__}",
            "inject": {"kind": INJECT_KIND, "step": INJECT_STEP} if INJECT_KIND else None,
            "rtol": 5e-05,
            "tolerance": 5e-05,
            "printed": [],
            "batches": truth.batches,
            "epoch_ends": truth.epoch_ends,
        },
        f,
    )
