"""Loss spikes (runner/alerts/spikes.py): none on healthy curves, one at a learning-rate bump, NaN and Inf at
once, none in the warm-up; the detector's state kept across a restart; on a real Keras log read by LogMetrics.
"""

from __future__ import annotations

import json
import math
import statistics
from typing import Any, Optional

import pytest
from harness.metriclogs import LOG_SPIKE_AT, feed_in_pieces
from harness.paths import DATA

from tfrun.runner.alerts.spikes import DEFAULT_WINDOW, Spike, SpikeDetector
from tfrun.runner.metrics import training_loss


def curve(name: str) -> tuple[dict[str, Any], list[tuple[int, float]]]:
    lines = (DATA / "curves" / f"{name}.jsonl").read_text().splitlines()
    rows = [json.loads(line) for line in lines[1:]]
    return json.loads(lines[0]), [(row["step"], row["loss"]) for row in rows]


def spikes_of(losses: list[tuple[int, float]], detector: Optional[SpikeDetector] = None) -> list[Spike]:
    detector = detector if detector is not None else SpikeDetector()
    return [spike for step, loss in losses for spike in [detector.add(step, loss)] if spike is not None]


# SpikeDetector


@pytest.mark.parametrize("name", ["healthy", "noisy"])
def test_no_spike_on_healthy_runs(name: str) -> None:
    about, losses = curve(name)
    assert about["spike_at"] is None and len(losses) >= 600
    assert spikes_of(losses) == []


def test_one_spike_at_the_learning_rate_bump() -> None:
    about, losses = curve("spike")
    detector = SpikeDetector()
    called = next(number for number, (step, loss) in enumerate(losses, 1) if detector.add(step, loss))
    (spike,) = spikes_of(losses[:called])
    assert about["spike_at"] < spike.step <= about["spike_at"] + detector.patience + 3
    assert spike.kind == "ratio" and spike.value > detector.factor * spike.baseline > 0
    assert spike.recent[-1] == spike.value and len(spike.recent) == 10
    # The rest of the run stays diverged: no second alert, and no loss of the incident joins the baseline.
    window = detector.state()["window"]
    assert spikes_of(losses[called:], detector) == []
    assert detector.state()["window"] == window and detector.incident


def test_a_second_incident_fires_only_after_the_loss_came_back() -> None:
    _, healthy = curve("healthy")
    about, spiked = curve("spike")
    at = about["spike_at"]
    incident = [(step, loss) for step, loss in spiked if at <= step < at + 40]
    recovered = [(step + 40, loss) for step, loss in healthy if at <= step < at + 60]
    again = [(step + 100, loss) for step, loss in incident]
    detector = SpikeDetector()
    first = spikes_of([(step, loss) for step, loss in spiked if step < at] + incident, detector)
    assert len(first) == 1
    assert spikes_of(incident, detector) == []  # still the same incident
    second = spikes_of(recovered + again, detector)
    assert len(second) == 1 and at + 100 < second[0].step <= at + 100 + detector.patience + 3


def test_nan_and_inf_fire_at_once_and_once() -> None:
    _, losses = curve("healthy")
    detector = SpikeDetector()
    assert spikes_of(losses[:30], detector) == []
    (nan,) = spikes_of([(31, math.nan), (32, math.nan), (33, math.nan)], detector)
    assert (nan.step, nan.kind) == (31, "nan") and math.isnan(nan.value) and math.isnan(nan.baseline)
    assert nan.recent[:-1] == [loss for _, loss in losses[21:30]]
    (inf,) = spikes_of([(34, 0.9), (35, math.inf), (36, -math.inf)], detector)
    assert (inf.step, inf.kind, inf.value) == (35, "inf", math.inf)


def test_nothing_fires_during_the_warm_up() -> None:
    detector = SpikeDetector(warmup=20)
    assert spikes_of([(step, 1.0) for step in range(1, 15)] + [(step, 50.0) for step in range(15, 21)], detector) == []


def test_detector_state_round_trip() -> None:
    _, losses = curve("spike")
    whole = spikes_of(losses)
    detector = SpikeDetector()
    found = []
    for start in range(0, len(losses), 37):
        found += spikes_of(losses[start : start + 37], detector)
        detector = SpikeDetector.restore(json.loads(json.dumps(detector.state(), allow_nan=False)))
    assert found == whole and len(found) == 1
    detector.add(1000, math.nan)
    assert json.loads(json.dumps(detector.state(), allow_nan=False))["recent"][-1] == "nan"


def test_the_default_statistic_suits_noisy_losses() -> None:
    """The module docstring's reason for a percentile, on the real noisy curve: 2x the median of the last 10
    is often exceeded by noise, four times in a row; 2x their 90th percentile rarely, never twice in a row."""
    _, losses = curve("noisy")
    values = [loss for _, loss in losses]
    window = DEFAULT_WINDOW

    def above(statistic: Any) -> tuple[float, int]:
        flags = [value > 2 * statistic(sorted(values[i - window : i])) for i, value in enumerate(values) if i >= 20]
        runs = "".join("x" if flag else "." for flag in flags).split(".")
        return sum(flags) / len(flags), max(len(run) for run in runs)

    share, longest = above(statistics.median)
    assert window == 10 and share > 0.15 and longest >= 4
    share, longest = above(lambda ordered: ordered[int(0.9 * (len(ordered) - 1))])  # spikes.py's percentile
    assert share < 0.045 and longest == 1


def test_log_metrics_and_detector_on_a_real_keras_spike() -> None:
    log = (DATA / "keras3_spike.log").read_bytes()
    detector = SpikeDetector()
    spikes = []
    for sample in feed_in_pieces(log, 4096):
        loss = training_loss(sample.values)  # None for the epoch's validation values
        if loss is not None:
            spike = detector.add(sample.step, loss)
            spikes += [spike] if spike else []
    (spike,) = spikes
    assert LOG_SPIKE_AT < spike.step <= LOG_SPIKE_AT + detector.patience + 3
    assert max(spike.recent) > 15  # the decoded batch, not Keras's running mean of 1.6
