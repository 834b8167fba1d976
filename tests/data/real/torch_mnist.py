"""How torch_mnist.log, torch_mnist.nan.log and torch_mnist.diverge.log were made: pytorch/examples mnist/main.py
(the current script: Net with two convolutions, Adadelta lr=1.0, StepLR gamma=0.7, a print every --log-interval
batches, a test after each epoch; no shuffling on CPU, as published), its Net, train() and test() copied as
published (the stored copy read was pytorch/examples' 2018 SGD version and a later fork with today's Net,
Adadelta and StepLR; the code below follows the latter, which is upstream's current one) except:
- synthetic MNIST-shaped data instead of torchvision's MNIST download: 1920 training and 1000 test images of
  1x28x28, values normalised as the script's transforms.Normalize((0.1307,), (0.3081,)) would, in a
  TensorDataset, with a learnable label (the class sets a slightly brighter 4x4 patch; 10% of labels redrawn);
- 3 epochs (published default: 14) of 30 batches of 64, --log-interval 2 (published: 10), so that there are 45
  printed losses, and an epoch's last printed batch is near its end;
- CPU only with torch.set_num_threads(1) (no --no-accel/--dry-run/--save-model handling);
- train() records, beside each print, what it printed (the truth sidecar), and acts on CORPUS_INJECT:
  `nan:STEP` fills conv1's weight with NaN (under torch.no_grad()) before the batch whose global index
  (epoch - 1) * 30 + batch_idx, 0-based, is STEP, so that batch's loss and every later one is NaN;
  `diverge:STEP` multiplies every param_group's lr by 1000 before that batch (StepLR keeps scaling it by 0.7 an
  epoch after that).

Made with PyTorch 2.14.1 (CPU), Python 3.11.7:

    /root/torchvenv/bin/python tests/data/real/torch_mnist.py > tests/data/real/torch_mnist.log 2>&1
    CORPUS_INJECT=nan:64 /root/torchvenv/bin/python tests/data/real/torch_mnist.py \\
        > tests/data/real/torch_mnist.nan.log 2>&1
    CORPUS_INJECT=diverge:64 /root/torchvenv/bin/python tests/data/real/torch_mnist.py \\
        > tests/data/real/torch_mnist.diverge.log 2>&1

Each run writes its sidecar, torch_mnist[.nan|.diverge].truth.json, beside this file: per printed training line,
the epoch as printed, "step" the N of [N/M] (samples: batch_idx * len(data)), "global" (epoch - 1) * M + N
(samples; M = len(dataset) = 1920) and "loss" the loss.item() that line prints with %.6f. As "global" counts
samples and STEP batches, an injected run's "inject" also gives "print": the index in "printed" of the first line
at a global batch from STEP on (there, at batch STEP, the diverge run's loss is still the healthy one: the loss
is computed before the optimizer step that first uses the multiplied lr).
"""

import argparse
import json
import os

import torch
import torch.nn as nn
import torch.nn.functional as F
import torch.optim as optim
from torch.optim.lr_scheduler import StepLR

HERE = os.path.dirname(os.path.abspath(__file__))
INJECT = os.environ.get("CORPUS_INJECT")  # "nan:STEP", "diverge:STEP" or unset
INJECT_KIND, INJECT_STEP = (INJECT.split(":")[0], int(INJECT.split(":")[1])) if INJECT else (None, None)
truth = []


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv1 = nn.Conv2d(1, 32, 3, 1)
        self.conv2 = nn.Conv2d(32, 64, 3, 1)
        self.dropout1 = nn.Dropout(0.25)
        self.dropout2 = nn.Dropout(0.5)
        self.fc1 = nn.Linear(9216, 128)
        self.fc2 = nn.Linear(128, 10)

    def forward(self, x):
        x = self.conv1(x)
        x = F.relu(x)
        x = self.conv2(x)
        x = F.relu(x)
        x = F.max_pool2d(x, 2)
        x = self.dropout1(x)
        x = torch.flatten(x, 1)
        x = self.fc1(x)
        x = F.relu(x)
        x = self.dropout2(x)
        x = self.fc2(x)
        output = F.log_softmax(x, dim=1)
        return output


def inject(model, optimizer, global_batch):
    """CORPUS_INJECT (not in the published script): acts once, before the batch numbered STEP."""
    if INJECT_KIND is None or global_batch != INJECT_STEP:
        return
    if INJECT_KIND == "nan":
        with torch.no_grad():
            model.conv1.weight.fill_(float("nan"))
    elif INJECT_KIND == "diverge":
        for group in optimizer.param_groups:
            group["lr"] *= 1000


def train(args, model, device, train_loader, optimizer, epoch):
    model.train()
    for batch_idx, (data, target) in enumerate(train_loader):
        inject(model, optimizer, (epoch - 1) * len(train_loader) + batch_idx)
        data, target = data.to(device), target.to(device)
        optimizer.zero_grad()
        output = model(data)
        loss = F.nll_loss(output, target)
        loss.backward()
        optimizer.step()
        if batch_idx % args.log_interval == 0:
            print(f'Train Epoch: {epoch} [{batch_idx * len(data)}/{len(train_loader.dataset)} ({100. * batch_idx / len(train_loader):.0f}%)]\tLoss: {loss.item():.6f}')
            n = batch_idx * len(data)
            truth.append({"epoch": epoch, "step": n, "global": (epoch - 1) * len(train_loader.dataset) + n,
                          "loss": loss.item()})
            if args.dry_run:
                break


def test(model, device, test_loader):
    model.eval()
    test_loss = 0
    correct = 0
    with torch.no_grad():
        for data, target in test_loader:
            data, target = data.to(device), target.to(device)
            output = model(data)
            test_loss += F.nll_loss(output, target, reduction='sum').item()  # sum up batch loss
            pred = output.argmax(dim=1, keepdim=True)  # get the index of the max log-probability
            correct += pred.eq(target.view_as(pred)).sum().item()

    test_loss /= len(test_loader.dataset)

    print(f'\nTest set: Average loss: {test_loss:.4f}, Accuracy: {correct}/{len(test_loader.dataset)} ({100. * correct / len(test_loader.dataset):.0f}%)\n')


def synthetic_mnist(n, generator):
    """MNIST-shaped images (not in the published script, which downloads MNIST): uniform noise, and a slightly
    brighter 4x4 patch whose place is set by the label, with a tenth of the labels then redrawn at random; normalised as transforms.Normalize((0.1307,), (0.3081,))."""
    target = torch.randint(0, 10, (n,), generator=generator)
    images = torch.rand(n, 1, 28, 28, generator=generator)
    for k in range(10):
        row, col = 2 + 6 * (k // 4), 2 + 6 * (k % 4)
        images[target == k, :, row:row + 4, col:col + 4] += 0.5
    noisy = torch.rand(n, generator=generator) < 0.1  # a tenth of the labels drawn at random
    target[noisy] = torch.randint(0, 10, (int(noisy.sum()),), generator=generator)
    return torch.utils.data.TensorDataset((images - 0.1307) / 0.3081, target)


def main():
    # Training settings
    parser = argparse.ArgumentParser(description='PyTorch MNIST Example')
    parser.add_argument('--batch-size', type=int, default=64, metavar='N',
                        help='input batch size for training (default: 64)')
    parser.add_argument('--test-batch-size', type=int, default=1000, metavar='N',
                        help='input batch size for testing (default: 1000)')
    parser.add_argument('--epochs', type=int, default=3, metavar='N',
                        help='number of epochs to train (default: 3; published: 14)')
    parser.add_argument('--lr', type=float, default=1.0, metavar='LR',
                        help='learning rate (default: 1.0)')
    parser.add_argument('--gamma', type=float, default=0.7, metavar='M',
                        help='Learning rate step gamma (default: 0.7)')
    parser.add_argument('--dry-run', action='store_true',
                        help='quickly check a single pass')
    parser.add_argument('--seed', type=int, default=1, metavar='S',
                        help='random seed (default: 1)')
    parser.add_argument('--log-interval', type=int, default=2, metavar='N',
                        help='how many batches to wait before logging training status (published: 10)')
    args = parser.parse_args()

    torch.set_num_threads(1)
    torch.manual_seed(args.seed)
    device = torch.device("cpu")

    train_kwargs = {'batch_size': args.batch_size}
    test_kwargs = {'batch_size': args.test_batch_size}

    data_generator = torch.Generator().manual_seed(1234)
    dataset1 = synthetic_mnist(1920, data_generator)
    dataset2 = synthetic_mnist(1000, data_generator)
    train_loader = torch.utils.data.DataLoader(dataset1, **train_kwargs)
    test_loader = torch.utils.data.DataLoader(dataset2, **test_kwargs)

    model = Net().to(device)
    optimizer = optim.Adadelta(model.parameters(), lr=args.lr)

    scheduler = StepLR(optimizer, step_size=1, gamma=args.gamma)
    for epoch in range(1, args.epochs + 1):
        train(args, model, device, train_loader, optimizer, epoch)
        test(model, device, test_loader)
        scheduler.step()

    # The index in "printed" of the first line at a global batch from STEP on: the lines' "global" counts samples,
    # STEP batches, so the sidecar says which print that is.
    first_after = None
    if INJECT_KIND:
        first_after = next(k for k, row in enumerate(truth) if row["global"] >= INJECT_STEP * args.batch_size)
    run = "torch_mnist" + ("." + INJECT_KIND if INJECT_KIND else "")
    with open(os.path.join(HERE, run + ".truth.json"), "w") as f:
        json.dump({"script": "torch_mnist.py", "source": "pytorch/examples mnist/main.py",
                   "framework": "PyTorch " + torch.__version__.split("+")[0],
                   "inject": {"kind": INJECT_KIND, "step": INJECT_STEP, "print": first_after} if INJECT_KIND else None,
                   "tolerance": 5e-07, "printed": truth}, f, indent=1)


if __name__ == '__main__':
    main()
