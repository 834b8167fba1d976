"""How ignite_mnist.log was made: PyTorch-Ignite's MNIST example (pytorch/ignite examples/mnist/mnist.py: Net,
create_supervised_trainer and _evaluator, a tqdm bar whose desc shows the loss, `Training Results - Epoch: ...`
and `Validation Results - Epoch: ...` written with tqdm.write, then `EPOCH_COMPLETED took ... seconds`), run as
published except:
- synthetic MNIST-shaped data (the example downloads MNIST with torchvision, not installed here): 1x28x28 images
  of uniform noise with a bright 7x7 square whose place the label (0-9) says, normalised as the example does;
  6400 training images (100 batches of 64, as the example's default batch size) and 1000 for validation (one
  batch of 1000, its default);
- log_interval 5 (default 10), so that the bar is updated 20 times an epoch;
  torch.set_num_threads(1);
- the truth sidecar (RUN.truth.json): the bar's desc shows `ITERATION - loss: {output:.2f}` and tqdm draws it
  at most every 0.1 s, after each tqdm.write and on pbar.refresh(), so the script wraps the bar's display() to
  note, for each draw, the count and the loss its desc holds: each global step the log shows, once. `epoch` is
  null (the bar prints none), `step` the bar's count, `global` the iteration (the engine's epoch times 100 and
  the count).

    cd tests/data/real
    PYTHONUNBUFFERED=1 /tmp/venv-torch/bin/python ignite_mnist.py > ignite_mnist.log 2>&1

PYTHONUNBUFFERED=1 as tfrun sets it for a job (runner/scheduler.py): tqdm.write prints to stdout, the bar and
ignite's logger to stderr. Made with Python 3.11, PyTorch 2.14.1 (CPU), pytorch-ignite 0.5.5, tqdm 4.70.1.
"""

import json
import os

import torch
import torch.nn.functional as F
from torch import nn
from torch.optim import SGD
from torch.utils.data import DataLoader, TensorDataset
from tqdm import tqdm

import ignite
from ignite.engine import Events, create_supervised_evaluator, create_supervised_trainer
from ignite.metrics import Accuracy, Loss
from ignite.utils import setup_logger

torch.set_num_threads(1)
torch.manual_seed(0)
HERE = os.path.dirname(os.path.abspath(__file__))
RUN = "ignite_mnist"
shown = {}  # global step -> (epoch, count, loss) of the bar's draws, in the order first drawn


class Net(nn.Module):
    def __init__(self):
        super(Net, self).__init__()
        self.conv1 = nn.Conv2d(1, 10, kernel_size=5)
        self.conv2 = nn.Conv2d(10, 20, kernel_size=5)
        self.conv2_drop = nn.Dropout2d()
        self.fc1 = nn.Linear(320, 50)
        self.fc2 = nn.Linear(50, 10)

    def forward(self, x):
        x = F.relu(F.max_pool2d(self.conv1(x), 2))
        x = F.relu(F.max_pool2d(self.conv2_drop(self.conv2(x)), 2))
        x = x.view(-1, 320)
        x = F.relu(self.fc1(x))
        x = F.dropout(x, training=self.training)
        x = self.fc2(x)
        return F.log_softmax(x, dim=-1)


def synthetic_mnist(count):
    """MNIST-shaped: noise, and a bright square at one of 10 places, the label."""
    labels = torch.randint(0, 10, (count,))
    images = torch.rand(count, 1, 28, 28) * 0.8
    for i, label in enumerate(labels.tolist()):
        row, col = 3 + 9 * (label // 4), 3 + 7 * (label % 4)
        images[i, 0, row : row + 7, col : col + 7] += 0.15
    return (images.clamp(0, 1) - 0.1307) / 0.3081, labels


def get_data_loaders(train_batch_size, val_batch_size):
    train_loader = DataLoader(TensorDataset(*synthetic_mnist(6400)), batch_size=train_batch_size, shuffle=True)
    val_loader = DataLoader(TensorDataset(*synthetic_mnist(1000)), batch_size=val_batch_size, shuffle=False)
    return train_loader, val_loader


def noting(bar, trainer, loss_of):
    """The bar, its every draw noted in `shown` (the count it draws and the loss its desc holds)."""
    draw = bar.display

    def display(msg=None, pos=None):
        if msg is None and bar.n:  # a draw, not a clear; a bar at 0 shows no iteration of its epoch
            epoch = trainer.state.epoch
            shown[(epoch - 1) * bar.total + bar.n] = (epoch, bar.n, loss_of())
        return draw(msg, pos)

    bar.display = display
    return bar


def run(train_batch_size, val_batch_size, epochs, lr, momentum, log_interval):
    train_loader, val_loader = get_data_loaders(train_batch_size, val_batch_size)
    model = Net()
    device = "cpu"

    if torch.cuda.is_available():
        device = "cuda"

    model.to(device)  # Move model before creating optimizer
    optimizer = SGD(model.parameters(), lr=lr, momentum=momentum)
    criterion = nn.NLLLoss()
    trainer = create_supervised_trainer(model, optimizer, criterion, device=device)
    trainer.logger = setup_logger("trainer")

    val_metrics = {"accuracy": Accuracy(), "nll": Loss(criterion)}
    evaluator = create_supervised_evaluator(model, metrics=val_metrics, device=device)
    evaluator.logger = setup_logger("evaluator")

    last = {"loss": None}
    pbar = tqdm(initial=0, leave=False, total=len(train_loader), desc=f"ITERATION - loss: {0:.2f}")
    pbar = noting(pbar, trainer, lambda: last["loss"])

    @trainer.on(Events.ITERATION_COMPLETED(every=log_interval))
    def log_training_loss(engine):
        last["loss"] = engine.state.output
        pbar.desc = f"ITERATION - loss: {engine.state.output:.2f}"
        pbar.update(log_interval)

    @trainer.on(Events.EPOCH_COMPLETED)
    def log_training_results(engine):
        pbar.refresh()
        evaluator.run(train_loader)
        metrics = evaluator.state.metrics
        avg_accuracy = metrics["accuracy"]
        avg_nll = metrics["nll"]
        tqdm.write(
            f"Training Results - Epoch: {engine.state.epoch} Avg accuracy: {avg_accuracy:.2f} Avg loss: {avg_nll:.2f}"
        )

    @trainer.on(Events.EPOCH_COMPLETED)
    def log_validation_results(engine):
        evaluator.run(val_loader)
        metrics = evaluator.state.metrics
        avg_accuracy = metrics["accuracy"]
        avg_nll = metrics["nll"]
        tqdm.write(
            f"Validation Results - Epoch: {engine.state.epoch} Avg accuracy: {avg_accuracy:.2f} Avg loss: {avg_nll:.2f}"
        )

        pbar.n = pbar.last_print_n = 0

    @trainer.on(Events.EPOCH_COMPLETED | Events.COMPLETED)
    def log_time(engine):
        tqdm.write(f"{trainer.last_event_name.name} took {trainer.state.times[trainer.last_event_name.name]} seconds")

    trainer.run(train_loader, max_epochs=epochs)
    pbar.close()


run(64, 1000, 10, 0.01, 0.5, 5)

printed = [{"epoch": None, "step": n, "global": g, "loss": v} for g, (e, n, v) in shown.items()]
with open(os.path.join(HERE, RUN + ".truth.json"), "w") as f:
    json.dump({"script": "ignite_mnist.py", "source": "pytorch/ignite examples/mnist/mnist.py",
               "framework": f"pytorch-ignite {ignite.__version__}, PyTorch {torch.__version__.split('+')[0]}",
               "inject": None, "tolerance": 0.005, "printed": printed}, f, indent=1)
    f.write("\n")
