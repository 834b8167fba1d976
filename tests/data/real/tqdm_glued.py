"""x-transformers' enwik8 example (lucidrains/x-transformers, train_enwik8.py at commit dbc0d955, 2025-02-05,
"move examples to root"; run with x-transformers 2.31.10 from PyPI): a character-level GPT (TransformerWrapper +
Decoder, AutoregressiveWrapper) trained in a loop that shows a tqdm bar (stderr) and prints its loss with print()
(stdout):

    for i in tqdm.tqdm(range(NUM_BATCHES), mininterval=10., desc='training'):
        ...
        print(f'training loss: {loss.item()}')

With stdout and stderr in one file, the bar's redraw ('\\r' and the bar, no newline) and the next print land on one
line of the file:

    \\rtraining:   0%|          | 0/200 [00:00<?, ?it/s]training loss: 5.7963175773620605
    validation loss: 5.608320236206055
    ...
    \\rtraining:   0%|          | 1/200 [00:00<01:25,  2.32it/s]training loss: 5.6150970458984375
    \\rtraining:   1%|          | 2/200 [00:00<00:59,  3.35it/s]training loss: 5.319291591644287

(each draw of the bar starts with '\\r'; here every one of the 200 training losses is on a bar's line, and the
log's last line is the bar at 200/200 drawn twice, by the last update and by close()).
The example's other prints are kept as published: `validation loss: ...` on its own line, and after the first
batch its sample: `print(f'%s \\n\\n %s', (prime, '*' * 100))` (an f-string without fields: it prints "%s", two
newlines, " %s" and the tuple's repr), then the decoded sample of the barely trained model: 192 characters
chr(max(32, token)) of tokens 0-255, among them C1 controls such as U+0085 (NEL), which str.splitlines() takes
for a line break.

tqdm redraws the bar when the loop asks for its next item, after the body that printed iteration i's loss: a bar
that shows count n is followed on its line by the loss of iteration n (0-based), which is step n+1 once done.

Changes (the loop's body and prints are as published):
- synthetic data (the example reads ./data/enwik8.gz, which is not here): 1,050,000 bytes of made-up text, words of
  2-8 lowercase letters drawn from a 400-word vocabulary (Zipf-like weights), sentences of 4-14 words ending in '. '
  and a newline every ~12 sentences, split 1,000,000 / 50,000 for train / validation like the example's 90e6 / 5e6;
- a tiny model on the CPU: Decoder(dim = 128, depth = 2, heads = 4) (the example: 512, 6, 8), SEQ_LEN 192
  (the example: 1024), GENERATE_LENGTH 192 (1024); `.cuda()` calls dropped; torch on 1 thread; seeds 0;
- NUM_BATCHES 200 (the example: 1e5), VALIDATE_EVERY 25 (100), so the log has 200 training losses and 8
  validation losses; GENERATE_EVERY stays 500: one sample is printed, after the first batch;
- the bar's mininterval=0.1 (tqdm's default; the example: 10 s, which with these ~0.2 s steps would redraw the bar
  once in ~50 steps): each step is slower than 0.1 s, so tqdm redraws the bar after every step. No sleeps;
- CORPUS_INJECT=nan:STEP: before iteration STEP (0-based), the weight of the logits layer (model.net.to_logits)
  is filled with NaN, so iteration STEP's training loss and every later loss are NaN;
- the truth sidecar (RUN.truth.json, RUN from CORPUS_RUN): each printed training loss (the same loss.item() that
  the print writes), with `global` = `step` = i+1 (the bar's count once iteration i is done) and `epoch` null;
  `evaluations` lists each `validation loss` as val_loss at the same i+1 (it is computed after iteration i's
  optimizer step). The print writes Python's repr of the float (all its digits): `tolerance` 1e-12.

    cd tests/data/real
    CORPUS_RUN=tqdm_glued PYTHONUNBUFFERED=1 /tmp/cv-rl/bin/python tqdm_glued.py > tqdm_glued.log 2>&1
    CORPUS_RUN=tqdm_glued.nan CORPUS_INJECT=nan:120 PYTHONUNBUFFERED=1 /tmp/cv-rl/bin/python tqdm_glued.py \\
        > tqdm_glued.nan.log 2>&1

`inject.print` is the index in `printed` of the first NaN loss (iteration STEP's).
"""

import importlib.metadata
import json
import math
import os

from x_transformers import TransformerWrapper, Decoder
from x_transformers.autoregressive_wrapper import AutoregressiveWrapper

import random
import tqdm
import gzip
import numpy as np
import torch
import torch.optim as optim
from torch.nn import functional as F
from torch.utils.data import DataLoader, Dataset

torch.set_num_threads(1)
torch.manual_seed(0)
random.seed(0)
HERE = os.path.dirname(os.path.abspath(__file__))
RUN = os.environ.get("CORPUS_RUN", "tqdm_glued")
INJECT = os.environ.get("CORPUS_INJECT")
KIND, INJECT_STEP = (INJECT.split(":")[0], int(INJECT.split(":")[1])) if INJECT else (None, None)
printed, evaluations = [], []

# constants

NUM_BATCHES = 200
BATCH_SIZE = 4
GRADIENT_ACCUMULATE_EVERY = 4
LEARNING_RATE = 1e-4
VALIDATE_EVERY  = 25
GENERATE_EVERY  = 500
GENERATE_LENGTH = 192
SEQ_LEN = 192

# helpers

def cycle(loader):
    while True:
        for data in loader:
            yield data

def decode_token(token):
    return str(chr(max(32, token)))

def decode_tokens(tokens):
    return ''.join(list(map(decode_token, tokens)))

# instantiate GPT-like decoder model

model = TransformerWrapper(
    num_tokens = 256,
    max_seq_len = SEQ_LEN,
    attn_layers = Decoder(
        dim = 128,
        depth = 2,
        heads = 4,
        rotary_pos_emb = True
    )
)

model = AutoregressiveWrapper(model)

# prepare enwik8 data: synthetic text (the example reads ./data/enwik8.gz)

def synthetic_text(n_bytes, rng):
    letters = np.array(list("abcdefghijklmnopqrstuvwxyz"))
    vocab = ["".join(rng.choice(letters, rng.integers(2, 9))) for _ in range(400)]
    weights = 1.0 / np.arange(1, len(vocab) + 1)
    weights /= weights.sum()
    out, size, sentences = [], 0, 0
    while size < n_bytes:
        words = list(rng.choice(vocab, rng.integers(4, 15), p=weights))
        words[0] = words[0].capitalize()
        sentences += 1
        s = " ".join(words) + (".\n" if sentences % 12 == 0 else ". ")
        out.append(s)
        size += len(s)
    return "".join(out)[:n_bytes].encode("ascii")

data = np.frombuffer(synthetic_text(1_050_000, np.random.default_rng(0)), dtype=np.uint8).copy()
train_x, valid_x = np.split(data, [1_000_000])
data_train, data_val = torch.from_numpy(train_x), torch.from_numpy(valid_x)

class TextSamplerDataset(Dataset):
    def __init__(self, data, seq_len):
        super().__init__()
        self.data = data
        self.seq_len = seq_len

    def __getitem__(self, index):
        rand_start = torch.randint(0, self.data.size(0) - self.seq_len - 1, (1,))
        full_seq = self.data[rand_start: rand_start + self.seq_len + 1].long()
        return full_seq

    def __len__(self):
        return self.data.size(0) // self.seq_len

train_dataset = TextSamplerDataset(data_train, SEQ_LEN)
val_dataset   = TextSamplerDataset(data_val, SEQ_LEN)
train_loader  = cycle(DataLoader(train_dataset, batch_size = BATCH_SIZE, drop_last = True))
val_loader    = cycle(DataLoader(val_dataset, batch_size = BATCH_SIZE, drop_last = True))

# optimizer

optim = torch.optim.Adam(model.parameters(), lr=LEARNING_RATE)

# training

for i in tqdm.tqdm(range(NUM_BATCHES), mininterval=0.1, desc='training'):
    if KIND == "nan" and i == INJECT_STEP:
        with torch.no_grad():
            model.net.to_logits.weight.fill_(float("nan"))

    model.train()

    for __ in range(GRADIENT_ACCUMULATE_EVERY):
        loss = model(next(train_loader))
        (loss / GRADIENT_ACCUMULATE_EVERY).backward()

    print(f'training loss: {loss.item()}')
    printed.append({"epoch": None, "step": i + 1, "global": i + 1, "loss": loss.item()})
    torch.nn.utils.clip_grad_norm_(model.parameters(), 0.5)
    optim.step()
    optim.zero_grad()

    if i % VALIDATE_EVERY == 0:
        model.eval()
        with torch.no_grad():
            loss = model(next(val_loader))
            print(f'validation loss: {loss.item()}')
            evaluations.append({"name": "val_loss", "epoch": None, "step": i + 1, "global": i + 1,
                                "value": loss.item()})

    if i % GENERATE_EVERY == 0:
        model.eval()
        inp = random.choice(val_dataset)[:-1]
        prime = decode_tokens(inp)
        print(f'%s \n\n %s', (prime, '*' * 100))

        sample = model.generate(
            prompts = inp,
            seq_len = GENERATE_LENGTH,
            cache_kv = True
        )

        output_str = decode_tokens(sample)
        print(output_str)

first_nan = next((k for k, p in enumerate(printed) if not math.isfinite(p["loss"])), None)
truth = {
    "script": "tqdm_glued.py",
    "source": "lucidrains/x-transformers train_enwik8.py (commit dbc0d955)",
    "framework": f"x-transformers {importlib.metadata.version('x-transformers')}"
                 f" / PyTorch {torch.__version__.split('+')[0]} / tqdm {tqdm.__version__}",
    "inject": {"kind": KIND, "step": INJECT_STEP, "print": first_nan} if INJECT else None,
    "tolerance": 1e-12,
    "printed": printed,
    "evaluations": evaluations,
}
with open(os.path.join(HERE, f"{RUN}.truth.json"), "w") as f:
    json.dump(truth, f, indent=1)
    f.write("\n")
