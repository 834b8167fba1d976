"""How lightning_rich.log (and .nan.log) were made: the script of lightning_tqdm.py (Lightning's
own example examples/pytorch/basics/transformer.py, Lightning-AI/pytorch-lightning, commit
a9ca6b1bb4d1150088290a4529ba1b6c6d5c5965, whose training_step does `self.log("train_loss", loss, prog_bar=True)`),
with every change listed there, but `RichProgressBar()` (its defaults: refresh_rate=100, metrics_format=".3f")
in place of TQDMProgressBar(refresh_rate=1). In short, the changes to the example: `import pytorch_lightning as
L`; synthetic WikiText2-like data (250-token Markov chain, blocks of 35; 400/40/40 samples, 20 training batches
an epoch); 4 epochs; Trainer(log_every_n_steps=1, callbacks=[RichProgressBar(), Inject()], default_root_dir a
temporary folder); torch.set_num_threads(1); training_step keeps its losses for the truth sidecar;
CORPUS_INJECT=nan:STEP / diverge:STEP acts in on_train_batch_start of the batch whose global count (epoch * 20
+ the bar's 1-based batch count) is STEP: nan sets one output-layer weight to NaN (the loss of batch STEP and
all later ones are NaN); diverge multiplies the SGD learning rate by 1000 (0.1 -> 100) before batch STEP's
optimizer step (batch STEP + 1 is the first loss that feels it).

Made with Python 3.11, torch 2.14.1 (CPU), pytorch-lightning 2.6.6, rich 15.0.0, from /work/main:

    /root/torchvenv/bin/python tests/data/real/lightning_rich.py > tests/data/real/lightning_rich.log 2>&1
    CORPUS_INJECT=nan:50 /root/torchvenv/bin/python tests/data/real/lightning_rich.py \\
        > tests/data/real/lightning_rich.nan.log 2>&1

(A .diverge run was made too, and left out of the corpus: with one print no rule can see a loss rise.)

What rich prints when its output is not a terminal (a file, a pipe, `tfrun submit --tty`'s tee): no live bar at
all. Rich's Live display only draws on a terminal; when the bar stops it prints its last state once, so the
whole training shows as a single bar, the last epoch's at its last batch, its metrics wrapped onto lines of
their own at 80 columns:

    Epoch 3/3  ━━━━━━━━━━━━━━━━━ 20/20 0:00:06 • 0:00:00 2.87it/s v_num: 0.000
                                                                  train_loss: 5.432
                                                                  val_loss: 5.352

So each log holds one training loss, that of the last batch (epoch 3, batch 20, global 80), with 3 decimals
(".3f": "tolerance" 5e-4 in the sidecar); a NaN prints as `train_loss: nan`, and a wide value can be wrapped
away from its name (`train_loss:` at the end of one line, `179.358 val_loss:` on the next). The NaN run is kept
to show that the NaN is visible only once training is over.

When rich believes it writes to a terminal (FORCE_COLOR or TTY_COMPATIBLE set in the environment, as CI setups
and Docker images often do, or a real terminal), the bar is drawn live instead: each redraw starts with
`\\r\\x1b[2K` (and `\\x1b[1A\\x1b[2K` per line above it), colours and all, its metrics on lines of their own.
Those runs are lightning_rich_terminal*.log, made the same way with FORCE_COLOR=1:

    FORCE_COLOR=1 /root/torchvenv/bin/python tests/data/real/lightning_rich.py \\
        > tests/data/real/lightning_rich_terminal.log 2>&1
    FORCE_COLOR=1 CORPUS_INJECT=nan:50 /root/torchvenv/bin/python tests/data/real/lightning_rich.py \\
        > tests/data/real/lightning_rich_terminal.nan.log 2>&1
    FORCE_COLOR=1 CORPUS_INJECT=diverge:50 /root/torchvenv/bin/python tests/data/real/lightning_rich.py \\
        > tests/data/real/lightning_rich_terminal.diverge.log 2>&1

Their sidecars (lightning_rich_terminal*.truth.json, "script" still lightning_rich.py) list the batches whose
last redraw shows their own loss (see shown()): rich redraws from a thread, so a few batches are only ever
drawn with the previous batch's loss and are left out.
"""


import json
import math
import os
import re
import sys
import tempfile

import pytorch_lightning as L
import torch
import torch.nn.functional as F
from pytorch_lightning.callbacks import Callback, RichProgressBar
from pytorch_lightning.demos import Transformer
from torch.utils.data import DataLoader, Dataset, random_split

HERE = os.path.dirname(os.path.abspath(__file__))
NAME = "lightning_rich"
BATCHES = 20  # training batches an epoch
torch.set_num_threads(1)

INJECT = None
if os.environ.get("CORPUS_INJECT"):
    kind, step = os.environ["CORPUS_INJECT"].split(":")
    INJECT = {"kind": kind, "step": int(step)}
RUN = NAME + ("." + INJECT["kind"] if INJECT else "")

truth = []


def finite(x: float):
    """JSON has no NaN or Infinity: those are written as the strings "nan", "inf", "-inf"."""
    return x if math.isfinite(x) else str(x)


class SyntheticText(Dataset):
    """WikiText2's interface over synthetic tokens (the example downloads WikiText-2)."""

    def __init__(self, samples: int = 480, block_size: int = 35, vocab: int = 250) -> None:
        super().__init__()
        g = torch.Generator().manual_seed(0)
        nxt = torch.randint(0, vocab, (vocab, 3), generator=g)  # each token has 3 likely successors
        data = torch.empty((samples + 1) * block_size, dtype=torch.long)
        data[0] = 0
        choice = torch.randint(0, 3, (len(data),), generator=g)
        noise = torch.randint(0, vocab, (len(data),), generator=g)
        coin = torch.rand(len(data), generator=g)
        for i in range(1, len(data)):
            data[i] = nxt[data[i - 1], choice[i]] if coin[i] < 0.9 else noise[i]
        self.data = data
        self.block_size = block_size
        self._vocab = vocab

    @property
    def vocab_size(self) -> int:
        return self._vocab

    def __len__(self) -> int:
        return len(self.data) // self.block_size - 1

    def __getitem__(self, index: int):
        start = index * self.block_size
        end = start + self.block_size
        return self.data[start:end], self.data[(start + 1) : (end + 1)]


class LanguageModel(L.LightningModule):
    def __init__(self, vocab_size):
        super().__init__()
        self.model = Transformer(vocab_size=vocab_size)

    def training_step(self, batch, batch_idx):
        input, target = batch
        output = self.model(input, target)
        loss = F.nll_loss(output, target.view(-1))
        self.log("train_loss", loss, prog_bar=True)
        epoch = self.current_epoch
        step = batch_idx + 1  # the bar's count
        truth.append({"epoch": epoch, "step": step, "global": epoch * BATCHES + step, "loss": finite(loss.item())})
        return loss

    def validation_step(self, batch, batch_idx):
        input, target = batch
        output = self.model(input, target)
        loss = F.nll_loss(output, target.view(-1))
        self.log("val_loss", loss, prog_bar=True)
        return loss

    def test_step(self, batch, batch_idx):
        input, target = batch
        output = self.model(input, target)
        loss = F.nll_loss(output, target.view(-1))
        self.log("test_loss", loss, prog_bar=True)
        return loss

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)


class Inject(Callback):
    """CORPUS_INJECT: acts at the start of the batch whose global count is STEP."""

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
        if INJECT is None or trainer.current_epoch * BATCHES + batch_idx + 1 != INJECT["step"]:
            return
        if INJECT["kind"] == "nan":
            with torch.no_grad():
                pl_module.model.decoder.weight[0, 0] = float("nan")
        elif INJECT["kind"] == "diverge":
            for group in trainer.optimizers[0].param_groups:
                group["lr"] *= 1000


def shown(rows):
    """The batches whose loss a live rich bar shows: its last redraw at that batch count shows that batch's loss.

    Rich redraws from a thread (refresh_per_second = the bar's refresh_rate, 100), when the bar asks for it after
    the batch count and again after the metrics change; a redraw that falls between the two shows the new count
    with the previous batch's loss, and most batches are drawn once or twice, but not every one. This reads the
    script's own stdout (the log being written) back, a redraw a `\\r`, to list those rows only.
    """
    sys.stdout.flush()
    with open("/proc/self/fd/1", newline="") as f:
        log = f.read()
    last = {}
    for redraw in log.split("\r"):
        plain = re.sub(r"\x1b\[[0-9;]*[A-Za-z]", "", redraw)
        m = re.search(r"Epoch (\d+)/\d+ .*? (\d+)/\d+ .*?train_loss:\s*(\S+)", plain, re.S)
        if m:
            last[(int(m[1]), int(m[2]))] = m[3]
    return [r for r in rows if last.get((r["epoch"], r["step"])) == f"{float(r['loss']):.3f}"]


def main():
    L.seed_everything(42)

    # Data
    dataset = SyntheticText()

    # Split data in to train, val, test
    n = len(dataset)
    train_dataset, val_dataset, test_dataset = random_split(dataset, [n - 80, 40, 40])
    train_dataloader = DataLoader(train_dataset, batch_size=20, shuffle=True)
    val_dataloader = DataLoader(val_dataset, batch_size=20, shuffle=False)
    test_dataloader = DataLoader(test_dataset, batch_size=20, shuffle=False)
    assert len(train_dataloader) == BATCHES

    # Model
    model = LanguageModel(vocab_size=dataset.vocab_size)

    # Trainer
    trainer = L.Trainer(
        gradient_clip_val=0.25,
        max_epochs=4,
        log_every_n_steps=1,
        callbacks=[RichProgressBar(), Inject()],
        default_root_dir=tempfile.mkdtemp(prefix="lightning_corpus_"),
    )
    trainer.fit(model, train_dataloader, val_dataloader)
    trainer.test(model, test_dataloader)

    sys.stdout.flush()
    # Not a terminal: only the bar's last state is printed, once, so only the last batch's loss is in the log.
    # A terminal (FORCE_COLOR=1 or TTY_COMPATIBLE=1 with a file): the bar is redrawn live, see shown().
    terminal = trainer.progress_bar_callback._console.is_terminal
    run = RUN.replace(NAME, NAME + "_terminal") if terminal else RUN
    printed = shown(truth) if terminal else truth[-1:]
    with open(os.path.join(HERE, run + ".truth.json"), "w") as f:
        json.dump(
            {
                "script": NAME + ".py",
                "source": "Lightning-AI/pytorch-lightning examples/pytorch/basics/transformer.py",
                "framework": f"PyTorch Lightning {L.__version__} (torch {torch.__version__}), RichProgressBar",
                "inject": INJECT,
                "tolerance": 5e-4,
                "printed": printed,
            },
            f,
            indent=1,
        )


if __name__ == "__main__":
    main()
