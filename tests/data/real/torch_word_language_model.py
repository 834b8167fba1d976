"""How torch_word_language_model.log, .nan.log and .diverge.log were made: pytorch/examples
word_language_model/main.py (the current script: an LSTM language model trained by plain SGD written out as
p.data.add_(p.grad, alpha=-lr) with lr=20 and gradient clipping at 0.25, the learning rate divided by 4 when the
validation loss does not improve; NLLLoss on the model's log_softmax), with data.py's Corpus and model.py's
RNNModel inlined, copied as published (the stored main.py read, of 2019, still had CrossEntropyLoss and
p.data.add_(-lr, p.grad.data); the code below follows the current upstream form of those lines) except:
- a synthetic corpus instead of ./data/wikitext-2: text from a 24-word vocabulary drawn from a fixed random bigram
  chain (so that there is something to learn), written to train.txt/valid.txt/test.txt in a temporary directory
  and read by the published Corpus (which adds <eos> at each line end); 28720 training tokens, so 1436 rows of 20,
  41 batches of 35 an epoch (and 1436 = 41 * 35 + 1, so the printed total len(train_data) // bptt is the real
  number of batches);
- a small model: --emsize 64 --nhid 64 (published: 200, 200), 2 layers, dropout 0.2; 6 epochs (published: 40);
  --log-interval 5 (published: 200): 8 printed losses an epoch, 48 in all;
- CPU only with torch.set_num_threads(1); the Transformer, --use-optimizer, --dry-run, --accel and ONNX export
  branches left out; the best model saved to the temporary directory (published: model.pt) and loaded back with
  torch.load(f, weights_only=False), which PyTorch >= 2.6 needs for a whole pickled model;
- the perplexities printed as inf where math.exp(loss) overflows (loss > 709.78): the published script stops
  there with OverflowError, which the diverge run reaches at its first print after the injection;
- train() records, beside each print, what it printed (the truth sidecar), and acts on CORPUS_INJECT, before the
  batch whose global index (epoch - 1) * 41 + batch (0-based) is STEP: `nan:STEP` fills the encoder's weight
  with NaN (under torch.no_grad()), so that batch's loss and every later one is NaN; `diverge:STEP` multiplies
  lr by 1000 (the annealing lr /= 4 still applies after that).

Made with PyTorch 2.14.1 (CPU), Python 3.11.7:

    /root/torchvenv/bin/python tests/data/real/torch_word_language_model.py \\
        > tests/data/real/torch_word_language_model.log 2>&1
    CORPUS_INJECT=nan:184 /root/torchvenv/bin/python tests/data/real/torch_word_language_model.py \\
        > tests/data/real/torch_word_language_model.nan.log 2>&1
    CORPUS_INJECT=diverge:184 /root/torchvenv/bin/python tests/data/real/torch_word_language_model.py \\
        > tests/data/real/torch_word_language_model.diverge.log 2>&1

Each run writes its sidecar, torch_word_language_model[.nan|.diverge].truth.json, beside this file: per printed
training line, the epoch, "step" the batch as printed, "global" (epoch - 1) * 41 + batch, and "loss" the
cur_loss that line prints with {:5.2f}: total_loss / log_interval, the mean of the interval's batch losses (the
first interval of an epoch sums batches 0..5, six losses, and divides by 5, as published).
"""

import argparse
import json
import math
import os
import random
import tempfile
import time

import torch
import torch.nn as nn
import torch.nn.functional as F

HERE = os.path.dirname(os.path.abspath(__file__))
INJECT = os.environ.get("CORPUS_INJECT")  # "nan:STEP", "diverge:STEP" or unset
INJECT_KIND, INJECT_STEP = (INJECT.split(":")[0], int(INJECT.split(":")[1])) if INJECT else (None, None)
truth = []

###############################################################################
# data.py, as published
###############################################################################


class Dictionary(object):
    def __init__(self):
        self.word2idx = {}
        self.idx2word = []

    def add_word(self, word):
        if word not in self.word2idx:
            self.idx2word.append(word)
            self.word2idx[word] = len(self.idx2word) - 1
        return self.word2idx[word]

    def __len__(self):
        return len(self.idx2word)


class Corpus(object):
    def __init__(self, path):
        self.dictionary = Dictionary()
        self.train = self.tokenize(os.path.join(path, 'train.txt'))
        self.valid = self.tokenize(os.path.join(path, 'valid.txt'))
        self.test = self.tokenize(os.path.join(path, 'test.txt'))

    def tokenize(self, path):
        """Tokenizes a text file."""
        assert os.path.exists(path)
        # Add words to the dictionary
        with open(path, 'r', encoding="utf8") as f:
            for line in f:
                words = line.split() + ['<eos>']
                for word in words:
                    self.dictionary.add_word(word)

        # Tokenize file content
        with open(path, 'r', encoding="utf8") as f:
            idss = []
            for line in f:
                words = line.split() + ['<eos>']
                ids = []
                for word in words:
                    ids.append(self.dictionary.word2idx[word])
                idss.append(torch.tensor(ids).type(torch.int64))
            ids = torch.cat(idss)

        return ids

###############################################################################
# model.py's RNNModel, as published
###############################################################################


class RNNModel(nn.Module):
    """Container module with an encoder, a recurrent module, and a decoder."""

    def __init__(self, rnn_type, ntoken, ninp, nhid, nlayers, dropout=0.5, tie_weights=False):
        super(RNNModel, self).__init__()
        self.ntoken = ntoken
        self.drop = nn.Dropout(dropout)
        self.encoder = nn.Embedding(ntoken, ninp)
        if rnn_type in ['LSTM', 'GRU']:
            self.rnn = getattr(nn, rnn_type)(ninp, nhid, nlayers, dropout=dropout)
        else:
            try:
                nonlinearity = {'RNN_TANH': 'tanh', 'RNN_RELU': 'relu'}[rnn_type]
            except KeyError as e:
                raise ValueError("""An invalid option for `--model` was supplied,
                                 options are ['LSTM', 'GRU', 'RNN_TANH' or 'RNN_RELU']""") from e
            self.rnn = nn.RNN(ninp, nhid, nlayers, nonlinearity=nonlinearity, dropout=dropout)
        self.decoder = nn.Linear(nhid, ntoken)

        if tie_weights:
            if nhid != ninp:
                raise ValueError('When using the tied flag, nhid must be equal to emsize')
            self.decoder.weight = self.encoder.weight

        self.init_weights()

        self.rnn_type = rnn_type
        self.nhid = nhid
        self.nlayers = nlayers

    def init_weights(self):
        initrange = 0.1
        nn.init.uniform_(self.encoder.weight, -initrange, initrange)
        nn.init.zeros_(self.decoder.bias)
        nn.init.uniform_(self.decoder.weight, -initrange, initrange)

    def forward(self, input, hidden):
        emb = self.drop(self.encoder(input))
        output, hidden = self.rnn(emb, hidden)
        output = self.drop(output)
        decoded = self.decoder(output)
        decoded = decoded.view(-1, self.ntoken)
        return F.log_softmax(decoded, dim=1), hidden

    def init_hidden(self, bsz):
        weight = next(self.parameters())
        if self.rnn_type == 'LSTM':
            return (weight.new_zeros(self.nlayers, bsz, self.nhid),
                    weight.new_zeros(self.nlayers, bsz, self.nhid))
        else:
            return weight.new_zeros(self.nlayers, bsz, self.nhid)

###############################################################################
# The synthetic corpus (not in the published script, which reads wikitext-2)
###############################################################################


def write_synthetic_corpus(path, ntrain=28720, nvalid=3000, ntest=3000):
    """Lines of 4 to 12 words from a 24-word vocabulary, each word followed by one of 3 likely successors; each
    file holds exactly n tokens, counting the <eos> the Corpus adds at each line end."""
    rng = random.Random(0)
    vocab = ['w%02d' % k for k in range(24)]
    successors = {w: rng.sample(vocab, 3) for w in vocab}
    for name, n in (('train.txt', ntrain), ('valid.txt', nvalid), ('test.txt', ntest)):
        lines, left = [], n
        while left > 0:
            length = min(rng.randint(4, 12), left - 1)  # words, then <eos>
            word = rng.choice(vocab)
            words = []
            for _ in range(length):
                words.append(word)
                word = rng.choice(successors[word]) if rng.random() < 0.9 else rng.choice(vocab)
            lines.append(' '.join(words))
            left -= length + 1
        with open(os.path.join(path, name), 'w', encoding='utf8') as f:
            f.write('\n'.join(lines) + '\n')

###############################################################################
# main.py
###############################################################################


parser = argparse.ArgumentParser(description='PyTorch Wikitext-2 RNN/LSTM/GRU Language Model')
parser.add_argument('--model', type=str, default='LSTM',
                    help='type of network (RNN_TANH, RNN_RELU, LSTM, GRU)')
parser.add_argument('--emsize', type=int, default=64,
                    help='size of word embeddings (published default: 200)')
parser.add_argument('--nhid', type=int, default=64,
                    help='number of hidden units per layer (published default: 200)')
parser.add_argument('--nlayers', type=int, default=2,
                    help='number of layers')
parser.add_argument('--lr', type=float, default=20,
                    help='initial learning rate')
parser.add_argument('--clip', type=float, default=0.25,
                    help='gradient clipping')
parser.add_argument('--epochs', type=int, default=6,
                    help='upper epoch limit (published default: 40)')
parser.add_argument('--batch_size', type=int, default=20, metavar='N',
                    help='batch size')
parser.add_argument('--bptt', type=int, default=35,
                    help='sequence length')
parser.add_argument('--dropout', type=float, default=0.2,
                    help='dropout applied to layers (0 = no dropout)')
parser.add_argument('--tied', action='store_true',
                    help='tie the word embedding and softmax weights')
parser.add_argument('--seed', type=int, default=1111,
                    help='random seed')
parser.add_argument('--log-interval', type=int, default=5, metavar='N',
                    help='report interval (published default: 200)')
args = parser.parse_args()

torch.set_num_threads(1)
# Set the random seed manually for reproducibility.
torch.manual_seed(args.seed)
device = torch.device("cpu")

###############################################################################
# Load data
###############################################################################

tmpdir = tempfile.TemporaryDirectory()
write_synthetic_corpus(tmpdir.name)
corpus = Corpus(tmpdir.name)
args.save = os.path.join(tmpdir.name, 'model.pt')

# Starting from sequential data, batchify arranges the dataset into columns.


def batchify(data, bsz):
    # Work out how cleanly we can divide the dataset into bsz parts.
    nbatch = data.size(0) // bsz
    # Trim off any extra elements that wouldn't cleanly fit (remainders).
    data = data.narrow(0, 0, nbatch * bsz)
    # Evenly divide the data across the bsz batches.
    data = data.view(bsz, -1).t().contiguous()
    return data.to(device)


eval_batch_size = 10
train_data = batchify(corpus.train, args.batch_size)
val_data = batchify(corpus.valid, eval_batch_size)
test_data = batchify(corpus.test, eval_batch_size)

###############################################################################
# Build the model
###############################################################################

ntokens = len(corpus.dictionary)
model = RNNModel(args.model, ntokens, args.emsize, args.nhid, args.nlayers, args.dropout, args.tied).to(device)

criterion = nn.NLLLoss()

###############################################################################
# Training code
###############################################################################


def repackage_hidden(h):
    """Wraps hidden states in new Tensors, to detach them from their history."""

    if isinstance(h, torch.Tensor):
        return h.detach()
    else:
        return tuple(repackage_hidden(v) for v in h)


def get_batch(source, i):
    seq_len = min(args.bptt, len(source) - 1 - i)
    data = source[i:i+seq_len]
    target = source[i+1:i+1+seq_len].view(-1)
    return data, target


def evaluate(data_source):
    # Turn on evaluation mode which disables dropout.
    model.eval()
    total_loss = 0.
    ntokens = len(corpus.dictionary)
    hidden = model.init_hidden(eval_batch_size)
    with torch.no_grad():
        for i in range(0, data_source.size(0) - 1, args.bptt):
            data, targets = get_batch(data_source, i)
            output, hidden = model(data, hidden)
            hidden = repackage_hidden(hidden)
            output_flat = output.view(-1, ntokens)
            total_loss += len(data) * criterion(output_flat, targets).item()
    return total_loss / (len(data_source) - 1)


def inject(global_batch):
    """CORPUS_INJECT (not in the published script): acts once, before the batch numbered STEP."""
    global lr
    if INJECT_KIND is None or global_batch != INJECT_STEP:
        return
    if INJECT_KIND == "nan":
        with torch.no_grad():
            model.encoder.weight.fill_(float("nan"))
    elif INJECT_KIND == "diverge":
        lr *= 1000


def train():
    # Turn on training mode which enables dropout.
    model.train()
    total_loss = 0.
    start_time = time.time()
    ntokens = len(corpus.dictionary)
    hidden = model.init_hidden(args.batch_size)
    for batch, i in enumerate(range(0, train_data.size(0) - 1, args.bptt)):
        inject((epoch - 1) * (len(train_data) // args.bptt) + batch)
        data, targets = get_batch(train_data, i)
        # Starting each batch, we detach the hidden state from how it was previously produced.
        # If we didn't, the model would try backpropagating all the way to start of the dataset.
        model.zero_grad()
        hidden = repackage_hidden(hidden)
        output, hidden = model(data, hidden)
        loss = criterion(output, targets)
        loss.backward()

        # `clip_grad_norm` helps prevent the exploding gradient problem in RNNs / LSTMs.
        torch.nn.utils.clip_grad_norm_(model.parameters(), args.clip)
        for p in model.parameters():
            p.data.add_(p.grad, alpha=-lr)

        total_loss += loss.item()

        if batch % args.log_interval == 0 and batch > 0:
            cur_loss = total_loss / args.log_interval
            elapsed = time.time() - start_time
            print('| epoch {:3d} | {:5d}/{:5d} batches | lr {:02.2f} | ms/batch {:5.2f} | '
                  'loss {:5.2f} | ppl {:8.2f}'.format(
                      epoch, batch, len(train_data) // args.bptt, lr,
                      elapsed * 1000 / args.log_interval, cur_loss, exp(cur_loss)))
            truth.append({"epoch": epoch, "step": batch,
                          "global": (epoch - 1) * (len(train_data) // args.bptt) + batch, "loss": cur_loss})
            total_loss = 0
            start_time = time.time()


def exp(loss):
    """math.exp, or inf where math.exp raises OverflowError (loss > 709.78): not in the published script, which
    stops there with a traceback, at the first print after the diverge injection."""
    try:
        return math.exp(loss)
    except OverflowError:
        return float('inf')


def write_truth():
    run = "torch_word_language_model" + ("." + INJECT_KIND if INJECT_KIND else "")
    with open(os.path.join(HERE, run + ".truth.json"), "w") as f:
        json.dump({"script": "torch_word_language_model.py", "source": "pytorch/examples word_language_model/main.py",
                   "framework": "PyTorch " + torch.__version__.split("+")[0],
                   "inject": {"kind": INJECT_KIND, "step": INJECT_STEP} if INJECT_KIND else None,
                   "tolerance": 5e-03, "printed": truth}, f, indent=1)


# Loop over epochs.
lr = args.lr
best_val_loss = None

# At any point you can hit Ctrl + C to break out of training early.
try:
    for epoch in range(1, args.epochs+1):
        epoch_start_time = time.time()
        train()
        val_loss = evaluate(val_data)
        print('-' * 89)
        print('| end of epoch {:3d} | time: {:5.2f}s | valid loss {:5.2f} | '
              'valid ppl {:8.2f}'.format(epoch, (time.time() - epoch_start_time),
                                         val_loss, exp(val_loss)))
        print('-' * 89)
        # Save the model if the validation loss is the best we've seen so far.
        if not best_val_loss or val_loss < best_val_loss:
            with open(args.save, 'wb') as f:
                torch.save(model, f)
            best_val_loss = val_loss
        else:
            # Anneal the learning rate if no improvement has been seen in the validation dataset.
            lr /= 4.0
except KeyboardInterrupt:
    print('-' * 89)
    print('Exiting from training early')
finally:
    write_truth()  # not in the published script: the sidecar, even if the script stops with an error

# Load the best saved model.
with open(args.save, 'rb') as f:
    model = torch.load(f, weights_only=False)
    # after load the rnn params are not a continuous chunk of memory
    # this makes them a continuous chunk, and will speed up forward pass
    # Currently, only rnn model supports flatten_parameters function.
    if args.model in ['RNN_TANH', 'RNN_RELU', 'LSTM', 'GRU']:
        model.rnn.flatten_parameters()

# Run on test data.
test_loss = evaluate(test_data)
print('=' * 89)
print('| End of training | test loss {:5.2f} | test ppl {:8.2f}'.format(
    test_loss, exp(test_loss)))
print('=' * 89)
