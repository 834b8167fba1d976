"""LightGBM's Python guide example plot_example.py (microsoft/LightGBM, examples/python-guide/plot_example.py, last
changed in commit a70e832782445e5f49f2a5400896f2dc21475037, the same at bae0b7ba953341a32b2a9c5c5c437a1b976f576f of
2026-03-06), run with LightGBM 4.7.0: `lgb.train` with `metric: ("l1", "l2")`, `valid_sets=[lgb_train, lgb_test]`
and the callbacks `lgb.log_evaluation(...)` and `lgb.record_evaluation(evals_result)`, so that each printed line
is LightGBM's own, e.g.
`[10]\ttraining's l1: 0.433444\ttraining's l2: 0.202173\tvalid_1's l1: 0.437837\tvalid_1's l2: 0.206601`
(values printed with `:g`, 6 significant digits).

Changes:
- synthetic data laid out as the example's examples/regression/regression.train and regression.test (which are in
  a LightGBM checkout, not in the pip package): tab-separated, no header, a 0/1 label then 28 features written with
  3 decimals, 7000 and 500 rows, drawn from a fixed logistic model; written to a temporary folder and read with
  pandas.read_csv as published (`categorical_feature=[21]` kept: LightGBM casts that column to int);
- a print every 2 rounds (`lgb.log_evaluation(2)`; published: 10) of its 100 rounds: 50 lines;
- no plotting: the matplotlib import and its check, `lgb.plot_metric`, `lgb.plot_importance`,
  `lgb.plot_split_value_histogram`, `lgb.plot_tree`, `lgb.create_tree_digraph` and `plt.show()` are dropped with the
  `Plotting ...` prints before them (everything after `lgb.train`);
- CORPUS_INJECT=nan:STEP (STEP: the boosting round as LightGBM prints it, 1-based): LightGBM's own
  `lgb.reset_parameter` callback sets the learning rate to inf before round STEP, so that round's tree has infinite
  leaf values and the training l1 is inf from round STEP on. LightGBM cannot be made to print NaN here: a NaN
  learning rate is refused (`Check failed: (learning_rate) > (0.0)`), and a custom objective returning NaN or inf
  gradients only stops the growth of trees (`No further splits with positive gain, best gain: -inf`), the losses
  staying finite and constant. From round STEP + 1 on, the gradients are infinite too and LightGBM prints its two
  warnings (`No further splits with positive gain, best gain: -inf`, `Stopped training because there are no more
  leaves that meet the split requirements`) at every round, printed or not, and every later figure is inf;
- the truth sidecar written beside the log (RUN.truth.json, RUN from the CORPUS_RUN variable), from
  `lgb.record_evaluation`'s dict (full precision): `printed` is `training`'s l1 (the training dataset's first
  metric), `evaluations` are `valid_1`'s l1 and l2 (`training`'s l2 is in neither).

    cd tests/data/real
    CORPUS_RUN=lightgbm_plot OMP_NUM_THREADS=1 PYTHONUNBUFFERED=1 /tmp/cv-boost/bin/python lightgbm_plot.py \\
        > lightgbm_plot.log 2>&1
    CORPUS_RUN=lightgbm_plot.nan CORPUS_INJECT=nan:61 OMP_NUM_THREADS=1 PYTHONUNBUFFERED=1 \\
        /tmp/cv-boost/bin/python lightgbm_plot.py > lightgbm_plot.nan.log 2>&1

STEP 61 comes after 30 printed rounds (2-60); the first inf line is round 62 (`inject.print` 30). `step` and
`global` are the round as printed; `epoch` is null.
"""

import json
import math
import os
import tempfile
from pathlib import Path

import numpy as np
import pandas as pd

import lightgbm as lgb

HERE = os.path.dirname(os.path.abspath(__file__))
RUN = os.environ.get("CORPUS_RUN", "lightgbm_plot")
INJECT = os.environ.get("CORPUS_INJECT")
KIND, INJECT_STEP = (INJECT.split(":")[0], int(INJECT.split(":")[1])) if INJECT else (None, None)
EVERY = 2


def synthetic_regression(path, rows, rng):
    """A file laid out as examples/regression/regression.train: a 0/1 label, then 28 features, tab-separated."""
    x = rng.standard_normal((rows, 28))
    x[:, 20:] = np.exp(0.4 * x[:, 20:])  # the last 8 columns positive, as the example's are
    logit = 1.2 * x[:, 0] - 0.8 * x[:, 3] + 0.6 * x[:, 5] * x[:, 6] + 0.9 * (x[:, 21] - 1) + 0.5 * np.sin(2 * x[:, 9])
    label = (rng.random(rows) < 1 / (1 + np.exp(-logit))).astype(int)
    with open(path, "w") as f:
        for lab, row in zip(label, x):
            f.write(f"{lab}\t" + "\t".join(f"{v:.3f}" for v in row) + "\n")


data_dir = tempfile.mkdtemp()
rng = np.random.default_rng(0)
synthetic_regression(os.path.join(data_dir, "regression.train"), 7000, rng)
synthetic_regression(os.path.join(data_dir, "regression.test"), 500, rng)

print("Loading data...")
# load or create your dataset
regression_example_dir = Path(data_dir)
df_train = pd.read_csv(str(regression_example_dir / "regression.train"), header=None, sep="\t")
df_test = pd.read_csv(str(regression_example_dir / "regression.test"), header=None, sep="\t")

y_train = df_train[0]
y_test = df_test[0]
X_train = df_train.drop(0, axis=1)
X_test = df_test.drop(0, axis=1)

# create dataset for lightgbm
lgb_train = lgb.Dataset(
    X_train,
    y_train,
    feature_name=[f"f{i + 1}" for i in range(X_train.shape[-1])],
    categorical_feature=[21],
)
lgb_test = lgb.Dataset(X_test, y_test, reference=lgb_train)

# specify your configurations as a dict
params = {"num_leaves": 5, "metric": ("l1", "l2"), "verbose": 0}

evals_result = {}  # to record eval results for plotting

callbacks = [lgb.log_evaluation(EVERY), lgb.record_evaluation(evals_result)]
if KIND == "nan":  # round STEP (1-based, as printed) is boosting iteration STEP - 1
    callbacks.append(lgb.reset_parameter(learning_rate=lambda i: 0.1 if i + 1 < INJECT_STEP else math.inf))

print("Starting training...")
# train
gbm = lgb.train(
    params,
    lgb_train,
    num_boost_round=100,
    valid_sets=[lgb_train, lgb_test],
    callbacks=callbacks,
)

printed, evaluations = [], []
first_after = None  # the index in `printed` of the first loss printed from the injection's round on
for i, value in enumerate(evals_result["training"]["l1"]):
    rnd = i + 1
    if rnd % EVERY:
        continue
    printed.append({"epoch": None, "step": rnd, "global": rnd, "loss": value})
    if INJECT and first_after is None and rnd >= INJECT_STEP:
        first_after = len(printed) - 1
    for metric in ("l1", "l2"):
        evaluations.append(
            {"name": f"valid_1_{metric}", "epoch": None, "step": rnd, "global": rnd,
             "value": evals_result["valid_1"][metric][i]}
        )

truth = {
    "script": "lightgbm_plot.py",
    "source": "microsoft/LightGBM examples/python-guide/plot_example.py",
    "framework": f"LightGBM {lgb.__version__}",
    "inject": {"kind": KIND, "step": INJECT_STEP, "print": first_after} if INJECT else None,
    "rtol": 5e-06,
    "printed": printed,
    "evaluations": evaluations,
}
with open(os.path.join(HERE, f"{RUN}.truth.json"), "w") as f:
    json.dump(truth, f, indent=1)
    f.write("\n")
