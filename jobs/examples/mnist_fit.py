"""MNIST with model.fit under MirroredStrategy, with tfrun's Keras callback; `--model cnn` for a small CNN.

The model.fit side of ../shared/seeds/000: exact per-step metrics for the daemon, a checkpoint each epoch
on the checkpoint volume, and, when the job is restarted (cancelled, lost, OOM-killed), training resumes
at the epoch it had reached. Synthetic digits when MNIST cannot be downloaded.

    tfrun submit -f jobs/examples/mnist_fit.py --epochs 3 --model cnn

Runs on Python 3.8 with TF 2.9 (the container) as well as on current TensorFlow with Keras 3.
"""

import argparse
import sys

import tensorflow as tf
from digits import load_digits

from tfrun.jobs import Checkpoints, TfrunCallback, setup_gpus


def build(kind):
    """The MLP of the seed, or a small CNN (two convolutions, ~100k parameters)."""
    layers = [tf.keras.Input(shape=(28, 28))]
    if kind == "cnn":
        layers += [
            tf.keras.layers.Reshape((28, 28, 1)),
            tf.keras.layers.Conv2D(16, 3, activation="relu"),
            tf.keras.layers.MaxPooling2D(),
            tf.keras.layers.Conv2D(32, 3, activation="relu"),
            tf.keras.layers.MaxPooling2D(),
        ]
    layers += [
        tf.keras.layers.Flatten(),
        tf.keras.layers.Dense(128, activation="relu"),
        tf.keras.layers.Dropout(0.2),
        tf.keras.layers.Dense(10),
    ]
    return tf.keras.Sequential(layers)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--batch-size", type=int, default=64, help="per replica")
    parser.add_argument("--examples", type=int, default=20000, help="how many training images to use")
    parser.add_argument("--model", choices=("mlp", "cnn"), default="mlp")
    parser.add_argument("--lr", type=float, default=0.001, help="Adam's learning rate")
    parser.add_argument("--synthetic", action="store_true", help="skip the download")
    args = parser.parse_args(argv)

    strategy = setup_gpus()
    x_train, y_train = load_digits(args.synthetic, args.examples)
    with strategy.scope():
        model = build(args.model)
        model.compile(
            optimizer=tf.keras.optimizers.Adam(args.lr),
            loss=tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True),
            metrics=["accuracy"],
        )
        checkpoints = Checkpoints(model=model, optimizer=model.optimizer)
    model.fit(
        x_train,
        y_train,
        batch_size=args.batch_size * strategy.num_replicas_in_sync,
        epochs=args.epochs,
        initial_epoch=checkpoints.epoch,
        validation_split=0.1,
        callbacks=[TfrunCallback(checkpoints)],
        verbose=2,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
