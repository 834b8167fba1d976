"""pytorch-tabnet's census example (dreamquark-ai/tabnet, census_example.ipynb, last changed at commit
5c000c20a3c0dd35b0905aec5b1ab66deccebfb5, repository HEAD 2c0c4ebd2bb1cb639ea94ab4b11823bc49265588): its code
cells up to its first `clf.fit` (the one on CSR matrices, with ClassificationSMOTE augmentations, grouped
features, entmax masks, StepLR), as published, then its closing prints (`BEST VALID SCORE FOR ...`,
`FINAL TEST SCORE FOR ...`). pytorch-tabnet's History callback prints one line an epoch:
`epoch 0  | loss: 0.65432 | train_auc: 0.71234 | valid_auc: 0.69   |  0:00:01s` (values np.round(x, 5),
printed by str() left-aligned in 8 columns), then the EarlyStopping callback's `Stop training because you
reached max_epochs = ...` (or `Early stopping occurred at epoch ...`) line and its `Best weights from best epoch
are automatically used!` UserWarning on stderr.

Changes:
- synthetic census-like data (the notebook downloads UCI's adult.data with wget): a DataFrame laid out as
  `pd.read_csv` reads adult.data, which has no header row (its first record is the header, so the target
  column is named ' <=50K'): 15 columns, the same names, 6,000 rows with the same kinds of values (strings
  with adult's leading space for the 8 categorical ones and the income, integers for the 6 numeric ones),
  drawn with NumPy, the income from a logistic function of age, education-num, hours, capital-gain, sex and
  marital status; then the notebook's own `Set` split (80/10/10), label encoding and "wealthy"/"not_wealthy"
  strings, as published; `%matplotlib`, `wget` and the `CUDA_VISIBLE_DEVICES` cell left out;
- max_epochs 45 (published: 50, or 2 under CI), patience 45 (published: 20) so that early stopping does not
  end the run before 40 epoch lines; batch size 1024 and virtual batch size 128 as published: an epoch is 5
  batches of the ~4,800 training rows;
- the rest of the notebook (four more fits that check warm_start, plots, save/load, explain, XGBoost) is left
  out;
- torch on 1 thread (torch.set_num_threads(1));
- CORPUS_INJECT=nan:STEP (STEP: training batches since the start, 0-based): from the batch of global step STEP
  on, NaN is added to the cross-entropy each batch computes (TabNetClassifier.compute_loss, in a subclass), so
  every later batch loss and so every epoch's loss is NaN. It is the loss, not a weight, that is made NaN: with a
  NaN weight, TabNet's entmax attention mask raises in that batch's forward pass (`RuntimeError: index -1 is out
  of bounds for dimension 1 with size 10`, pytorch_tabnet/sparsemax.py `_threshold_and_support`; NaN
  predictions would also make the eval sets' AUC, sklearn's roc_auc_score, raise `ValueError: Input contains
  NaN`), before the epoch's line is printed, so the log would show no NaN loss at all, only the traceback.
  With the loss NaN, the gradient stays finite (a NaN constant added to the loss), the model trains on as in the
  healthy run and the AUCs go on (History's running mean of the epoch loss is never reset between epochs, so
  once NaN it would stay NaN even were the batch losses finite again);
- the truth sidecar written beside the log (RUN.truth.json, RUN from the CORPUS_RUN variable), from the
  classifier's own history (`clf.history['loss']`, `clf.history['valid_auc']`).

    cd tests/data/real
    CORPUS_RUN=tabnet_train PYTHONUNBUFFERED=1 OMP_NUM_THREADS=1 /tmp/cv-mixed/bin/python tabnet_train.py \\
        > tabnet_train.log 2>&1
    CORPUS_RUN=tabnet_train.nan CORPUS_INJECT=nan:150 PYTHONUNBUFFERED=1 OMP_NUM_THREADS=1 \\
        /tmp/cv-mixed/bin/python tabnet_train.py > tabnet_train.nan.log 2>&1

(/tmp/cv-mixed: torch 2.13.0 (CPU), pytorch-tabnet 4.1.0, scikit-learn 1.9.1, scipy 1.17.1, pandas 2.3.3.)

The line prints only an epoch (0-based): every `printed` row has that epoch, `step` and `global` null. Its
training loss is `loss` (the mean over the epoch's training rows of the batch losses, which include TabNet's
sparsity term); `valid_auc` is an evaluation, listed in `evaluations`; `train_auc` (the training set) is
neither. Printed to 5 decimals: tolerance 5e-06.
"""

import json
import os

from pytorch_tabnet.tab_model import TabNetClassifier

import torch
from sklearn.preprocessing import LabelEncoder
from sklearn.metrics import roc_auc_score

import pandas as pd
import numpy as np
np.random.seed(0)

import scipy

from pathlib import Path  # noqa: F401  (the notebook's import; its download path is not used)

torch.set_num_threads(1)
HERE = os.path.dirname(os.path.abspath(__file__))
RUN = os.environ.get("CORPUS_RUN", "tabnet_train")
INJECT = os.environ.get("CORPUS_INJECT")
KIND, INJECT_STEP = (INJECT.split(":")[0], int(INJECT.split(":")[1])) if INJECT else (None, None)

dataset_name = 'census-income'


def synthetic_census(n=6000, seed=0):
    """adult.data's layout as pd.read_csv reads it (no header row: its first record names the columns)."""
    rng = np.random.default_rng(seed)
    pick = lambda values, p=None: rng.choice([" " + v for v in values], size=n, p=p)  # noqa: E731
    age = rng.integers(17, 91, n)
    education_num = rng.integers(1, 17, n)
    hours = np.clip(rng.normal(40, 12, n).round(), 1, 99).astype(int)
    capital_gain = np.where(rng.random(n) < 0.08, rng.integers(1000, 100000, n), 0)
    capital_loss = np.where(rng.random(n) < 0.05, rng.integers(100, 4400, n), 0)
    sex = pick(["Male", "Female"], [0.67, 0.33])
    marital = pick(["Married-civ-spouse", "Never-married", "Divorced", "Separated", "Widowed",
                    "Married-spouse-absent", "Married-AF-spouse"], [0.46, 0.33, 0.14, 0.03, 0.03, 0.007, 0.003])
    logit = (0.04 * (age - 38) + 0.35 * (education_num - 10) + 0.03 * (hours - 40) + 1.5 * (capital_gain > 0)
             + 1.2 * (marital == " Married-civ-spouse") + 0.4 * (sex == " Male") - 1.6 + rng.normal(0, 1, n))
    income = np.where(rng.random(n) < 1 / (1 + np.exp(-logit)), " >50K", " <=50K")
    columns = {
        "39": age,
        " State-gov": pick(["Private", "Self-emp-not-inc", "Local-gov", "State-gov", "Self-emp-inc",
                            "Federal-gov", "Without-pay", "?"], [0.7, 0.08, 0.06, 0.04, 0.03, 0.03, 0.005, 0.055]),
        "77516": rng.integers(12285, 1484705, n),
        " Bachelors": pick(["HS-grad", "Some-college", "Bachelors", "Masters", "Assoc-voc", "11th",
                            "Assoc-acdm", "10th", "7th-8th", "Prof-school", "9th", "12th", "Doctorate",
                            "5th-6th", "1st-4th", "Preschool"]),
        " 13": education_num,
        " Never-married": marital,
        " Adm-clerical": pick(["Prof-specialty", "Craft-repair", "Exec-managerial", "Adm-clerical", "Sales",
                               "Other-service", "Machine-op-inspct", "?", "Transport-moving",
                               "Handlers-cleaners", "Farming-fishing", "Tech-support", "Protective-serv",
                               "Priv-house-serv", "Armed-Forces"]),
        " Not-in-family": pick(["Husband", "Not-in-family", "Own-child", "Unmarried", "Wife", "Other-relative"]),
        " White": pick(["White", "Black", "Asian-Pac-Islander", "Amer-Indian-Eskimo", "Other"],
                       [0.85, 0.1, 0.03, 0.01, 0.01]),
        " Male": sex,
        " 2174": capital_gain,
        " 0": capital_loss,
        " 40": hours,
        " United-States": pick(["United-States", "Mexico", "?", "Philippines", "Germany", "Canada", "India"],
                               [0.9, 0.03, 0.02, 0.015, 0.015, 0.01, 0.01]),
        " <=50K": income,
    }
    return pd.DataFrame(columns)


class InjectingTabNetClassifier(TabNetClassifier):
    """TabNetClassifier whose training loss has NaN added from global step INJECT_STEP on (CORPUS_INJECT)."""

    def compute_loss(self, y_pred, y_true):
        loss = super().compute_loss(y_pred, y_true)
        if self.network.training:  # the training batches only (compute_loss is not called in evaluation)
            step = getattr(self, "_corpus_step", 0)
            self._corpus_step = step + 1
            if step >= INJECT_STEP:
                loss = loss + torch.tensor(float("nan"))
        return loss


# ---- the notebook's cells ---------------------------------------------------------------------------------------
train = synthetic_census()  # published: train = pd.read_csv(out), out the downloaded adult.data
target = ' <=50K'
if "Set" not in train.columns:
    train["Set"] = np.random.choice(["train", "valid", "test"], p =[.8, .1, .1], size=(train.shape[0],))

train_indices = train[train.Set=="train"].index
valid_indices = train[train.Set=="valid"].index
test_indices = train[train.Set=="test"].index

nunique = train.nunique()
types = train.dtypes

categorical_columns = []
categorical_dims =  {}
for col in train.columns:
    if types[col] == 'object' or nunique[col] < 200:
        print(col, train[col].nunique())
        l_enc = LabelEncoder()
        train[col] = train[col].fillna("VV_likely")
        train[col] = l_enc.fit_transform(train[col].values)
        categorical_columns.append(col)
        categorical_dims[col] = len(l_enc.classes_)
    else:
        train.fillna(train.loc[train_indices, col].mean(), inplace=True)

# check that pipeline accepts strings
train.loc[train[target]==0, target] = "wealthy"
train.loc[train[target]==1, target] = "not_wealthy"

unused_feat = ['Set']

features = [ col for col in train.columns if col not in unused_feat+[target]]

cat_idxs = [ i for i, f in enumerate(features) if f in categorical_columns]

cat_dims = [ categorical_dims[f] for i, f in enumerate(features) if f in categorical_columns]

grouped_features = [[0, 1, 2], [8, 9, 10]]

tabnet_params = {"cat_idxs":cat_idxs,
                 "cat_dims":cat_dims,
                 "cat_emb_dim":2,
                 "optimizer_fn":torch.optim.Adam,
                 "optimizer_params":dict(lr=2e-2),
                 "scheduler_params":{"step_size":50, # how to use learning rate scheduler
                                 "gamma":0.9},
                 "scheduler_fn":torch.optim.lr_scheduler.StepLR,
                 "mask_type":'entmax', # "sparsemax"
                 "grouped_features" : grouped_features
                }

clf = (InjectingTabNetClassifier if INJECT else TabNetClassifier)(**tabnet_params
                      )

X_train = train[features].values[train_indices]
y_train = train[target].values[train_indices]

X_valid = train[features].values[valid_indices]
y_valid = train[target].values[valid_indices]

X_test = train[features].values[test_indices]
y_test = train[target].values[test_indices]

max_epochs = 45  # published: 50 if not os.getenv("CI", False) else 2

from pytorch_tabnet.augmentations import ClassificationSMOTE
aug = ClassificationSMOTE(p=0.2)

# This illustrates the behaviour of the model's fit method using Compressed Sparse Row matrices
sparse_X_train = scipy.sparse.csr_matrix(X_train)  # Create a CSR matrix from X_train
sparse_X_valid = scipy.sparse.csr_matrix(X_valid)  # Create a CSR matrix from X_valid

# Fitting the model
clf.fit(
    X_train=sparse_X_train, y_train=y_train,
    eval_set=[(sparse_X_train, y_train), (sparse_X_valid, y_valid)],
    eval_name=['train', 'valid'],
    eval_metric=['auc'],
    max_epochs=max_epochs , patience=45,  # published: patience=20
    batch_size=1024, virtual_batch_size=128,
    num_workers=0,
    weights=1,
    drop_last=False,
    augmentations=aug, #aug, None
)

preds = clf.predict_proba(X_test)
test_auc = roc_auc_score(y_score=preds[:,1], y_true=y_test)


preds_valid = clf.predict_proba(X_valid)
valid_auc = roc_auc_score(y_score=preds_valid[:,1], y_true=y_valid)

print(f"BEST VALID SCORE FOR {dataset_name} : {clf.best_cost}")
print(f"FINAL TEST SCORE FOR {dataset_name} : {test_auc}")

# ---- the truth --------------------------------------------------------------------------------------------------
losses = clf.history['loss']
printed = [{"epoch": e, "step": None, "global": None, "loss": float(v)} for e, v in enumerate(losses)]
evaluations = [{"name": "valid_auc", "epoch": e, "step": None, "global": None, "value": float(v)}
               for e, v in enumerate(clf.history['valid_auc'])]
steps_per_epoch = -(-len(train_indices) // 1024)
first_after = next((i for i, row in enumerate(printed) if np.isnan(row["loss"])), None) if INJECT else None
truth = {
    "script": "tabnet_train.py",
    "source": "dreamquark-ai/tabnet census_example.ipynb (first fit; 5c000c20a3c0dd35b0905aec5b1ab66deccebfb5)",
    "framework": f"pytorch-tabnet {__import__('importlib.metadata').metadata.version('pytorch-tabnet')}"
                 f" / PyTorch {torch.__version__}",
    "inject": {"kind": KIND, "step": INJECT_STEP, "print": first_after} if INJECT else None,
    "tolerance": 5e-06,
    "steps_per_epoch": steps_per_epoch,
    "printed": printed,
    "evaluations": evaluations,
}
with open(os.path.join(HERE, f"{RUN}.truth.json"), "w") as f:
    json.dump(truth, f, indent=1)
    f.write("\n")
