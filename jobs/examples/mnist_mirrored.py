"""MNIST with tf.distribute.MirroredStrategy and a custom training loop: the README's demo job.

The training of ../shared/seeds/000 as a job: one model replica per visible GPU (or the CPU), the global
batch split between them, `Epoch N, Avg Loss: X` after each epoch. When MNIST cannot be downloaded (no
network on the box) it trains on synthetic digits of the same shape, so the demo runs anywhere.

    tfrun submit -f jobs/examples/mnist_mirrored.py --epochs 2

Runs on Python 3.8 with TF 2.9 (the container) as well as on current TensorFlow with Keras 3.
"""

import argparse
import os
import socket
import sys

import numpy as np
import tensorflow as tf


def load_mnist(synthetic: bool, limit: int):
    """(images, labels) as float32 in [0, 1] and int labels; synthetic when asked or offline."""
    if not synthetic:
        socket.setdefaulttimeout(15)  # an unreachable download site must not hang the job
        try:
            (x, y), _ = tf.keras.datasets.mnist.load_data()
            return x[:limit].astype("float32") / 255.0, y[:limit]
        except Exception as exc:  # no network, a proxy, a broken cache: all mean the same here
            print(f"MNIST unavailable ({str(exc).splitlines()[0][:120]}); training on synthetic digits")
    rng = np.random.default_rng(0)
    y = rng.integers(0, 10, size=limit)
    # Each class lights up its own band of rows, so the model has something real to learn.
    x = rng.random((limit, 28, 28), dtype=np.float32) * 0.8
    for digit in range(10):
        x[y == digit, digit * 2 : digit * 2 + 6, :] += 0.25
    return np.clip(x, 0.0, 1.0), y


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--batch-size", type=int, default=64, help="per replica")
    parser.add_argument("--examples", type=int, default=20000, help="how many training images to use")
    parser.add_argument("--synthetic", action="store_true", help="skip the download")
    args = parser.parse_args(argv)

    strategy = tf.distribute.MirroredStrategy()
    print(f"TensorFlow {tf.__version__}, {strategy.num_replicas_in_sync} replica(s) in sync")
    global_batch = args.batch_size * strategy.num_replicas_in_sync

    x_train, y_train = load_mnist(args.synthetic, args.examples)
    dataset = (
        tf.data.Dataset.from_tensor_slices((x_train, y_train))
        .shuffle(1000, seed=0)
        .batch(global_batch)
        .prefetch(tf.data.AUTOTUNE)
    )
    dist_dataset = strategy.experimental_distribute_dataset(dataset)

    with strategy.scope():
        model = tf.keras.Sequential(
            [
                tf.keras.Input(shape=(28, 28)),
                tf.keras.layers.Flatten(),
                tf.keras.layers.Dense(128, activation="relu"),
                tf.keras.layers.Dropout(0.2),
                tf.keras.layers.Dense(10),
            ]
        )
        loss_object = tf.keras.losses.SparseCategoricalCrossentropy(
            from_logits=True, reduction=tf.keras.losses.Reduction.NONE
        )
        optimizer = tf.keras.optimizers.Adam()

    def compute_loss(labels, logits):
        per_example = loss_object(labels, logits)
        return tf.nn.compute_average_loss(per_example, global_batch_size=global_batch)

    def step(inputs):
        images, labels = inputs
        with tf.GradientTape() as tape:
            loss = compute_loss(labels, model(images, training=True))
        grads = tape.gradient(loss, model.trainable_variables)
        optimizer.apply_gradients(zip(grads, model.trainable_variables))
        return loss

    @tf.function
    def distributed_step(inputs):
        per_replica = strategy.run(step, args=(inputs,))
        return strategy.reduce(tf.distribute.ReduceOp.SUM, per_replica, axis=None)

    for epoch in range(args.epochs):
        total, batches = 0.0, 0
        for batch in dist_dataset:
            total += float(distributed_step(batch))
            batches += 1
        print(f"Epoch {epoch + 1}, Avg Loss: {total / max(batches, 1):.4f}", flush=True)

    checkpoint_dir = os.environ.get("TFRUN_CHECKPOINT_DIR")
    if checkpoint_dir:
        path = tf.train.Checkpoint(model=model, optimizer=optimizer).save(os.path.join(checkpoint_dir, "final"))
        print(f"saved {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
