"""How tqdm_write_loop.log was made: a hand-written PyTorch loop of the kind tqdm's README shows (a bar a
epoch, the loss in its postfix, other news written over it with tqdm.write), not a published script: the loss
appears only in the bar, and the bar is redrawn at the same position after each tqdm.write.

- an MLP on synthetic MNIST-shaped data (784 values, a label 0-9 that brightens 78 of them by 0.1),
  4 epochs of 100 batches of 128, SGD; torch.set_num_threads(1);
- the bar: tqdm(total=100, desc=f"Epoch {epoch}"), each batch `bar.set_postfix(loss=f"{loss:.4f}",
  refresh=False); bar.update()`: tqdm draws it at most every 0.1 s (mininterval), so the log shows some
  batches, not all; every 25 batches the model is evaluated and `tqdm.write(f"val_loss: {v:.4f}  val_acc:
  {a:.3f}")` clears the bar, prints, and redraws the bar where it was; after the epoch's last batch,
  `tqdm.write(f"Epoch {epoch} done")`, then bar.close() (leave=True: the bar's line ends);
- the truth sidecar (RUN.truth.json) lists each batch whose bar the log shows, once, with the loss the script
  computed: the script wraps the bar's display() to note the count and loss of every draw. `epoch` is the
  desc's, `step` the bar's count, `global` the batches since the start of training.

    cd tests/data/real
    PYTHONUNBUFFERED=1 /tmp/venv-torch/bin/python tqdm_write_loop.py > tqdm_write_loop.log 2>&1

PYTHONUNBUFFERED=1 as tfrun sets it for a job (runner/scheduler.py): tqdm.write prints to stdout and the bar
to stderr, which a block-buffered stdout would reorder. Made with Python 3.11, PyTorch 2.14.1 (CPU),
tqdm 4.70.1.
"""

import json
import os

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset
from tqdm import tqdm

torch.set_num_threads(1)
torch.manual_seed(0)
HERE = os.path.dirname(os.path.abspath(__file__))
RUN = "tqdm_write_loop"
EPOCHS, BATCHES, BATCH, EVAL_EVERY = 4, 100, 128, 25

labels = torch.randint(0, 10, (BATCHES * BATCH + 500,))
images = torch.rand(len(labels), 784)
images[torch.arange(len(labels))[:, None], labels[:, None] * 78 + torch.arange(78)] += 0.1
images = images.clamp(0, 1)
train = DataLoader(TensorDataset(images[:-500], labels[:-500]), batch_size=BATCH, shuffle=True)
val_x, val_y = images[-500:], labels[-500:]

model = nn.Sequential(nn.Linear(784, 2048), nn.ReLU(), nn.Linear(2048, 2048), nn.ReLU(), nn.Linear(2048, 10))
optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
loss_fn = nn.CrossEntropyLoss()
shown = {}  # global step -> the loss its bar showed, in the order first drawn


def noting(bar, epoch, loss_of):
    """The bar, its every draw noted in `shown` (the count it draws and the loss its postfix holds)."""
    draw = bar.display

    def display(msg=None, pos=None):
        if msg is None and bar.n:  # a draw, not a clear; a bar at 0 shows no batch's loss
            shown[(epoch - 1) * BATCHES + bar.n] = (epoch, bar.n, loss_of())
        return draw(msg, pos)

    bar.display = display
    return bar


for epoch in range(1, EPOCHS + 1):
    last = {"loss": None}
    bar = noting(tqdm(total=BATCHES, desc=f"Epoch {epoch}"), epoch, lambda: last["loss"])
    for x, y in train:
        model.train()
        loss = loss_fn(model(x), y)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        last["loss"] = loss.item()
        bar.set_postfix(loss=f"{loss.item():.4f}", refresh=False)
        bar.update()
        if bar.n % EVAL_EVERY == 0:
            model.eval()
            with torch.no_grad():
                logits = model(val_x)
                val_loss = loss_fn(logits, val_y).item()
                val_acc = (logits.argmax(1) == val_y).float().mean().item()
            tqdm.write(f"val_loss: {val_loss:.4f}  val_acc: {val_acc:.3f}")
    tqdm.write(f"Epoch {epoch} done")
    bar.close()

printed = [{"epoch": e, "step": n, "global": g, "loss": v} for g, (e, n, v) in shown.items()]
with open(os.path.join(HERE, RUN + ".truth.json"), "w") as f:
    json.dump({"script": "tqdm_write_loop.py", "source": "hand-written: tqdm's README (set_postfix, tqdm.write)",
               "framework": f"PyTorch {torch.__version__.split('+')[0]}", "inject": None, "tolerance": 5e-05,
               "printed": printed}, f, indent=1)
    f.write("\n")
