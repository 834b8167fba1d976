"""MNIST with tf.distribute.MirroredStrategy and a custom training loop: the README's demo job.

The training of ../shared/seeds/000 as a job: one model replica per visible GPU (or the CPU), the global
batch split between them, `Epoch N, Avg Loss: X` after each epoch. It checkpoints to the job's folder on
the checkpoint volume every epoch (and every --save-every steps) and resumes from there when the job is
restarted. When MNIST cannot be downloaded it trains on synthetic digits, so the demo runs anywhere.

    tfrun submit -f jobs/examples/mnist_mirrored.py --epochs 2

Runs on Python 3.8 with TF 2.9 (the container) as well as on current TensorFlow with Keras 3.
"""

import argparse
import sys

import tensorflow as tf
from digits import load_digits

from tfrun.jobs import Checkpoints, Progress, setup_gpus


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--batch-size", type=int, default=64, help="per replica")
    parser.add_argument("--examples", type=int, default=20000, help="how many training images to use")
    parser.add_argument("--save-every", type=int, default=200, help="also checkpoint every N steps")
    parser.add_argument("--synthetic", action="store_true", help="skip the download")
    args = parser.parse_args(argv)

    strategy = setup_gpus()
    print(f"{strategy.num_replicas_in_sync} replica(s) in sync")
    global_batch = args.batch_size * strategy.num_replicas_in_sync

    x_train, y_train = load_digits(args.synthetic, args.examples)
    dataset = tf.data.Dataset.from_tensor_slices((x_train, y_train)).shuffle(1000, seed=0).batch(global_batch)

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
        checkpoints = Checkpoints(model=model, optimizer=optimizer)
    progress = Progress(checkpoints, save_every_steps=args.save_every)

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

    for epoch in progress.epochs(args.epochs):
        total, batches = 0.0, 0
        remaining = dataset.skip(progress.step_in_epoch)  # after a restart in the middle of an epoch
        for batch in strategy.experimental_distribute_dataset(remaining):
            loss = float(distributed_step(batch))
            total, batches = total + loss, batches + 1
            if not progress.report(loss=loss):
                return 1
        print(f"Epoch {epoch + 1}, Avg Loss: {total / max(batches, 1):.4f}", flush=True)
    print(f"trained {progress.step} steps; checkpoints in {checkpoints.directory}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
