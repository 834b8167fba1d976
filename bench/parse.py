#!/usr/bin/env python3
"""What reading a job's output into metrics costs tfrund a line: this checkout's reader (runner/metrics/) against
an earlier commit's, side by side in one run, each in a process of its own, and the floor a user has today: a
hand-written `re.search(r"loss=(\\S+)")` over each line, as a `tail -f | python` loop would do. Run by hand:

    .venv/bin/python -m bench.parse [--against 5113ccd] [--lines 200000] [--runs 5]

The earlier commit is checked out in a temporary git worktree and imported from there. Each row feeds --lines
lines to a fresh reader in 64 KiB chunks, as the daemon hands over a growing output.log, --runs times; it prints
the median microseconds a line and the ratio of this checkout's to the earlier one's:
  - plain: `step N loss=x`, bench/scale.py's lines row, the commonest metric line;
  - quiet: lines with no metric word, which the reader skips by a few byte searches a block;
  - keras: a Keras 3 bar redrawn (backspaces and colours) with its running means;
  - and one row a shape issues 49 and 51 taught it (a boosting round, a box of rows, a column table, a line with
    training and evaluation figures, a print glued to a tqdm redraw): the earlier reader reads them as nothing, or
    wrongly, so their ratio says what reading them costs, not a slowdown.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
# Imports tfrun from the checkout TFRUN_TREE names, before the installed (editable) one.
_FINDER = """
import importlib.util, os, sys
root = os.environ.get("TFRUN_TREE")
if root:
    mapping = {"tfrun": root + "/tfrun", "tfrun.client": root + "/client", "tfrun.jobs": root + "/jobs",
               "tfrun.runner": root + "/runner"}
    class Finder:
        @classmethod
        def find_spec(cls, name, path=None, target=None):
            if name not in mapping:
                return None
            return importlib.util.spec_from_file_location(
                name, mapping[name] + "/__init__.py", submodule_search_locations=[mapping[name]])
    sys.meta_path.insert(0, Finder)
"""
_WORKER = """
import json, re, statistics, sys, time
from tfrun.runner.metrics import LogMetrics

lines, runs = int(sys.argv[1]), int(sys.argv[2])
BOX = ("-" * 33 + "\\n| time/               |          |\\n|    total_timesteps  | {n:<8} |\\n"
       "| train/              |          |\\n|    loss             | 0.549    |\\n|    n_updates        | {n:<8} |\\n"
       + "-" * 33 + "\\n")
KERAS = "\\b\\b\\b\\b\\r{n:>3}/400 \\x1b[32m━━━━━━━━\\x1b[0m - 2s 5ms/step - accuracy: 0.9 - loss: 0.{n:04d}"
GLUED = "\\rtraining:  1%|  | {n}/99999 [00:01<00:09, 9.0it/s]training loss: 0.{n}\\n"
SHAPES = {
    "plain": lambda n: f"step {n} loss={(n % 997) / 1000:.4f}\\n",
    "quiet": lambda n: f"saving shard {n} of the dataset to /data/cache, 12.5 MB\\n",
    "keras": lambda n: KERAS.format(n=n % 400),
    "boosting round": lambda n: f"[{n}]\\ttraining's l1: 0.{n % 997:06d}\\tvalid_1's l1: 0.{n % 991:06d}\\n",
    "box of rows (a line)": lambda n: BOX.format(n=n),
    "column table row": lambda n: f"{n:>7}        0.{n % 997:04d}       0.5725        0.6826  0.0154\\n",
    "training and evaluation": lambda n: f"Epoch: {n:03d}, Loss: 0.{n % 997:04d}, Train: 0.31, Val: 0.28\\n",
    "print glued to a bar": lambda n: GLUED.format(n=n),
}
HEADERS = {"column table row": "  epoch    train_loss    valid_acc    valid_loss     dur\\n", "keras": "Epoch 1/1\\n"}
BY_HAND = re.compile(rb"loss=(\\S+)")
found = {}
for name, make in SHAPES.items():
    per_line = 6 if name.startswith("box") else 1
    text = (HEADERS.get(name, "") + "".join(make(n) for n in range(1, lines // per_line + 1))).encode()
    chunks = [text[at : at + 65536] for at in range(0, len(text), 65536)]
    times = []
    for _ in range(runs):
        metrics = LogMetrics()
        started = time.perf_counter()
        samples = 0
        for chunk in chunks:
            samples += len(metrics.feed(chunk))
        times.append((time.perf_counter() - started) / lines * 1e6)
    found[name] = {"us": statistics.median(times), "samples": samples}
    if name == "plain":
        times = []
        for _ in range(runs):
            started = time.perf_counter()
            for line in text.splitlines():
                BY_HAND.search(line)
            times.append((time.perf_counter() - started) / lines * 1e6)
        found["by hand"] = {"us": statistics.median(times), "samples": lines}
print(json.dumps(found))
"""


def measure(tree: Path | None, lines: int, runs: int) -> dict[str, dict[str, float]]:
    """The worker's figures, run with tfrun imported from `tree` (None: this checkout)."""
    env = {**os.environ, "PYTHONDONTWRITEBYTECODE": "1"}
    env.pop("TFRUN_TREE", None)
    if tree is not None:
        env["TFRUN_TREE"] = str(tree)
    done = subprocess.run(
        [sys.executable, "-c", _FINDER + _WORKER, str(lines), str(runs)],
        env=env,
        check=True,
        capture_output=True,
        text=True,
    )
    figures: dict[str, dict[str, float]] = json.loads(done.stdout)
    return figures


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--against", default="5113ccd", help="the earlier commit (5113ccd: before issues 49 and 51)")
    parser.add_argument("--lines", type=int, default=200_000, help="lines fed a row (200000)")
    parser.add_argument("--runs", type=int, default=5, help="runs a row, the median kept (5)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="tfrun-bench-parse-") as work:
        tree = Path(work) / "earlier"
        subprocess.run(
            ["git", "-C", str(REPO), "worktree", "add", "-q", "--detach", str(tree), args.against], check=True
        )
        try:
            rounds = [(measure(tree, args.lines, args.runs), measure(None, args.lines, args.runs)) for _ in range(2)]
        finally:
            subprocess.run(["git", "-C", str(REPO), "worktree", "remove", "--force", str(tree)], check=True)
    earlier = {name: statistics.median(r[0][name]["us"] for r in rounds) for name in rounds[0][0]}
    now = {name: statistics.median(r[1][name]["us"] for r in rounds) for name in rounds[0][1]}
    print(
        f"| lines ({args.lines:,} a row) | {args.against} µs/line (samples) | this checkout µs/line (samples) | ratio |"
    )
    print("|---|---:|---:|---:|")
    for name in now:
        if name == "by hand":
            continue
        before, after = rounds[-1][0][name]["samples"], rounds[-1][1][name]["samples"]
        ratio = now[name] / earlier[name]
        print(f"| {name} | {earlier[name]:.2f} ({before:,.0f}) | {now[name]:.2f} ({after:,.0f}) | {ratio:.2f} |")
    print(f"| floor: `re.search(r'loss=(\\S+)')` a plain line | | {now['by hand']:.2f} | |")


if __name__ == "__main__":
    main()
