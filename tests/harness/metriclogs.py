"""What the metric tests share: where the real framework output lies (tests/data), a PyTorch Lightning bar as it
redraws, and the small readers they feed output through.

tests/data/keras{2,3}_fit.log come from tests/data/keras_fit.py; tests/data/curves/*.jsonl and
tests/data/keras3_spike.log from tests/data/make_curves.py; tests/data/real/ holds the output of published training
scripts run on synthetic data, each made by the script beside it, with the losses it computed in `*.truth.json`.
"""

from __future__ import annotations

from typing import Any, Optional

from tfrun.runner.metrics import LogMetrics, Sample

RECOVERED_SHARE = 0.95  # issue #16: at least this share of the printed training losses read, at their step

KERAS_LOGS = ["keras2_fit.log", "keras3_fit.log", "keras3_spike.log"]

LOG_SPIKE_AT = 113  # make_curves.py: the learning rate of keras3_spike.log is bumped before this global step

# PyTorch Lightning's tqdm bar, redrawn with \r, and reset (not ended) for the next epoch.
LIGHTNING = (
    "Epoch 0:   0%|          | 0/4 [00:00<?, ?it/s]"
    "\rEpoch 0:  25%|██▌       | 1/4 [00:00<00:00, 24.10it/s]"
    "\rEpoch 0:  25%|██▌       | 1/4 [00:00<00:00, 24.10it/s, v_num=0, train_loss_step=2.310]"
    "\rEpoch 0:  50%|█████     | 2/4 [00:00<00:00, 30.51it/s, v_num=0, train_loss_step=2.150]"
    "\rEpoch 0:  50%|█████     | 2/4 [00:00<00:00, 30.51it/s, v_num=0, train_loss_step=2.150]"
    "\rEpoch 0: 100%|██████████| 4/4 [00:00<00:00, 33.33it/s, v_num=0, train_loss_step=1.900]"
    "\rEpoch 0: 100%|██████████| 4/4 [00:00<00:00, 33.33it/s, v_num=0, train_loss_step=1.900, train_loss_epoch=2.080]"
    "\rEpoch 1:  25%|██▌       | 1/4 [00:00<00:00, 29.80it/s, v_num=0, train_loss_step=1.7e+00, train_loss_epoch=2.080]"
    "\rEpoch 1:  75%|███████▌  | 3/4 [00:00<00:00, 31.02it/s, v_num=0, train_loss_step=nan, train_loss_epoch=2.080]\r"
).encode()


def feed_in_pieces(data: bytes, size: int, metrics: Optional[LogMetrics] = None) -> list[Sample]:
    metrics = metrics if metrics is not None else LogMetrics()
    samples = []
    for start in range(0, len(data), size):
        samples += metrics.feed(data[start : start + size])
    return samples


def samples_of(data: bytes, patterns: tuple[str, ...] = ()) -> list[Sample]:
    return LogMetrics(patterns).feed(data)


def brief(samples: list[Sample]) -> list[tuple[int, dict[str, float], Any, str]]:
    return [(sample.step, sample.values, sample.epoch, sample.source) for sample in samples]
