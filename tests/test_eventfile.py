"""The daemon's TensorBoard scalars (runner/metrics/eventfile.py), read back with TensorBoard's own reader: what a job
printed becomes curves in its TensorBoard folder's `printed` run (issue 20)."""

from __future__ import annotations

import math
import subprocess
import sys
from pathlib import Path
from typing import Optional

import pytest
from harness import Tfrun, wait_for, write_script
from tensorboard.backend.event_processing import event_accumulator

from tfrun.runner.metrics.eventfile import PRINTED, ScalarFile, crc32c, crc32c_table


def _scalars(folder: Path) -> dict[str, list[tuple[int, float]]]:
    """Every scalar series in `folder`, as TensorBoard loads it."""
    reader = event_accumulator.EventAccumulator(str(folder), size_guidance={event_accumulator.SCALARS: 0})
    reader.Reload()
    return {tag: [(e.step, e.value) for e in reader.Scalars(tag)] for tag in reader.Tags()["scalars"]}


_ISCSI_READ_PDU = bytes.fromhex(  # a SCSI Read (10) command
    "01c00000" + "00" * 12 + "14000000000004000000001400000018" + "28" + "00" * 7 + "02" + "00" * 7
)
CHECKS = [  # CRC-32C's check value, and the examples of RFC 3720 (iSCSI), B.4, with their CRC read as a number
    (b"123456789", 0xE3069283),
    (b"", 0),
    (bytes(32), 0x8A9136AA),
    (b"\xff" * 32, 0x62A8AB43),
    (bytes(range(32)), 0x46DD794E),
    (bytes(range(31, -1, -1)), 0x113FDB5C),
    (_ISCSI_READ_PDU, 0xD9963A56),
]


@pytest.mark.parametrize("data,expected", CHECKS)
def test_crc32c_is_castagnolis_in_c_and_in_python(data: bytes, expected: int) -> None:
    assert crc32c is not crc32c_table, "google-crc32c is a dependency: its C code computes the CRCs here"
    assert crc32c(data) == expected
    assert crc32c_table(data) == expected


@pytest.mark.parametrize("missing", ["google_crc32c", "google_crc32c._crc32c"])
def test_without_google_crc32c_or_its_c_code_the_table_computes_and_nothing_warns(missing: str) -> None:
    """A box whose platform has no google-crc32c wheel: the package missing, or built without its extension
    (then it computes in Python itself and warns about it at import, which -W error turns into a failure)."""
    script = (
        f"import sys; sys.modules[{missing!r}] = None\n"  # what `import` then refuses, as if it were not there
        "from tfrun.runner.metrics import eventfile\n"
        "print(eventfile.crc32c is eventfile.crc32c_table, hex(eventfile.crc32c(b'123456789')))\n"
    )
    result = subprocess.run([sys.executable, "-W", "error", "-c", script], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ["True", "0xe3069283"]


def test_scalars_read_back_by_tensorboard_across_restarts(tmp_path: Path) -> None:
    folder = tmp_path / "tensorboard" / PRINTED
    ScalarFile(folder).append([(0, {"loss": 2.5, "accuracy": 0.25}), (100, {"loss": 1.25})])
    ScalarFile(folder).append([(200, {"loss": math.nan, "flag": True, "huge": 10**400}), (300, {"loss": 0.5})])
    assert len(list(folder.glob("events.out.tfevents.*"))) == 1, "a daemon restart appends to the same file"
    series = _scalars(folder)
    assert set(series) == {"loss", "accuracy"}, "bools and numbers beyond a double are no scalars"
    assert series["accuracy"] == [(0, 0.25)]
    steps = [step for step, _ in series["loss"]]
    assert steps == [0, 100, 200, 300]
    values = [value for _, value in series["loss"]]
    assert values[:2] == [2.5, 1.25] and math.isnan(values[2]) and values[3] == 0.5


def test_nothing_to_write_makes_no_file(tmp_path: Path) -> None:
    ScalarFile(tmp_path / "run").append([(1, {"note": "text"})])  # type: ignore[dict-item]
    assert not (tmp_path / "run").exists()


def test_a_jobs_printed_losses_become_tensorboard_scalars(tf: Tfrun, project: Path) -> None:
    write_script(
        project, "plain.py", "for epoch in range(1, 4):\n    print(f'Epoch {epoch}, Avg Loss: {1.0 / epoch:.4f}')\n"
    )
    job = tf.submit(str(project / "plain.py"))
    assert tf.run("wait", str(job)).returncode == 0
    folder = tf.job_dir(job) / "tensorboard" / PRINTED

    def three_losses() -> Optional[list[tuple[int, float]]]:
        """The watch keeps what it read in batches (every KEEP_EVERY_S, and all once the job's end is read): the
        run may hold the first loss a moment before the others."""
        loss = _scalars(folder).get("avg_loss", []) if folder.is_dir() else []
        return loss if len(loss) >= 3 else None

    loss = wait_for(three_losses, what="the printed run's three losses")
    assert [round(value, 4) for _, value in loss] == [1.0, 0.5, 0.3333]
