"""Flax's MNIST example (google/flax, examples/mnist/train.py and main.py, the NNX version, at commit
18f8f311c275d57f46d95e41b15aa97b454754c0): `train_and_evaluate` as published, run through main.py's absl
`app.run` and flags, so that its epoch line reaches the log as absl's logging writes it (to stderr, with
absl's `I0702 12:00:00.123456 140... flax_mnist.py:NNN] ` prefix):
`epoch:% 3d, train_loss: %.4f, train_accuracy: %.2f, test_loss: %.4f, test_accuracy: %.2f`.
main.py's own two `JAX process` / `JAX local devices` info lines are kept too.

Changes:
- train.py and main.py in one file (main.py imports train.py); configs/default.py's `get_config` inline, given
  to the `config` flag by `config_flags.DEFINE_config_dict` (main.py: `DEFINE_config_file`, the file given on
  the command line), with num_epochs 45 (published: 10); learning rate, momentum, batch size (128) as published;
- synthetic MNIST-shaped data in NumPy (the example loads MNIST with tensorflow_datasets, which downloads it):
  512 training images and 256 test images, 28x28x1 in [0, 1], uniform noise with the label's (0-9) two rows
  0.2 brighter, then 20 % of the labels drawn anew (so the loss is not 0.0000 once the set is learnt); batched as published (128, drop_remainder; the training set shuffled again each epoch, as
  tf.data's shuffle does), so an epoch is 4 training steps and 2 test batches;
- no TensorFlow: `tf.random.set_seed`, main.py's hiding of GPUs from TensorFlow, the TensorBoard
  SummaryWriter (flax.metrics.tensorboard writes with TensorFlow) and the orbax SavedModel export at the end are
  left out, and with them the `workdir` flag; clu's `platform.work_unit()` notes (a no-op outside Google's
  cluster) are left out too;
- JAX on 1 thread (XLA_FLAGS);
- CORPUS_INJECT=nan:STEP (STEP: training batches since the start, 0-based): before the training step of global
  step STEP, the kernel of the last Linear (the logits) is set to NaN, so the loss, the gradients and then every
  parameter are NaN; with STEP = 120 that is the first step of epoch 31 (4 steps an epoch), whose train_loss,
  the mean over the epoch's steps, is the first NaN one;
- the truth sidecar written beside the log (RUN.truth.json, RUN from the CORPUS_RUN variable): `printed` from
  the `train_metrics` dict the loop logs (nnx.MultiMetric's `compute()`), `evaluations` from `eval_metrics`.

    cd tests/data/real
    CORPUS_RUN=flax_mnist PYTHONUNBUFFERED=1 OMP_NUM_THREADS=1 /tmp/cv-mixed/bin/python flax_mnist.py \\
        > flax_mnist.log 2>&1
    CORPUS_RUN=flax_mnist.nan CORPUS_INJECT=nan:120 PYTHONUNBUFFERED=1 OMP_NUM_THREADS=1 \\
        /tmp/cv-mixed/bin/python flax_mnist.py > flax_mnist.nan.log 2>&1

(/tmp/cv-mixed: torch 2.13.0 (CPU), jax/jaxlib 0.10.2, flax 0.12.8, optax 0.2.8, absl-py 2.5.1,
ml_collections 1.1.0.)

The line prints only an epoch: every `printed` row has that epoch (1-based, as printed), `step` and `global`
null. The line's training loss is `train_loss`; `test_loss` and `test_accuracy` are evaluations (on the test
set), listed in `evaluations` with the value the line prints (test_accuracy is accuracy * 100, printed %.2f:
its rows carry their own `tolerance`, 0.005; the losses, %.4f, the file's 5e-05); `train_accuracy` is neither.
"""

import json
import os

os.environ.setdefault("XLA_FLAGS", "--xla_cpu_multi_thread_eigen=false intra_op_parallelism_threads=1")

# pytype: disable=wrong-keyword-args
from functools import partial

import numpy as np
from absl import app
from absl import flags
from absl import logging
from flax import nnx
import jax
import jax.numpy as jnp
import ml_collections
from ml_collections import config_flags
import optax

HERE = os.path.dirname(os.path.abspath(__file__))
RUN = os.environ.get("CORPUS_RUN", "flax_mnist")
INJECT = os.environ.get("CORPUS_INJECT")
KIND, INJECT_STEP = (INJECT.split(":")[0], int(INJECT.split(":")[1])) if INJECT else (None, None)
printed = []
evaluations = []
first_after = None  # the index in `printed` of the first loss printed from the injection's step on


# ---- configs/default.py ----------------------------------------------------------------------------------------
def get_config():
  """Get the default hyperparameter configuration."""
  config = ml_collections.ConfigDict()

  config.learning_rate = 0.1
  config.momentum = 0.9
  config.batch_size = 128
  config.num_epochs = 45  # published: 10
  return config


# ---- train.py --------------------------------------------------------------------------------------------------
class CNN(nnx.Module):
  """A simple CNN model."""

  def __init__(self, rngs: nnx.Rngs):
    self.conv1 = nnx.Conv(1, 32, kernel_size=(3, 3), rngs=rngs)
    self.batch_norm1 = nnx.BatchNorm(32, rngs=rngs)
    self.dropout1 = nnx.Dropout(rate=0.025)
    self.conv2 = nnx.Conv(32, 64, kernel_size=(3, 3), rngs=rngs)
    self.batch_norm2 = nnx.BatchNorm(64, rngs=rngs)
    self.avg_pool = partial(nnx.avg_pool, window_shape=(2, 2), strides=(2, 2))
    self.linear1 = nnx.Linear(3136, 256, rngs=rngs)
    self.dropout2 = nnx.Dropout(rate=0.025)
    self.linear2 = nnx.Linear(256, 10, rngs=rngs)

  def __call__(self, x, rngs: nnx.Rngs):
    x = self.avg_pool(nnx.relu(self.batch_norm1(self.dropout1(self.conv1(x), rngs=rngs))))
    x = self.avg_pool(nnx.relu(self.batch_norm2(self.conv2(x))))
    x = x.reshape(x.shape[0], -1)  # flatten
    x = nnx.relu(self.dropout2(self.linear1(x), rngs=rngs))
    x = self.linear2(x)
    return x



def loss_fn(model: CNN, batch, rngs):
  logits = model(batch['image'], rngs)
  loss = optax.softmax_cross_entropy_with_integer_labels(
    logits=logits, labels=batch['label']
  ).mean()
  return loss, logits


@nnx.jit
def train_step(model: CNN, optimizer: nnx.Optimizer, metrics: nnx.MultiMetric, batch, rngs):
  """Train for a single step."""
  grad_fn = nnx.value_and_grad(loss_fn, has_aux=True)
  (loss, logits), grads = grad_fn(model, batch, rngs)
  metrics.update(loss=loss, logits=logits, labels=batch['label'])  # In-place updates.
  optimizer.update(model, grads)  # In-place updates.




@nnx.jit
def eval_step(model: CNN, metrics: nnx.MultiMetric, batch):
  loss, logits = loss_fn(model, batch, None)
  metrics.update(loss=loss, logits=logits, labels=batch['label'])  # In-place updates.


class _Batches:
  """Synthetic stand-in for the batched tf.data.Dataset: `as_numpy_iterator()` yields dicts of NumPy arrays,
  `batch_size` at a time, the incomplete last batch dropped; shuffled again at each iteration if asked."""

  def __init__(self, images, labels, batch_size, shuffle_seed=None):
    self.images, self.labels, self.batch_size = images, labels, batch_size
    self.rng = np.random.default_rng(shuffle_seed) if shuffle_seed is not None else None

  def __len__(self):
    return len(self.labels) // self.batch_size

  def as_numpy_iterator(self):
    order = self.rng.permutation(len(self.labels)) if self.rng is not None else np.arange(len(self.labels))
    for i in range(len(self)):
      idx = order[i * self.batch_size:(i + 1) * self.batch_size]
      yield {'image': self.images[idx], 'label': self.labels[idx]}


def get_datasets(config: ml_collections.ConfigDict):
  """Synthetic MNIST-shaped train and test sets (the example loads MNIST with tfds)."""
  batch_size = config.batch_size
  rng = np.random.default_rng(0)
  n_train, n_test = 512, 256
  labels = rng.integers(0, 10, n_train + n_test).astype(np.int64)
  images = rng.random((n_train + n_test, 28, 28, 1), dtype=np.float32)
  rows = 4 + labels[:, None] * 2 + np.arange(2)  # the label's two rows, 0.2 brighter
  images[np.arange(n_train + n_test)[:, None], rows] += 0.2
  images = np.clip(images, 0, 1)
  flip = rng.random(n_train + n_test) < 0.2  # 20 % of the labels drawn anew (0-9): a loss that stays above 0
  labels[flip] = rng.integers(0, 10, int(flip.sum()))
  train_ds = _Batches(images[:n_train], labels[:n_train], batch_size, shuffle_seed=0)
  test_ds = _Batches(images[n_train:], labels[n_train:], batch_size)
  return train_ds, test_ds


def inject(model: CNN, global_step: int) -> None:
  if KIND == "nan" and global_step == INJECT_STEP:
    kernel = model.linear2.kernel  # the logits layer: NaN logits, a NaN loss
    kernel[...] = jnp.full_like(kernel[...], jnp.nan)


def train_and_evaluate(config: ml_collections.ConfigDict) -> None:
  """Execute model training and evaluation loop.

  Args:
    config: Hyperparameter configuration for training and evaluation.
  """
  global first_after
  train_ds, test_ds = get_datasets(config)

  # Instantiate the model.
  model = CNN(rngs=nnx.Rngs(0))

  learning_rate = config.learning_rate
  momentum = config.momentum

  optimizer = nnx.Optimizer(
      model, optax.sgd(learning_rate, momentum), wrt=nnx.Param
  )
  metrics = nnx.MultiMetric(
      accuracy=nnx.metrics.Accuracy(),
      loss=nnx.metrics.Average('loss'),
  )
  rngs = nnx.Rngs(0)

  global_step = 0
  for epoch in range(1, config.num_epochs + 1):
    # Run the optimization for one step and make a stateful update to the
    # following:
    # - The train state's model parameters
    # - The optimizer state
    # - The training loss and accuracy batch metrics
    model.train()  # Switch to train mode

    epoch_start = global_step
    for batch in train_ds.as_numpy_iterator():
      inject(model, global_step)
      train_step(model, optimizer, metrics, batch, rngs)
      global_step += 1
    #  Compute the training metrics.
    train_metrics = metrics.compute()
    metrics.reset()  # Reset the metrics for the test set.

    # Compute the metrics on the test set after each training epoch.
    model.eval()  # Switch to eval mode
    for batch in test_ds.as_numpy_iterator():
      eval_step(model, metrics, batch)

    # Compute the eval metrics.
    eval_metrics = metrics.compute()
    metrics.reset()  # Reset the metrics for the next training epoch.

    logging.info(  # pylint: disable=logging-not-lazy
        'epoch:% 3d, train_loss: %.4f, train_accuracy: %.2f, test_loss: %.4f,'
        ' test_accuracy: %.2f'
        % (
            epoch,
            train_metrics['loss'],
            train_metrics['accuracy'] * 100,
            eval_metrics['loss'],
            eval_metrics['accuracy'] * 100,
        )
    )
    printed.append({"epoch": epoch, "step": None, "global": None, "loss": float(train_metrics['loss'])})
    evaluations.append({"name": "test_loss", "epoch": epoch, "step": None, "global": None,
                        "value": float(eval_metrics['loss'])})
    evaluations.append({"name": "test_accuracy", "epoch": epoch, "step": None, "global": None,
                        "value": float(eval_metrics['accuracy'] * 100), "tolerance": 0.005})  # printed %.2f
    if INJECT and first_after is None and global_step > INJECT_STEP >= epoch_start:
      first_after = len(printed) - 1

  write_truth(len(train_ds))


def write_truth(steps_per_epoch: int) -> None:
  truth = {
      "script": "flax_mnist.py",
      "source": "google/flax examples/mnist/train.py + main.py (NNX; 18f8f311c275d57f46d95e41b15aa97b454754c0)",
      "framework": f"Flax {__import__('flax').__version__} / JAX {jax.__version__} / optax {optax.__version__}"
                   f" / absl-py logging",
      "inject": {"kind": KIND, "step": INJECT_STEP, "print": first_after} if INJECT else None,
      "tolerance": 5e-05,
      "steps_per_epoch": steps_per_epoch,
      "printed": printed,
      "evaluations": evaluations,
  }
  with open(os.path.join(HERE, f"{RUN}.truth.json"), "w") as f:
    json.dump(truth, f, indent=1)
    f.write("\n")


# ---- main.py ---------------------------------------------------------------------------------------------------
FLAGS = flags.FLAGS

config_flags.DEFINE_config_dict(
    'config',
    get_config(),
    'The training hyperparameter configuration.',
    lock_config=True,
)


def main(argv):
  if len(argv) > 1:
    raise app.UsageError('Too many command-line arguments.')

  logging.info('JAX process: %d / %d', jax.process_index(), jax.process_count())
  logging.info('JAX local devices: %r', jax.local_devices())

  train_and_evaluate(FLAGS.config)


if __name__ == '__main__':
  app.run(main)
