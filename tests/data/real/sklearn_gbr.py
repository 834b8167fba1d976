"""scikit-learn's example "Gradient Boosting regression" (scikit-learn/scikit-learn,
examples/ensemble/plot_gradient_boosting_regression.py, in its form since scikit-learn 1.0 named the loss
`"squared_error"`: the diabetes data split 90/10 with random_state=13, 500 trees of depth 4, min_samples_split 5,
learning rate 0.01; the code kept here, which ends with the test deviance per stage, is that of the current example
but for the changes below), run with scikit-learn 1.9.1, with `verbose` set so that GradientBoostingRegressor
prints its own table (sklearn.ensemble._gb.VerboseReporter):

          Iter       Train Loss   Remaining Time
             1        5921.2716            0.53s
             2        5851.5561            0.47s

(the header `%10s ` then `%16s ` per column, so it ends in a space; Iter right-aligned in 10 characters, the
train loss `{:>16.4f}`, the remaining time `{:.2f}s`, or `{:.2f}m` over a minute); then the example's
`The mean squared error (MSE) on test set: {:.4f}`.

Changes:
- `"verbose": 2` added to the example's params: every stage prints a row, 500 rows (with `verbose=1`, sklearn
  prints stages 1-10, then every 10th to 100, then every 100th: 23 rows for 500 trees, and 10000 trees would still
  print fewer than 40);
- no plotting: the matplotlib imports and figures are dropped, and so are the feature importances and the
  permutation importance (`permutation_importance(..., n_jobs=2)`), computed only for the figures; the test
  deviance per stage (`staged_predict`) is still computed;
- the diabetes data is sklearn's own (bundled, nothing is downloaded): no change;
- CORPUS_INJECT=nan:STEP (STEP: the Iter as printed, 1-based): `reg.fit` is given a `monitor` (fit's own
  argument, called after each stage with the fitting loop's locals) that sets the loop's `raw_predictions` (the
  model's training predictions) to NaN after stage STEP - 1, so the gradient the stage STEP tree fits is NaN, and
  every train loss from Iter STEP on is NaN (sklearn fits trees to NaN targets without a complaint, as fit calls
  them with check_input=False). The example's `mean_squared_error(y_test, reg.predict(X_test))` then raises
  (`ValueError: Input contains NaN.`): the nan log ends with that traceback (the truth is written before it);
- the truth sidecar written beside the log (RUN.truth.json, RUN from the CORPUS_RUN variable), from the fitted
  model's `train_score_` (the value each row prints, full precision): `printed` is the `Train Loss` column
  (`train_loss`), `step` and `global` the Iter as printed, `epoch` null. The log has no evaluation per stage (the
  test MSE is printed once, after training, and is not listed).

    cd tests/data/real
    CORPUS_RUN=sklearn_gbr OMP_NUM_THREADS=1 PYTHONUNBUFFERED=1 /tmp/cv-boost/bin/python sklearn_gbr.py \\
        > sklearn_gbr.log 2>&1
    CORPUS_RUN=sklearn_gbr.nan CORPUS_INJECT=nan:300 OMP_NUM_THREADS=1 PYTHONUNBUFFERED=1 \\
        /tmp/cv-boost/bin/python sklearn_gbr.py > sklearn_gbr.nan.log 2>&1

STEP 300 comes after 299 rows (Iter 1-299); Iter 300 is the first NaN row (`inject.print` 299).
"""

# Authors: The scikit-learn developers
# SPDX-License-Identifier: BSD-3-Clause

import json
import os

import numpy as np

from sklearn import datasets, ensemble
from sklearn.metrics import mean_squared_error
from sklearn.model_selection import train_test_split

HERE = os.path.dirname(os.path.abspath(__file__))
RUN = os.environ.get("CORPUS_RUN", "sklearn_gbr")
INJECT = os.environ.get("CORPUS_INJECT")
KIND, INJECT_STEP = (INJECT.split(":")[0], int(INJECT.split(":")[1])) if INJECT else (None, None)


def nan_monitor(i, est, fit_locals):
    """After stage i (0-based, printed as Iter i + 1): from Iter STEP on, the training predictions are NaN."""
    if i + 2 == INJECT_STEP:
        fit_locals["raw_predictions"][:] = np.nan
    return False


# %%
# Load the data
# -------------------------------------
#
# First we need to load the data.

diabetes = datasets.load_diabetes()
X, y = diabetes.data, diabetes.target

# %%
# Data preprocessing
# -------------------------------------
#
# Next, we will split our dataset to use 90% for training and leave the rest
# for testing. We will also set the regression model parameters. You can play
# with these parameters to see how the results change.
#
# `n_estimators` : the number of boosting stages that will be performed.
# Later, we will plot deviance against boosting iterations.
#
# `max_depth` : limits the number of nodes in the tree.
# The best value depends on the interaction of the input variables.
#
# `min_samples_split` : the minimum number of samples required to split an
# internal node.
#
# `learning_rate` : how much the contribution of each tree will shrink.
#
# `loss` : loss function to optimize. The least squares function is  used in
# this case however, there are many other options (see
# :class:`~sklearn.ensemble.GradientBoostingRegressor` ).

X_train, X_test, y_train, y_test = train_test_split(
    X, y, test_size=0.1, random_state=13
)

params = {
    "n_estimators": 500,
    "max_depth": 4,
    "min_samples_split": 5,
    "learning_rate": 0.01,
    "loss": "squared_error",
    "verbose": 2,  # corpus: a row per stage
}

# %%
# Fit regression model
# --------------------
#
# Now we will initiate the gradient boosting regressors and fit it with our
# training data. Let's also look and the mean squared error on the test data.

reg = ensemble.GradientBoostingRegressor(**params)
reg.fit(X_train, y_train, monitor=nan_monitor if KIND == "nan" else None)

printed = [
    {"epoch": None, "step": i + 1, "global": i + 1, "loss": float(v)} for i, v in enumerate(reg.train_score_)
]
truth = {
    "script": "sklearn_gbr.py",
    "source": "scikit-learn/scikit-learn examples/ensemble/plot_gradient_boosting_regression.py",
    "framework": f"scikit-learn {__import__('sklearn').__version__}",
    "inject": {"kind": KIND, "step": INJECT_STEP, "print": INJECT_STEP - 1} if INJECT else None,
    "tolerance": 5e-05,
    "printed": printed,
}
with open(os.path.join(HERE, f"{RUN}.truth.json"), "w") as f:
    json.dump(truth, f, indent=1)
    f.write("\n")

mse = mean_squared_error(y_test, reg.predict(X_test))
print("The mean squared error (MSE) on test set: {:.4f}".format(mse))

# %%
# Plot training deviance
# ----------------------
#
# Finally, we will visualize the results. To do that we will first compute the
# test set deviance and then plot it against boosting iterations.

test_score = np.zeros((params["n_estimators"],), dtype=np.float64)
for i, y_pred in enumerate(reg.staged_predict(X_test)):
    test_score[i] = mean_squared_error(y_test, y_pred)
