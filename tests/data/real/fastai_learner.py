"""How fastai_learner.log (and .nan.log, .diverge.log) were made: fastai's "Tabular training" tutorial
(fastai/fastai nbs/44_tutorial.tabular.ipynb, commit 51edd15b0ea08087a5a896794d26a4803ad80e6b; docs.fast.ai
/tutorial.tabular): `TabularDataLoaders.from_csv(path/'adult.csv', path=path, y_names="salary", cat_names=[...],
cont_names=[...], procs=[Categorify, FillMissing, Normalize])`, `learn = tabular_learner(dls, metrics=accuracy)`,
`learn.fit_one_cycle(...)`, as published, with fastai's default callbacks (Recorder, ProgressCallback: fastprogress's
console bars, as the script is not in a notebook), except:
- synthetic data: the tutorial downloads the Adult sample (untar_data(URLs.ADULT_SAMPLE), 32561 rows); here
  adult.csv is written to a temporary folder with the same columns and 400 synthetic rows (a salary that depends
  on age, education-num and two of the categories, plus noise; some education-num missing), so that from_csv's
  random 80/20 split gives 5 training batches of 64 an epoch;
- fit_one_cycle(50) (the tutorial: 2), so that there are >= 30 epoch rows before the injection;
- torch.set_num_threads(1), fastai's set_seed(42);
- an Inject callback (below) and a Truth callback that keeps, for the sidecar, the recorder's values after each epoch
  (learn.recorder.values: the row's train_loss is the Recorder's smoothed loss, AvgSmoothLoss(beta=0.98), at the
  end of the epoch) and the smoothed loss after each training batch;
- CORPUS_INJECT=nan:STEP / diverge:STEP (README.md): STEP counts training batches from 0 (learn.train_iter), 5 an
  epoch; the callback acts in before_batch of batch STEP, ahead of ParamScheduler (order 59 < 60). nan: one weight
  of the model's last Linear layer is set to NaN, so batch STEP's loss is NaN, every later one too, and the smoothed
  loss from then on. diverge: the 1cycle learning-rate schedule that ParamScheduler applies before every batch is
  multiplied by 1000 (lambda pct: sched(pct) * 1000), so batch STEP's update is the first one made with it and every
  later batch keeps it.

Made with Python 3.11.7, torch 2.14.1 (CPU), fastai 2.8.12, fastprogress 1.1.6, from /work/main:

    /root/torchvenv/bin/python tests/data/real/fastai_learner.py > tests/data/real/fastai_learner.log 2>&1
    CORPUS_INJECT=nan:165 /root/torchvenv/bin/python tests/data/real/fastai_learner.py \\
        > tests/data/real/fastai_learner.nan.log 2>&1
    CORPUS_INJECT=diverge:165 /root/torchvenv/bin/python tests/data/real/fastai_learner.py \\
        > tests/data/real/fastai_learner.diverge.log 2>&1

What the log holds (stdout, not a terminal): the table's header line `epoch     train_loss  valid_loss  accuracy
time    `, then per epoch one row `0         0.801779    0.644618    0.887500  00:00     ` (values `%.6f`), each row
preceded, on the same line, by the epoch's two \\r-redrawn bars: `Epoch 1/50 : |████----| 40.00% [2/5 00:00<00:00...
0.9322]` (the training bar, whose comment after `... ` is the smoothed loss `%.4f` as it was after the previous
batch: the redraw for batch k shows the value after batch k-1) and the validation bar, whose comment repeats the
smoothed loss at the end of training (the row's train_loss to 4 decimals), each bar blanked out with spaces when it
ends. The sidecar's `printed` lists the table's rows only: epoch as printed (from 0), step and global null (the row
prints no batch counter), loss the row's train_loss; "tolerance" 5e-07 for `%.6f`. Its "bar_losses" (not read by
the test) lists the smoothed loss after every training batch, the values the bars' comments show.
"""

import json
import os
import sys
import tempfile

import numpy as np
import pandas as pd
import torch

torch.set_num_threads(1)
import fastai
import fastprogress
from fastai.tabular.all import *  # noqa: F403 (as the tutorial)

HERE = os.path.dirname(os.path.abspath(__file__))
NAME = "fastai_learner"
EPOCHS = 50

INJECT = None
if os.environ.get("CORPUS_INJECT"):
    _kind, _step = os.environ["CORPUS_INJECT"].split(":")
    INJECT = {"kind": _kind, "step": int(_step)}
RUN = NAME + ("." + INJECT["kind"] if INJECT else "")

rows, bar_losses = [], []


def synthetic_adult(path, n=400, seed=0):
    """adult.csv's columns (those the tutorial uses, and salary) over synthetic rows."""
    rng = np.random.default_rng(seed)
    cats = {
        'workclass': ['Private', 'Self-emp-not-inc', 'Self-emp-inc', 'State-gov', 'Local-gov'],
        'education': ['HS-grad', 'Some-college', 'Bachelors', 'Masters', 'Assoc-acdm', '7th-8th', 'Prof-school'],
        'marital-status': ['Married-civ-spouse', 'Never-married', 'Divorced', 'Separated'],
        'occupation': ['Prof-specialty', 'Exec-managerial', 'Craft-repair', 'Other-service', 'Sales'],
        'relationship': ['Husband', 'Wife', 'Not-in-family', 'Own-child', 'Unmarried'],
        'race': ['White', 'Black', 'Asian-Pac-Islander', 'Other'],
    }
    df = pd.DataFrame({'age': rng.integers(17, 80, n), 'fnlwgt': rng.integers(20000, 400000, n),
                       'education-num': rng.integers(1, 17, n).astype(float)})
    for c, values in cats.items():
        df[c] = rng.choice(values, n)
    score = (0.04 * (df['age'] - 40) + 0.3 * (df['education-num'] - 9)
             + 1.0 * (df['marital-status'] == 'Married-civ-spouse') + 0.8 * (df['occupation'] == 'Exec-managerial')
             + rng.normal(0, 0.7, n))
    df['salary'] = np.where(score > 0.5, '>=50k', '<50k')
    df.loc[rng.random(n) < 0.1, 'education-num'] = np.nan
    df.to_csv(path / 'adult.csv', index=False)


class Inject(Callback):
    """CORPUS_INJECT, not in the tutorial: acts in before_batch of training batch STEP, before ParamScheduler."""
    order = 59

    def before_batch(self):
        if INJECT is None or not self.training or self.train_iter != INJECT["step"]:
            return
        if INJECT["kind"] == "nan":
            last = [m for m in self.learn.model.modules() if isinstance(m, nn.Linear)][-1]
            with torch.no_grad():
                last.weight[0, 0] = float("nan")
        elif INJECT["kind"] == "diverge":
            ps = next(cb for cb in self.learn.cbs if isinstance(cb, ParamScheduler))
            sched = ps.scheds['lr']
            ps.scheds['lr'] = lambda pct, sched=sched: sched(pct) * 1000


class Truth(Callback):
    """For the sidecar, not in the tutorial: what the Recorder computed."""
    order = 61  # after Recorder (50) and ProgressCallback (60)

    def after_batch(self):
        if self.training:
            bar_losses.append({"epoch": self.epoch, "batch": self.iter + 1, "global": self.train_iter,
                               "loss": float(self.recorder.smooth_loss.value)})

    def after_epoch(self):
        rows.append({"epoch": self.epoch, "step": None, "global": None,
                     "loss": float(self.recorder.values[-1][0])})


def main():
    set_seed(42)
    path = Path(tempfile.mkdtemp())
    synthetic_adult(path)

    dls = TabularDataLoaders.from_csv(path/'adult.csv', path=path, y_names="salary",
        cat_names = ['workclass', 'education', 'marital-status', 'occupation', 'relationship', 'race'],
        cont_names = ['age', 'fnlwgt', 'education-num'],
        procs = [Categorify, FillMissing, Normalize])
    learn = tabular_learner(dls, metrics=accuracy, cbs=[Inject(), Truth()])
    learn.fit_one_cycle(EPOCHS)
    sys.stdout.flush()

    inject = None
    if INJECT is not None:  # the first row the injection reached: that of the epoch holding batch STEP
        inject = dict(INJECT, print=next(i for i, r in enumerate(rows) if (r["epoch"] + 1) * len(dls.train) > INJECT["step"]))
    with open(os.path.join(HERE, RUN + ".truth.json"), "w") as f:
        json.dump(
            {
                "script": NAME + ".py",
                "source": "fastai/fastai nbs/44_tutorial.tabular.ipynb (Tabular training tutorial)",
                "framework": f"PyTorch {torch.__version__.split('+')[0]}, fastai {fastai.__version__}, "
                             f"fastprogress {fastprogress.__version__}",
                "inject": inject,
                "tolerance": 5e-07,
                "printed": rows,
                "bar_losses": bar_losses,
            },
            f,
            indent=0,
        )


if __name__ == '__main__':
    main()
