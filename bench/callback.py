#!/usr/bin/env python3
"""What tfrun's Keras callback costs a training run: steps per second with and without it. Run by hand.

    .venv/bin/python -m bench.callback [--rounds 7] [--steps 400]

A small model (an MLP on 784 inputs, batch 64) trains `--steps` steps per epoch, in alternating rounds:
plain `model.fit`, then with `TfrunCallback` writing per-step metrics (to a metrics file, as under tfrund),
then with a checkpoint at the end of each epoch as well. Each round is one epoch; the table shows the
median steps per second and the slowdown against plain fit (goal: under 1%). Small models are the worst
case: the same callback costs a smaller share of a slower step.
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any, Callable


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--steps", type=int, default=400)
    args = parser.parse_args()
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    import numpy as np
    import tensorflow as tf

    from tfrun.jobs import Checkpoints, TfrunCallback
    from tfrun.jobs.metrics import MetricWriter

    work = Path(tempfile.mkdtemp(prefix="tfrun-bench-callback-"))
    rng = np.random.default_rng(0)
    x = rng.random((args.steps * 64, 784), dtype=np.float32)
    y = rng.integers(0, 10, size=args.steps * 64)
    model = tf.keras.Sequential(
        [
            tf.keras.Input((784,)),
            tf.keras.layers.Dense(128, activation="relu"),
            tf.keras.layers.Dense(10),
        ]
    )
    model.compile(optimizer="adam", loss=tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    model.fit(x, y, batch_size=64, epochs=1, verbose=0)  # compile and warm up
    checkpoints = Checkpoints(directory=str(work / "ckpt"), model=model, optimizer=model.optimizer)

    variants: dict[str, Callable[[], list[Any]]] = {
        "model.fit": lambda: [],
        "+ TfrunCallback (metrics each step)": lambda: [
            TfrunCallback(save_every_epochs=0, metrics=MetricWriter(str(work / "metrics.jsonl")))
        ],
        "+ TfrunCallback (metrics, checkpoint each epoch)": lambda: [
            TfrunCallback(checkpoints, metrics=MetricWriter(str(work / "metrics.jsonl")))
        ],
    }
    rates: dict[str, list[float]] = {name: [] for name in variants}
    names = list(variants)
    for round_ in range(args.rounds):
        for name in names[round_ % len(names) :] + names[: round_ % len(names)]:  # rotate: no variant always first
            started = time.perf_counter()
            model.fit(x, y, batch_size=64, epochs=1, verbose=0, callbacks=variants[name]())
            rates[name].append(args.steps / (time.perf_counter() - started))

    # The callback's own time per step, measured directly: what the noisy end-to-end rates cannot resolve.
    probe = TfrunCallback(save_every_epochs=0, metrics=MetricWriter(str(work / "probe.jsonl")))
    probe.set_model(model)
    probe.on_train_begin()
    logs = {"loss": np.float32(0.25), "accuracy": np.float32(0.5)}
    started = time.perf_counter()
    for batch in range(100_000):
        probe.on_train_batch_end(batch, logs)
    per_step_us = (time.perf_counter() - started) / 100_000 * 1e6

    base = statistics.median(rates["model.fit"])
    print(f"\nTensorFlow {tf.__version__}, {os.cpu_count()} CPUs, {args.steps} steps an epoch, median of "
          f"{args.rounds} epochs each\n")  # fmt: skip
    print("| what | steps/s | slower than model.fit |")
    print("| --- | --- | --- |")
    for name, samples in rates.items():
        rate = statistics.median(samples)
        print(f"| {name} | {rate:.0f} | {100 * (base - rate) / base:+.1f}% |")
    print(f"\nTfrunCallback's own work per step: {per_step_us:.1f} µs, {100 * per_step_us * base / 1e6:.2f}% of a "
          f"step of this model ({1e6 / base:.0f} µs)")  # fmt: skip


if __name__ == "__main__":
    main()
