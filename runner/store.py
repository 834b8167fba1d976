"""The job store: one SQLite database per daemon (WAL, schema versioned with `user_version`).

The database is the daemon's memory of jobs; the job folders hold the facts the shim writes (shim.json,
exit.json), so the store can always be brought up to date from them after a crash.
"""

from __future__ import annotations

import contextlib
import json
import sqlite3
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional

from tfrun.constants import MAX_INT64
from tfrun.protocol import Job, JobState, is_job_id
from tfrun.runner import jobdir

SCHEMA_VERSION = 5

_MIGRATIONS: dict[int, str] = {
    1: """
    CREATE TABLE jobs (
        id INTEGER PRIMARY KEY AUTOINCREMENT,  -- AUTOINCREMENT: an id is never reused
        name TEXT,
        state TEXT NOT NULL,
        spec TEXT NOT NULL,            -- JSON: source (the work dir snapshotted), script, args, command, env
        job_dir TEXT NOT NULL,
        checkpoint_dir TEXT NOT NULL,
        created_at REAL NOT NULL,
        started_at REAL,
        finished_at REAL,
        exit_code INTEGER,
        signal INTEGER,
        pid INTEGER,
        shim_pid INTEGER,
        shim_start INTEGER,
        boot_id TEXT,
        reason TEXT
    );
    CREATE INDEX jobs_state ON jobs(state);
    CREATE INDEX jobs_name ON jobs(name, id);
    CREATE TABLE events (
        id INTEGER PRIMARY KEY,
        job_id INTEGER NOT NULL REFERENCES jobs(id),
        at REAL NOT NULL,
        kind TEXT NOT NULL,
        detail TEXT
    );
    CREATE INDEX events_job ON events(job_id, id);
    """,
    2: """
    ALTER TABLE jobs ADD COLUMN restarted_as INTEGER;  -- the job that runs this one again
    """,
    3: """
    -- A job's alert settings, apart from its record: its URLs hold secrets that no client may see.
    CREATE TABLE job_alerts (
        job_id INTEGER PRIMARY KEY REFERENCES jobs(id),
        rules TEXT NOT NULL,           -- JSON {rule: setting or null}: what watches this job
        notify TEXT NOT NULL,          -- JSON [url]: where its alerts go besides the daemon's URLs (secret)
        patterns TEXT NOT NULL         -- JSON [regex]: its own metric patterns
    );
    -- Where the watch over each job's output stands, so that a new daemon resumes it and alerts nothing twice;
    -- a row from the job's start until its end alerts are stored.
    CREATE TABLE watches (
        job_id INTEGER PRIMARY KEY REFERENCES jobs(id),
        state TEXT NOT NULL            -- JSON: log offset, metric reader and spike detector state, ...
    );
    -- The outbox: an alert is stored here before anything is sent.
    CREATE TABLE alerts (
        id INTEGER PRIMARY KEY AUTOINCREMENT,
        job_id INTEGER,                -- NULL for the box's own alerts (gpu-memory)
        rule TEXT NOT NULL,
        at REAL NOT NULL,
        summary TEXT NOT NULL,
        body TEXT NOT NULL
    );
    CREATE INDEX alerts_job_rule ON alerts(job_id, rule, at);
    CREATE TABLE deliveries (
        id INTEGER PRIMARY KEY,
        alert_id INTEGER NOT NULL REFERENCES alerts(id),
        url TEXT NOT NULL,             -- secret: never leaves the daemon
        target TEXT NOT NULL,          -- the URL with its secrets masked
        state TEXT NOT NULL,           -- pending, sent, expired
        attempts INTEGER NOT NULL DEFAULT 0,
        next_at REAL NOT NULL,
        expires_at REAL NOT NULL,
        sent_at REAL,
        error TEXT                     -- the last failure, secrets masked
    );
    CREATE INDEX deliveries_due ON deliveries(state, next_at);
    """,
    4: """
    ALTER TABLE jobs ADD COLUMN prepared INTEGER NOT NULL DEFAULT 0;  -- its work dir is built: it may start
    ALTER TABLE jobs ADD COLUMN gpus TEXT;     -- JSON [device id]: the GPUs it was given (NULL: not scheduled)
    ALTER TABLE jobs ADD COLUMN waiting TEXT;  -- why a queued job has not started yet
    """,
    5: """
    -- The client's id of the submit that made the job (NULL for restarts and older clients): the same submit
    -- sent again, after a daemon died before answering it, finds this job instead of making a second one.
    ALTER TABLE jobs ADD COLUMN submission_id TEXT;
    CREATE UNIQUE INDEX jobs_submission ON jobs(submission_id);
    """,
}


class StoreError(Exception):
    """The database cannot be used; the message says which file and what to do."""


@dataclass
class JobRow:
    """A job as stored, with the supervision fields a client never sees."""

    id: int
    name: Optional[str]
    state: str
    spec: dict[str, Any]
    job_dir: str
    checkpoint_dir: str
    created_at: float
    started_at: Optional[float] = None
    finished_at: Optional[float] = None
    exit_code: Optional[int] = None
    signal: Optional[int] = None
    pid: Optional[int] = None
    shim_pid: Optional[int] = None
    shim_start: Optional[int] = None
    boot_id: Optional[str] = None
    reason: Optional[str] = None
    restarted_as: Optional[int] = None
    prepared: int = 0
    gpus: Optional[list[str]] = None
    waiting: Optional[str] = None

    @property
    def final(self) -> bool:
        return self.state in JobState.FINAL

    def public(self) -> Job:
        """The record as the protocol shows it to a client."""
        return Job(
            id=self.id,
            name=self.name,
            state=self.state,
            script=self.spec["script"],
            args=self.spec["args"],
            command=self.spec["command"],
            workdir=str(Path(self.job_dir) / jobdir.WORK),
            env=self.spec["env"],
            job_dir=self.job_dir,
            log_path=str(Path(self.job_dir) / jobdir.OUTPUT),
            checkpoint_dir=self.checkpoint_dir,
            created_at=self.created_at,
            started_at=self.started_at,
            finished_at=self.finished_at,
            exit_code=self.exit_code,
            signal=self.signal,
            pid=self.pid,
            reason=self.reason,
            source=self.spec.get("source"),
            git_commit=self.spec.get("git_commit"),
            git_dirty=self.spec.get("git_dirty"),
            files=self.spec.get("files", 0),
            bytes=self.spec.get("bytes", 0),
            restart_of=self.spec.get("restart_of"),
            restarted_as=self.restarted_as,
            restarts_left=self.spec.get("max_restarts", 0),
            gpus_requested=self.spec.get("gpus", 0),
            gpus=self.gpus or [],
            priority=self.spec.get("priority", 0),
            after=self.spec.get("after", []),
            waiting=self.waiting if self.state == JobState.QUEUED else None,
            tty=bool(self.spec.get("tty")),
        )


_COLUMNS = [
    "id", "name", "state", "spec", "job_dir", "checkpoint_dir", "created_at", "started_at", "finished_at",
    "exit_code", "signal", "pid", "shim_pid", "shim_start", "boot_id", "reason", "restarted_as", "prepared",
    "gpus", "waiting",
]  # fmt: skip
_UPDATABLE = set(_COLUMNS) - {"id", "spec", "created_at"}
_IDS_PER_STATEMENT = 500  # SQLite before 3.32 takes at most 999 parameters in one statement


class Store:
    def __init__(self, path: Path) -> None:
        self.path = path
        try:
            self.db = sqlite3.connect(str(path), isolation_level=None, timeout=10)
            self.db.row_factory = sqlite3.Row
            self.db.execute("PRAGMA journal_mode=WAL")
            self.db.execute("PRAGMA synchronous=NORMAL")
            self.db.execute("PRAGMA foreign_keys=ON")
            self._migrate()
        except sqlite3.DatabaseError as exc:
            raise StoreError(
                f"{path} is not a usable tfrun database ({exc}); move it aside to start afresh, "
                "or point TFRUN_HOME elsewhere"
            ) from None

    def _migrate(self) -> None:
        version = self.db.execute("PRAGMA user_version").fetchone()[0]
        if version > SCHEMA_VERSION:
            raise StoreError(
                f"{self.path} was written by a newer tfrund (schema {version}, this one knows "
                f"{SCHEMA_VERSION}); upgrade tfrun on this machine"
            )
        if version == 0:
            tables = self.db.execute("SELECT count(*) FROM sqlite_master WHERE type='table'").fetchone()[0]
            if tables:
                raise StoreError(
                    f"{self.path} is an SQLite database but not tfrun's; move it aside or point TFRUN_HOME elsewhere"
                )
        for step in range(version + 1, SCHEMA_VERSION + 1):
            self.db.executescript(f"BEGIN IMMEDIATE;\n{_MIGRATIONS[step]}\nPRAGMA user_version={step};\nCOMMIT;")

    def close(self) -> None:
        self.db.close()

    @contextlib.contextmanager
    def transaction(self) -> Iterator[None]:
        """Make every write in the block one commit: a daemon killed inside it leaves none of them, so a move
        of a job (its end with the restart it calls for) is either all recorded or all still to do.

        Within an enclosing transaction the block is part of it. IMMEDIATE takes the write lock at once, so
        the commit cannot fail on a lock that another writer took while the block ran."""
        enclosed = self.db.in_transaction
        if enclosed:
            yield
            return
        self.db.execute("BEGIN IMMEDIATE")
        try:
            yield
            self.db.execute("COMMIT")
        except BaseException:
            if self.db.in_transaction:  # SQLite ends some failed ones itself (a full disk)
                self.db.execute("ROLLBACK")
            raise

    def create_job(
        self,
        name: Optional[str],
        spec: dict[str, Any],
        jobs_dir: Path,
        checkpoint_root: Path,
        checkpoint_dir: Optional[Path] = None,
        submission_id: Optional[str] = None,
    ) -> JobRow:
        """Insert a queued job and create its folder; an id whose folder already exists is skipped.

        The checkpoint folder is the job's own under the root, unless given (a restart shares its job's).
        One transaction: a daemon killed half way leaves no record without its folders, and never a
        submission id without its job.
        """
        while True:
            with self.transaction():
                cur = self.db.execute(
                    "INSERT INTO jobs (name, state, spec, job_dir, checkpoint_dir, created_at, submission_id) "
                    "VALUES (?,?,?,?,?,?,?)",
                    (name, JobState.QUEUED, json.dumps(spec), "", "", time.time(), submission_id),
                )
                job_id = int(cur.lastrowid or 0)
                job_dir = jobs_dir / str(job_id)
                try:
                    job_dir.mkdir(parents=True)
                except FileExistsError:
                    # Left by an earlier database: never write into it; AUTOINCREMENT moves past this id.
                    self.db.execute("DELETE FROM jobs WHERE id=?", (job_id,))
                    continue
                checkpoints = checkpoint_dir or checkpoint_root / str(job_id)
                self.db.execute(
                    "UPDATE jobs SET job_dir=?, checkpoint_dir=? WHERE id=?",
                    (str(job_dir), str(checkpoints), job_id),
                )
                self.add_event(job_id, "submitted")
            row = self.get(job_id)
            assert row is not None
            return row

    def find_submission(self, submission_id: str) -> Optional[JobRow]:
        """The job that the submit with this client-made id created, if any."""
        row = self.db.execute(
            f"SELECT {', '.join(_COLUMNS)} FROM jobs WHERE submission_id=?", (submission_id,)
        ).fetchone()
        return _row(row) if row else None

    def update(self, job_id: int, **values: Any) -> None:
        unknown = set(values) - _UPDATABLE
        if unknown:
            raise ValueError(f"not updatable: {sorted(unknown)}")
        assignments = ", ".join(f"{k}=?" for k in values)
        self.db.execute(f"UPDATE jobs SET {assignments} WHERE id=?", (*values.values(), job_id))

    def delete(self, job_id: int) -> None:
        """Forget a job that never started (its submission failed half way)."""
        for table in ("events", "job_alerts", "watches"):
            self.db.execute(f"DELETE FROM {table} WHERE job_id=?", (job_id,))
        self.db.execute("DELETE FROM jobs WHERE id=?", (job_id,))

    def remove_jobs(self, ids: list[int]) -> None:
        """Forget ended jobs (`tfrun rm`, `prune`): their rows, events, alert settings, watches, and their alerts
        with the deliveries still to make, in one transaction: the outbox sends only what this database
        lists, so no alert of a removed job goes out afterwards. A job that ran again as one of them no
        longer says so (`wait` would follow it to a job that is gone)."""
        with self.transaction():
            for start in range(0, len(ids), _IDS_PER_STATEMENT):
                chunk = ids[start : start + _IDS_PER_STATEMENT]
                marks = ", ".join("?" * len(chunk))
                self.db.execute(
                    f"DELETE FROM deliveries WHERE alert_id IN (SELECT id FROM alerts WHERE job_id IN ({marks}))", chunk
                )
                for table in ("alerts", "events", "job_alerts", "watches"):
                    self.db.execute(f"DELETE FROM {table} WHERE job_id IN ({marks})", chunk)
                self.db.execute(f"UPDATE jobs SET restarted_as=NULL WHERE restarted_as IN ({marks})", chunk)
                self.db.execute(f"DELETE FROM jobs WHERE id IN ({marks})", chunk)

    def watched(self, ids: list[int]) -> bool:
        """Whether the alert watch has yet to store the end alerts of any of these jobs."""
        for start in range(0, len(ids), _IDS_PER_STATEMENT):
            chunk = ids[start : start + _IDS_PER_STATEMENT]
            marks = ", ".join("?" * len(chunk))
            if self.db.execute(f"SELECT 1 FROM watches WHERE job_id IN ({marks}) LIMIT 1", chunk).fetchone():
                return True
        return False

    def set_job_alerts(
        self, job_id: int, rules: dict[str, Optional[float]], notify: list[str], patterns: list[str]
    ) -> None:
        self.db.execute(
            "INSERT OR REPLACE INTO job_alerts (job_id, rules, notify, patterns) VALUES (?,?,?,?)",
            (job_id, json.dumps(rules), json.dumps(notify), json.dumps(patterns)),
        )

    def job_alerts(self, job_id: int) -> Optional[tuple[dict[str, Optional[float]], list[str], list[str]]]:
        """A job's alert rules, its own notification URLs (secret) and metric patterns; None for a job
        submitted before alerts existed."""
        row = self.db.execute("SELECT rules, notify, patterns FROM job_alerts WHERE job_id=?", (job_id,)).fetchone()
        return (json.loads(row[0]), json.loads(row[1]), json.loads(row[2])) if row else None

    def watch_state(self, job_id: int) -> Optional[dict[str, Any]]:
        row = self.db.execute("SELECT state FROM watches WHERE job_id=?", (job_id,)).fetchone()
        return json.loads(row[0]) if row else None

    def save_watch_state(self, job_id: int, state: dict[str, Any]) -> None:
        self.db.execute("INSERT OR REPLACE INTO watches (job_id, state) VALUES (?,?)", (job_id, json.dumps(state)))

    def finish_watch(self, job_id: int) -> None:
        """The job has ended and its end alerts are stored: nothing more to watch."""
        self.db.execute("DELETE FROM watches WHERE job_id=?", (job_id,))

    def add_event(self, job_id: int, kind: str, detail: Optional[str] = None) -> None:
        self.db.execute(
            "INSERT INTO events (job_id, at, kind, detail) VALUES (?,?,?,?)",
            (job_id, time.time(), kind, detail),
        )

    def events(self, job_id: int) -> list[tuple[float, str, Optional[str]]]:
        rows = self.db.execute("SELECT at, kind, detail FROM events WHERE job_id=? ORDER BY id", (job_id,))
        return [(r["at"], r["kind"], r["detail"]) for r in rows]

    def get(self, job_id: int) -> Optional[JobRow]:
        row = self.db.execute(f"SELECT {', '.join(_COLUMNS)} FROM jobs WHERE id=?", (job_id,)).fetchone()
        return _row(row) if row else None

    def find(self, ref: str) -> Optional[JobRow]:
        """A job by id ("12") or by name (the newest job of that name). An id beyond SQLite's integers
        names no job (the protocol bounds a reference's length, so int() is cheap)."""
        if is_job_id(ref):
            job_id = int(ref)
            return self.get(job_id) if job_id <= MAX_INT64 else None
        row = self.db.execute(
            f"SELECT {', '.join(_COLUMNS)} FROM jobs WHERE name=? ORDER BY id DESC LIMIT 1", (ref,)
        ).fetchone()
        return _row(row) if row else None

    def recent_final(self, n: int) -> list[JobRow]:
        """The `n` jobs that ended last."""
        rows = self.db.execute(
            f"SELECT {', '.join(_COLUMNS)} FROM jobs WHERE state IN ({', '.join('?' * len(JobState.FINAL))}) "
            "ORDER BY finished_at DESC, id DESC LIMIT ?",
            (*JobState.FINAL, n),
        )
        return [_row(r) for r in rows]

    def list(self, include_final: bool) -> list[JobRow]:
        where = "" if include_final else f"WHERE state NOT IN ({', '.join('?' * len(JobState.FINAL))})"
        params = () if include_final else JobState.FINAL
        rows = self.db.execute(f"SELECT {', '.join(_COLUMNS)} FROM jobs {where} ORDER BY id", params)
        return [_row(r) for r in rows]

    def counts(self) -> dict[str, int]:
        counts = dict.fromkeys(JobState.ALL, 0)
        for state, n in self.db.execute("SELECT state, count(*) FROM jobs GROUP BY state"):
            counts[state] = n
        return counts


def _row(row: sqlite3.Row) -> JobRow:
    values = dict(zip(_COLUMNS, row))
    values["spec"] = json.loads(values["spec"])
    values["gpus"] = None if values["gpus"] is None else json.loads(values["gpus"])
    return JobRow(**values)
