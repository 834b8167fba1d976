"""How lightning_tqdm.log (and .nan.log, .diverge.log) were made: Lightning's own example
examples/pytorch/basics/transformer.py (Lightning-AI/pytorch-lightning, commit a9ca6b1bb4d1150088290a4529ba1b6c6d5c5965:
a LanguageModel around lightning.pytorch.demos.Transformer whose training_step does
`self.log("train_loss", loss, prog_bar=True)`), its LightningModule copied as published, run with the default
TQDMProgressBar, except:
- `import pytorch_lightning as L` (the package installed here) for `import lightning as L`;
- synthetic data: SyntheticText below has WikiText2's interface (a token tensor cut in blocks of 35, the target
  the input shifted by one) over a 250-token vocabulary drawn from a fixed random Markov chain, so that there is
  something to learn (the example downloads WikiText-2, vocabulary 33278);
- 400 training samples (20 batches of 20), 40 for validation and 40 for test (the example: all but 4000, 2000,
  2000), 4 epochs (the example: 20);
- Trainer: log_every_n_steps=1, callbacks=[TQDMProgressBar(refresh_rate=1), Inject()], default_root_dir a
  temporary folder (logs and checkpoints out of the tree), and torch.set_num_threads(1);
- the losses are kept in a list by training_step, and written to the truth sidecar at the end;
- CORPUS_INJECT=nan:STEP / diverge:STEP (README.md): the Inject callback acts in on_train_batch_start of the batch
  whose global count (epoch * 20 + the bar's 1-based batch count) is STEP. nan: one weight of the output layer
  is set to NaN, so the loss of batch STEP and every later one is NaN. diverge: the SGD learning rate is
  multiplied by 1000 (0.1 -> 100) before batch STEP's optimizer step, so batch STEP + 1 is the first loss that
  feels it.

Made with Python 3.11, torch 2.14.1 (CPU), pytorch-lightning 2.6.6, tqdm 4.70.1, from /work/main:

    /root/torchvenv/bin/python tests/data/real/lightning_tqdm.py > tests/data/real/lightning_tqdm.log 2>&1
    CORPUS_INJECT=nan:50 /root/torchvenv/bin/python tests/data/real/lightning_tqdm.py \\
        > tests/data/real/lightning_tqdm.nan.log 2>&1
    CORPUS_INJECT=diverge:50 /root/torchvenv/bin/python tests/data/real/lightning_tqdm.py \\
        > tests/data/real/lightning_tqdm.diverge.log 2>&1

The bar (written to a file, not a terminal) redraws with \\r, twice a batch: first with the new batch count and
the previous batch's train_loss, then with this batch's. At each epoch's start it is reset and redrawn at 0/20
with the last loss of the epoch before, first still labelled with the old epoch (`Epoch 0:   0%| 0/20`), then
with the new one; validation draws its own bar lines, each ending in \\x1b[A, in between. The postfix shows 3
significant digits, padded with zeros by Lightning (`train_loss=5.520`, `90.30`, `3.58e+3`, `nan.0`), hence
"rtol" in the sidecar. Beside each log, RUN.truth.json lists every training batch (all are drawn with
refresh_rate=1) with the epoch as the bar prints it, the bar's batch count, the global count and the loss
training_step logged for it.
"""

import json
import math
import os
import sys
import tempfile

import pytorch_lightning as L
import torch
import torch.nn.functional as F
from pytorch_lightning.callbacks import Callback, TQDMProgressBar
from pytorch_lightning.demos import Transformer
from torch.utils.data import DataLoader, Dataset, random_split

HERE = os.path.dirname(os.path.abspath(__file__))
NAME = "lightning_tqdm"
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
        callbacks=[TQDMProgressBar(refresh_rate=1), Inject()],
        default_root_dir=tempfile.mkdtemp(prefix="lightning_corpus_"),
    )
    trainer.fit(model, train_dataloader, val_dataloader)
    trainer.test(model, test_dataloader)

    sys.stdout.flush()
    with open(os.path.join(HERE, RUN + ".truth.json"), "w") as f:
        json.dump(
            {
                "script": NAME + ".py",
                "source": "Lightning-AI/pytorch-lightning examples/pytorch/basics/transformer.py",
                "framework": f"PyTorch Lightning {L.__version__} (torch {torch.__version__}), TQDMProgressBar",
                "inject": INJECT,
                "rtol": 5e-3,
                "printed": truth,
            },
            f,
            indent=1,
        )


if __name__ == "__main__":
    main()
