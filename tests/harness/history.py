"""A long history of ended jobs in a real daemon's store, made in seconds: the rows of a few jobs that really
ran (and ended) copied many times over, as tfrund wrote them, each copy a job of its own (a new id, a name of
its own, made after its models and before the copying, in order). Submitting 10,000 jobs takes a 2-CPU
machine minutes; what a listing reads is their rows, which these are. Each copy keeps its model's job
folder, so its log and metrics read as the model's."""

from __future__ import annotations

import sqlite3
import time
from collections.abc import Sequence

from .home import Tfrun

# The columns a copy takes from its model; `id` is new, `submission_id` (unique: a submit's own) is NULL.
_LEFT_OUT = ("id", "name", "created_at", "submission_id")


def copy_ended_jobs(tf: Tfrun, models: Sequence[int], count: int, name: str = "old") -> list[int]:
    """`count` ended jobs made from `models` in turn (ended jobs of `tf`), named NAME-1 to NAME-COUNT, oldest
    first; their ids. The daemon may be running: it reads its store afresh at each request."""
    db = sqlite3.connect(tf.home / "tfrun.db", isolation_level=None, timeout=30)
    try:
        columns = [row[1] for row in db.execute("PRAGMA table_info(jobs)") if row[1] not in _LEFT_OUT]
        states = dict(db.execute(f"SELECT id, state FROM jobs WHERE id IN ({', '.join('?' * len(models))})", models))
        assert all(states.get(model) in ("succeeded", "failed", "cancelled", "lost") for model in models), states
        (start,) = db.execute("SELECT max(created_at) FROM jobs").fetchone()
        step = (max(time.time(), start + 1) - start) / (count + 1)
        listed = ", ".join(columns)
        db.execute("BEGIN")
        for number in range(1, count + 1):
            db.execute(
                f"INSERT INTO jobs (name, created_at, {listed}) SELECT ?, ?, {listed} FROM jobs WHERE id = ?",
                (f"{name}-{number}", start + number * step, models[number % len(models)]),
            )
        db.execute("COMMIT")
        return [job_id for (job_id,) in db.execute("SELECT id FROM jobs WHERE name LIKE ? ORDER BY id", (f"{name}-%",))]
    finally:
        db.close()
