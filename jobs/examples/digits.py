"""MNIST for the example jobs, or synthetic digits of the same shape when it cannot be downloaded."""

import socket

import numpy as np
import tensorflow as tf


def load_digits(synthetic=False, limit=20000):
    """(images, labels): float32 images in [0, 1] of 28x28, int labels; synthetic when asked or offline."""
    if not synthetic:
        socket.setdefaulttimeout(15)  # an unreachable download site must not hang the job
        try:
            (x, y), _ = tf.keras.datasets.mnist.load_data()
            return x[:limit].astype("float32") / 255.0, y[:limit]
        except Exception as exc:  # no network, a proxy, a broken cache: all mean the same here
            why = (str(exc).splitlines() or [type(exc).__name__])[0]  # whole: a cut word reads as another
            print(f"MNIST unavailable ({why}); training on synthetic digits")
    rng = np.random.default_rng(0)
    y = rng.integers(0, 10, size=limit)
    # Each class lights up its own band of rows, so the model has something real to learn.
    x = rng.random((limit, 28, 28), dtype=np.float32) * 0.8
    for digit in range(10):
        x[y == digit, digit * 2 : digit * 2 + 6, :] += 0.25
    return np.clip(x, 0.0, 1.0), y
