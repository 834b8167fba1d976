"""skorch's README example (skorch-dev/skorch, README.rst, "Examples", the NeuralNetClassifier on
make_classification; skorch 1.4.0, commit 5db0ddc), run as published: a table per epoch printed by skorch's
PrintLog (tabulate's `simple` format, floats as `.4f`), the header and rule once, then one row per epoch:

      epoch    train_loss    valid_acc    valid_loss     dur
    -------  ------------  -----------  ------------  ------
          1        0.6868       0.6250        0.6742  0.0106

PrintLog wraps each value that is the best so far (the `*_best` keys of the history) in ANSI colour codes, a
colour per column (`\\x1b[36m0.6868\\x1b[0m`), whether or not stdout is a terminal (skorch checks none): the log,
written to a file, holds them, and tabulate pads the columns as if they were not there:

          5        \\x1b[36m0.6255\\x1b[0m       0.7200        \\x1b[35m0.6200\\x1b[0m  0.0049

In the NaN run the rows read `     31           nan       0.5000           nan  0.0053`, uncoloured.

Changes:
- 50 epochs (the README: 10), so that the table has 50 rows;
- torch.manual_seed(0) and 1 thread (the README seeds only the data);
- CORPUS_INJECT=nan:STEP (STEP: training batches since the start of training, 0-based; an epoch is 7 batches of
  at most 128 of the 800 training samples, skorch holding 200 out for validation): a callback sets the weight
  of `dense0` to NaN before the training batch of global step STEP, so that epoch's train_loss and every
  later loss are NaN; skorch goes on training and printing (nan rows);
- the truth sidecar written beside the log (RUN.truth.json, RUN from the CORPUS_RUN variable), from
  net.history: train_loss per epoch (the mean over the epoch's batches, weighted by batch size, at full
  precision), and valid_acc and valid_loss as `evaluations`.

    cd tests/data/real
    CORPUS_RUN=skorch_classifier PYTHONUNBUFFERED=1 VENV/bin/python skorch_classifier.py > skorch_classifier.log 2>&1
    CORPUS_RUN=skorch_classifier.nan CORPUS_INJECT=nan:210 PYTHONUNBUFFERED=1 VENV/bin/python skorch_classifier.py \\
        > skorch_classifier.nan.log 2>&1

The table states only the epoch (1-based): `epoch` as printed, `step` and `global` null.
"""

import json
import os

import torch

torch.set_num_threads(1)
torch.manual_seed(0)

import numpy as np
import skorch
from sklearn.datasets import make_classification
from torch import nn
from skorch import NeuralNetClassifier
from skorch.callbacks import Callback

HERE = os.path.dirname(os.path.abspath(__file__))
RUN = os.environ.get("CORPUS_RUN", "skorch_classifier")
INJECT = os.environ.get("CORPUS_INJECT")
KIND, INJECT_STEP = (INJECT.split(":")[0], int(INJECT.split(":")[1])) if INJECT else (None, None)


class Inject(Callback):
    """Sets dense0's weight to NaN before the training batch of global step INJECT_STEP."""

    def initialize(self):
        self.step_ = 0
        self.epoch_at_ = None  # the 1-based epoch of the injection's batch
        return self

    def on_batch_begin(self, net, batch=None, training=None, **kwargs):
        if not training:
            return
        if KIND == "nan" and self.step_ == INJECT_STEP:
            with torch.no_grad():
                net.module_.dense0.weight.fill_(float("nan"))
            self.epoch_at_ = len(net.history)
        self.step_ += 1


X, y = make_classification(1000, 20, n_informative=10, random_state=0)
X = X.astype(np.float32)
y = y.astype(np.int64)

class MyModule(nn.Module):
    def __init__(self, num_units=10, nonlin=nn.ReLU()):
        super().__init__()

        self.dense0 = nn.Linear(20, num_units)
        self.nonlin = nonlin
        self.dropout = nn.Dropout(0.5)
        self.dense1 = nn.Linear(num_units, num_units)
        self.output = nn.Linear(num_units, 2)
        self.softmax = nn.Softmax(dim=-1)

    def forward(self, X, **kwargs):
        X = self.nonlin(self.dense0(X))
        X = self.dropout(X)
        X = self.nonlin(self.dense1(X))
        X = self.softmax(self.output(X))
        return X

inject = Inject()
net = NeuralNetClassifier(
    MyModule,
    max_epochs=50,
    lr=0.1,
    # Shuffle training data on each epoch
    iterator_train__shuffle=True,
    callbacks=[("corpus_inject", inject)],
)

net.fit(X, y)
y_proba = net.predict_proba(X)

printed = []
evaluations = []
for row in net.history:
    printed.append({"epoch": row["epoch"], "step": None, "global": None, "loss": float(row["train_loss"])})
    for name in ("valid_acc", "valid_loss"):  # the table's order
        evaluations.append(
            {"name": name, "epoch": row["epoch"], "step": None, "global": None, "value": float(row[name])}
        )

first_after = None
if INJECT:
    first_after = next(i for i, row in enumerate(printed) if row["epoch"] >= inject.epoch_at_)
truth = {
    "script": "skorch_classifier.py",
    "source": "skorch-dev/skorch README.rst (Examples: NeuralNetClassifier on make_classification)",
    "framework": f"skorch {skorch.__version__} / PyTorch {torch.__version__}",
    "inject": {"kind": KIND, "step": INJECT_STEP, "print": first_after} if INJECT else None,
    "tolerance": 5e-05,
    "steps_per_epoch": 7,
    "printed": printed,
    "evaluations": evaluations,
}
with open(os.path.join(HERE, f"{RUN}.truth.json"), "w") as f:
    json.dump(truth, f, indent=1)
    f.write("\n")
