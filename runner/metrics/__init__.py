"""Metrics read from a job's raw output, for the alert rules of a script that does not use tfrun.jobs.

The daemon hands over output.log as it grows, in chunks cut anywhere. The unit here is a segment: the text
between two of \\r, \\n and \\b, which is one redraw of a progress bar or one printed line; a segment cut by
the end of a chunk waits for the next. Recognised, in this order (ANSI colour removed, bad UTF-8 replaced):

- the user's patterns (RE2, named groups), which win over the formats below where they find a metric;
- Keras 2 and 3 `model.fit` (verbose 1 and 2): `Epoch 3/10`, then `5/9 [===>...] - ETA: 0s - loss: 0.7428`;
- a tqdm bar with metrics in its postfix or description, Lightning's among them:
  `Epoch 0:  45%|████▌     | 45/100 [00:01<00:02, 25.0it/s, v_num=0, loss=1.23]`. One sample a step: a bar
  redraws a step more than once (Lightning twice, the first time with the previous step's loss), so a step is
  taken, as its last redraw, when the bar draws the next step or ends its line, and once: a bar drawn again at a
  step already taken (Lightning's after each validation, with the val_loss) adds no sample; a bar at 0 (a new
  epoch's, still showing the last epoch's loss) is no step;
- Lightning's rich bar, `Epoch 0/3  ━━━╺━━━ 4/20 0:00:01 • 0:00:07 2.35it/s v_num: 0.000`, its metrics on the
  lines under it, wrapped anywhere; again the last redraw of each step, once;
- a print glued to a tqdm bar's redraw on one line (the bar on stderr, the print on stdout:
  `training:   1%|   | 2/200 [00:00<00:59, 3.35it/s]training loss: 5.32`): the bar is read, then the print;
- a column table (runner/metrics/tables.py): a header of names, one a loss (fastai's `epoch  train_loss
  valid_loss  accuracy  time`, skorch's, spaCy's `E  #  LOSS TOK2VEC  LOSS NER ...`, scikit-learn's `Iter  Train
  Loss  Remaining Time`), then its rows of numbers, read by column until the shape changes (a few stray lines,
  a rule of dashes and a header printed again do not end it); a `#`/`step`/`iter` column is the row's step, an
  `epoch`/`E` column its epoch;
- a box of `| name | value |` rows between two rules (stable-baselines3's), one sample a box, `section/name`,
  at the step of its counter (`time/total_timesteps`, else updates, iterations, episodes);
- a plain print with a loss: `Epoch 1, Avg Loss: 0.2345`, `step 100 loss=1.23`, `iter 100 | loss 1.2300`,
  `Training loss (for 1 batch) at step 100: 0.4312`, `{'loss': 0.23, 'step': 5}`, Hugging Face's
  `{'loss': '3.718', 'grad_norm': '1.875', ...}`, JSON lines; with it, a dataset's figures whatever their metric
  (`valid_auc: 0.69`, `Val: 0.285`); a boosting round's figures whatever their names (LightGBM's
  `[10]\ttraining's l1: 0.34\tvalid_1's l1: 0.33`, XGBoost's `[3]\ttrain-rmse:0.4\teval-rmse:0.5`). Values in
  any float notation, `nan`, `nan.0`, `inf.0`, `Infinity`, and tensors and NumPy scalars (`tensor(0.23,
  grad_fn=<...>)`, `tf.Tensor(0.23, shape=(), dtype=float32)`, `np.float32(0.23)`).

The step of a print is the one it says: `step N`, `iter N`, `| 200/ 2983 batches |`, MMEngine's `Epoch(train)
[E][N/M]` and `Iter(train) [N/M]`, and `[N/M (p%)]` (PyTorch's examples), which counts samples, not batches. The
batch size cannot be read from those prints (the gap between two is the log interval times the batch size, and the
percentage is N/M again), so that step is the sample count: a step the line shows, where an alert points to. A
printed step that restarts each epoch is made global, by the epoch's length where the line prints it (`Step
[100/600]`), else by the last step printed (plus one where it starts again at 0: a counter that starts again at
1 counts from 1); the line's own counter stays in Sample.printed_step, with the epoch
(from the line, or from the last line that named one alone: `Start of epoch 3`), for the alert to quote. A print
with no step written over a tqdm bar (tqdm.write: Hugging Face's Trainer, ignite's example), while the bar is drawn
or left before its end (Trainer's, under its evaluation's bar), takes the count the bar is redrawn with right after
it. Any other print with no step, an evaluation's or a summary's (`Training Results - Epoch: 1 ... Avg loss: 2.29`,
Trainer's last `{'train_loss': ...}`), is placed at the step training got to: the last sample's, or that of a bar's
step held for its last redraw. Where that step has the print's metric already (a loop that prints a line an epoch
after one `Step: 1` line), training went on without saying where, and the print is counted on from that step; only
where nothing in the log gave a step yet is a print's step its count of such prints. A word of evaluation (`val`,
`valid`, `validation`, `test`, `eval`) qualifies the figure it names (`Val: 0.285`, `val_loss`, `valid_1's l1`),
and the line's other figures only where it names none of its own: `Test set: Average loss: 0.2475` is
`test_loss`, while `Epoch: 001, Loss: 2.0, Train: 0.31, Val: 0.28` is a training sample with `val` beside it.
Which figure is the training loss is tfrun/losses.py's rule, which `--explain` quotes where no name is `loss`.

Stands on: records, logs (terminal lines), shim (the job's folder).

One sample a step a metric: a value its step has given already (a bar redrawn where it was after tqdm.write, a
line printed again) is left out of a sample, and a sample left with no value is none; a value that differs is
kept, the last the log shows (an evaluation's lines at one step, timm's `Test: [0/1]` then `[1/1]`). Steps never
go back: a printed counter, a Keras `Epoch k/N` or a bar that starts over (a second training loop's `Epoch 1`)
goes on from the steps before it, and `tfrun metrics --explain` says that the log starts over.

tests/data/real/ holds the output of 27 training scripts, 25 of them published, and what each computed;
tests/test_corpus.py checks this reader on all of it (docs/explanation/metrics.md has the table).

Keras prints the running mean of each metric since the start of the epoch. An alert needs what the model does
now, so each redraw gives the mean over the batches since the previous redraw, decoded from two running means
(b batches, mean m): (b2*m2 - b1*m1) / (b2 - b1). That is exact up to Keras's rounding to 4 digits, which this
multiplies by about (b2 + b1) / (b2 - b1): late in a long epoch redrawn at every batch, an interval mean is only
good to a few hundredths (tfrun.jobs writes exact losses, and the daemon prefers them). Where that error passes
the interval mean itself (a loss near 0), decoding can give a negative mean: each interval mean is then clamped to
what the printed precision allows, [max(0, lo), hi] around it, for a metric never printed negative. The decoded
value is the middle of [lo, hi] (its bounds are its error either side), so the clamp is max(0, decoded): a
non-negative loss cannot have a negative interval mean, and 0 is the bound nearest to what was decoded. A fall
back to the printed running mean was not taken: it can lie above hi, which the printed means rule out. Values
printed once an epoch (val_*, and any that appear only on the epoch's last line) are taken as printed.

A daemon reads every job's whole output, up to tens of MB/s: a block with no "loss", "epoch", tqdm rate,
boosting round (`]\t`) or rule (`-----`) in it (nor a match of a user pattern) costs a few byte searches, and only
the segments that hold one are looked at (every segment while a table or a box is printed: its rows hold none);
a print with no dataset's word in it is read by one search (bench/parse.py measures it).
"""

from .reader import MAX_SEGMENT, LogMetrics
from .state import PatternError, Sample, plausible, training_loss

__all__ = ["MAX_SEGMENT", "LogMetrics", "PatternError", "Sample", "plausible", "training_loss"]
