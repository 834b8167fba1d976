"""XGBoost's demo "Getting started with XGBoost" (dmlc/xgboost, demo/guide-python/basic_walkthrough.py, last changed
in commit 0d3da9869cfab02f7d61984d6b1e37973d087c48, the same at 379b29f0836b9dbc313b993d8e5743bd452d4117 of
2026-08-21), run with xgboost-cpu 3.2.0: the native `xgb.train(param, dtrain, num_boost_round=num_round,
evals=watchlist)` with `watchlist = [(dtest, "eval"), (dtrain, "train")]` and `binary:logistic` (whose default
metric is logloss), so that XGBoost prints each round as `[0]\teval-logloss:0.63484\ttrain-logloss:0.61565` (the
round 0-based, values `:.5f`); then the demo's `error=%f` on the test set, its model saves and dumps, and its checks
that the reloaded and unpickled boosters predict the same.

Changes:
- synthetic data laid out as the demo's demo/data/agaricus.txt.train and agaricus.txt.test (which are in an
  XGBoost checkout, not in the pip package): LibSVM text, a 0/1 label and 22 one-hot attributes over 126 binary
  features (the mushroom attributes' sizes, 0-based indices as in featmap.txt), 6513 and 1611 rows, the label
  drawn from a fixed logistic model of the attributes; and a featmap.txt of the same layout
  (`index<TAB>attribute=value<TAB>i`); all written to a temporary folder and read with load_svmlight_file as
  published. The demo's outputs (model-0.json, dump.raw.txt, dump.nice.txt, dtest.dmatrix, model-1.json) are
  written in that folder too (the demo writes them in the current directory);
- 80 boosting rounds (`num_round = 80`; published: 2), each printed (XGBoost's default `verbose_eval=True`);
- `evals_result=evals_result` given to `xgb.train`, for the truth;
- CORPUS_INJECT=nan:STEP (STEP: the round as XGBoost prints it, 0-based): a `xgb.callback.TrainingCallback` given
  to `xgb.train` (always; it does nothing without CORPUS_INJECT) sets the booster's `eta` to NaN
  (`model.set_param`) before round STEP, so that round's tree has NaN leaf values and every margin, hence every
  logloss, is NaN from round STEP on. (A custom objective returning NaN gradients would not do it: XGBoost then
  grows no split and the loss stays finite and constant.) With NaN predictions the demo's closing
  `assert np.sum(np.abs(preds2 - preds)) == 0` fails: the nan log ends with that AssertionError's traceback (the
  truth is written before it);
- the truth sidecar written beside the log (RUN.truth.json, RUN from the CORPUS_RUN variable), from
  `evals_result` (the values XGBoost's C++ evaluation string gives, which the printed ones round): `printed` is
  `train`'s logloss, `evaluations` is `eval`'s logloss.

    cd tests/data/real
    CORPUS_RUN=xgboost_walkthrough OMP_NUM_THREADS=1 PYTHONUNBUFFERED=1 /tmp/cv-boost/bin/python \\
        xgboost_walkthrough.py > xgboost_walkthrough.log 2>&1
    CORPUS_RUN=xgboost_walkthrough.nan CORPUS_INJECT=nan:50 OMP_NUM_THREADS=1 PYTHONUNBUFFERED=1 \\
        /tmp/cv-boost/bin/python xgboost_walkthrough.py > xgboost_walkthrough.nan.log 2>&1

STEP 50 comes after 50 printed rounds (0-49); round 50 is the first NaN line (`inject.print` 50). `step` and
`global` are the round as printed; `epoch` is null. The log's `error=...` line (the test error after training) is
not listed in `evaluations`.
"""

import json
import os
import pickle
import tempfile

import numpy as np
from sklearn.datasets import load_svmlight_file

import xgboost as xgb

HERE = os.path.dirname(os.path.abspath(__file__))
RUN = os.environ.get("CORPUS_RUN", "xgboost_walkthrough")
INJECT = os.environ.get("CORPUS_INJECT")
KIND, INJECT_STEP = (INJECT.split(":")[0], int(INJECT.split(":")[1])) if INJECT else (None, None)

# the mushroom attributes of demo/data/featmap.txt and their numbers of values (126 features in all)
ATTRIBUTES = [("cap-shape", 6), ("cap-surface", 4), ("cap-color", 10), ("bruises?", 2), ("odor", 9),
              ("gill-attachment", 4), ("gill-spacing", 3), ("gill-size", 2), ("gill-color", 12), ("stalk-shape", 2),
              ("stalk-root", 7), ("stalk-surface-above-ring", 4), ("stalk-surface-below-ring", 4),
              ("stalk-color-above-ring", 9), ("stalk-color-below-ring", 9), ("veil-type", 2), ("veil-color", 4),
              ("ring-number", 3), ("ring-type", 8), ("spore-print-color", 9), ("population", 6), ("habitat", 7)]
OFFSETS = np.cumsum([0] + [n for _, n in ATTRIBUTES])
WEIGHTS = np.random.default_rng(1).normal(0.0, 0.9, OFFSETS[-1])  # the fixed model: a weight per attribute value


def synthetic_agaricus(path, rows, rng):
    """LibSVM text laid out as agaricus.txt.train: `label idx:1 ...`, one index per attribute, 0-based."""
    with open(path, "w") as f:
        for _ in range(rows):
            idx = [OFFSETS[a] + rng.integers(0, n) for a, (_, n) in enumerate(ATTRIBUTES)]
            label = int(rng.random() < 1 / (1 + np.exp(-(WEIGHTS[idx].sum() - 0.3))))
            f.write(f"{label} " + " ".join(f"{i}:1" for i in idx) + "\n")


DEMO_DIR = tempfile.mkdtemp()  # stands for the checkout's demo/ folder; the demo's outputs are written there too
os.makedirs(os.path.join(DEMO_DIR, "data"))
rng = np.random.default_rng(0)
synthetic_agaricus(os.path.join(DEMO_DIR, "data", "agaricus.txt.train"), 6513, rng)
synthetic_agaricus(os.path.join(DEMO_DIR, "data", "agaricus.txt.test"), 1611, rng)
with open(os.path.join(DEMO_DIR, "data", "featmap.txt"), "w") as f:
    for (name, n), offset in zip(ATTRIBUTES, OFFSETS):
        for v in range(n):
            f.write(f"{offset + v}\t{name}=v{v}\ti\n")
os.chdir(DEMO_DIR)


class NanEta(xgb.callback.TrainingCallback):
    """CORPUS_INJECT=nan:STEP: the learning rate NaN from round STEP on (0-based, as printed)."""

    def before_iteration(self, model, epoch, evals_log):
        if KIND == "nan" and epoch == INJECT_STEP:
            model.set_param("eta", float("nan"))
        return False


# X is a scipy csr matrix, XGBoost supports many other input types,
X, y = load_svmlight_file(os.path.join(DEMO_DIR, "data", "agaricus.txt.train"))
dtrain = xgb.DMatrix(X, y)
# validation set
X_test, y_test = load_svmlight_file(os.path.join(DEMO_DIR, "data", "agaricus.txt.test"))
dtest = xgb.DMatrix(X_test, y_test)

# specify parameters via map, definition are same as c++ version
param = {"max_depth": 2, "eta": 1, "objective": "binary:logistic"}

# specify validations set to watch performance
watchlist = [(dtest, "eval"), (dtrain, "train")]
# number of boosting rounds
num_round = 80
evals_result = {}
bst = xgb.train(
    param, dtrain, num_boost_round=num_round, evals=watchlist, evals_result=evals_result, callbacks=[NanEta()]
)

printed = [
    {"epoch": None, "step": i, "global": i, "loss": v} for i, v in enumerate(evals_result["train"]["logloss"])
]
evaluations = [
    {"name": "eval_logloss", "epoch": None, "step": i, "global": i, "value": v}
    for i, v in enumerate(evals_result["eval"]["logloss"])
]
truth = {
    "script": "xgboost_walkthrough.py",
    "source": "dmlc/xgboost demo/guide-python/basic_walkthrough.py",
    "framework": f"XGBoost {xgb.__version__}",
    "inject": {"kind": KIND, "step": INJECT_STEP, "print": INJECT_STEP} if INJECT else None,
    "tolerance": 5e-06,
    "printed": printed,
    "evaluations": evaluations,
}
with open(os.path.join(HERE, f"{RUN}.truth.json"), "w") as f:
    json.dump(truth, f, indent=1)
    f.write("\n")

# run prediction
preds = bst.predict(dtest)
labels = dtest.get_label()
print(
    "error=%f"
    % (
        sum(1 for i in range(len(preds)) if int(preds[i] > 0.5) != labels[i])
        / float(len(preds))
    )
)
bst.save_model("model-0.json")
# dump model
bst.dump_model("dump.raw.txt")
# dump model with feature map
bst.dump_model("dump.nice.txt", os.path.join(DEMO_DIR, "data/featmap.txt"))

# save dmatrix into binary buffer
dtest.save_binary("dtest.dmatrix")
# save model
bst.save_model("model-1.json")
# load model and data in
bst2 = xgb.Booster(model_file="model-1.json")
dtest2 = xgb.DMatrix("dtest.dmatrix")
preds2 = bst2.predict(dtest2)
# assert they are the same
assert np.sum(np.abs(preds2 - preds)) == 0

# alternatively, you can pickle the booster
pks = pickle.dumps(bst2)
# load model and data in
bst3 = pickle.loads(pks)
preds3 = bst3.predict(dtest2)
# assert they are the same
assert np.sum(np.abs(preds3 - preds)) == 0
