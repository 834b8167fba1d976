"""The store: one SQLite database per daemon (WAL, schema versioned with `user_version`, runner/records/schema.py),
and the SQL tfrund runs (the jobs' tables, then the alerts'), but for two reads
kept beside their one caller: `ps`'s listing a page at a time (runner/handlers/jobs.py) and a scheduler pass's
light reads of the waiting jobs (runner/queue/queries.py).
The database is the daemon's memory of jobs; the job folders hold the facts the shim writes (shim.json,
exit.json), so the store can always be brought up to date from them after a crash. Its tables:

    jobs        a row per job (runner/records/job.py: JobRow, its spec as JSON)
    job_alerts  a job's alert rules, its own notification URLs (secret) and metric patterns
    job_texts   an ended job's `ps --json` record, kept the first time it is listed (dropped by any write
                to the job, by triggers)
    watches     where the alert watch over a job stands (runner/alerts/watch.py), from its start until its end
                alerts are stored
    alerts      the outbox (runner/alerts/outbox.py): every alert, stored before anything is sent
    deliveries  an alert's way to each URL: pending (to be tried, again), sent, or expired (given up)
    events      no longer written; what older tfrunds wrote there goes with its job
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import shutil
import sqlite3
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, NamedTuple, Optional

from tfrun.constants import MAX_INT64
from tfrun.numerals import is_digits
from tfrun.protocol.fields import JobState, is_job_id
from tfrun.protocol.watching import Alert, Delivery

from .job import JobRow, JobSpec, from_json
from .schema import IDS_PER_STATEMENT, MIGRATIONS

SCHEMA_VERSION = max(MIGRATIONS)  # the schema this tfrund writes

log = logging.getLogger("tfrund")


PENDING, SENT, EXPIRED = "pending", "sent", "expired"  # a delivery's state: to be tried (again), done, given up


class NewAlert(NamedTuple):
    """An alert to store: `targets` maps each URL it goes to (secret) to the URL masked."""

    job_id: Optional[int]  # None for the box's own alerts (gpu-memory)
    rule: str
    at: float
    summary: str
    body: str
    targets: dict[str, str]


class DueDelivery(NamedTuple):
    """A delivery to make now, with what its alert says."""

    id: int
    url: str
    attempts: int
    expires_at: float
    rule: str
    summary: str
    body: str


class StoreError(Exception):
    """The database cannot be used; the message says which file and what to do."""


_COLUMNS = [
    "id", "name", "state", "spec", "job_dir", "checkpoint_dir", "created_at", "started_at", "finished_at",
    "exit_code", "signal", "pid", "shim_pid", "shim_start", "boot_id", "reason", "restarted_as", "prepared",
    "gpus", "waiting", "array_id", "array_index", "cause",
]  # fmt: skip
# A state moves only by `move`; a job's array is fixed when it is made.
_UPDATABLE = set(_COLUMNS) - {"id", "state", "spec", "created_at", "array_id", "array_index"}


class Store:
    """The daemon's database: its jobs, and its alerts' tables (below the jobs' methods)."""

    def __init__(self, path: Path, jobs_dir: Optional[Path] = None) -> None:
        self.path = path
        if jobs_dir is not None:
            _refuse_empty_beside_jobs(path, jobs_dir)
        self._made: list[Path] = []  # job folders made in the transaction under way: gone if it is undone
        self.job_writes = 0  # bumped by every write to the jobs table: the cue to read them again
        self.on_job_write: list[Callable[[], None]] = []  # called at each such write: who waits on it wakes
        self._unfinished: Optional[dict[int, JobRow]] = None  # the unfinished jobs (None: to be read)
        self._listed: list[JobRow] = []  # the same, by id, as list(include_final=False) returns them
        self._stale: set[int] = set()  # jobs written since they were read into _unfinished
        try:
            self.db = sqlite3.connect(str(path), isolation_level=None, timeout=10)
            self.db.row_factory = sqlite3.Row
            self.db.execute("PRAGMA journal_mode=WAL")
            self.db.execute("PRAGMA synchronous=NORMAL")
            self.db.execute("PRAGMA foreign_keys=ON")
            self._migrate()
            self.daemon_id: str = self.db.execute("SELECT id FROM daemon").fetchone()[0]
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
            self.db.executescript(f"BEGIN IMMEDIATE;\n{MIGRATIONS[step]}\nPRAGMA user_version={step};\nCOMMIT;")

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
            self._forget_unfinished()  # what was read inside it may be undone
            for folder in self._made:  # a job undone leaves no folder: its id would be skipped forever
                shutil.rmtree(folder, ignore_errors=True)
            raise
        finally:
            self._made = []

    def create_job(
        self,
        name: Optional[str],
        spec: JobSpec,
        jobs_dir: Path,
        checkpoint_root: Path,
        checkpoint_dir: Optional[Path] = None,
        submission_id: Optional[str] = None,
        array_index: Optional[int] = None,
        array_id: Optional[int] = None,
    ) -> JobRow:
        """Insert a queued job and create its folder; an id whose folder already exists is skipped.

        The checkpoint folder is the job's own under the root, named by its id and this database's
        (`daemon_id`: no other home's job of the same id takes it), unless given (a restart shares its job's).
        A task of an array has its `array_index`, and the `array_id` of its array; none given, the job is an
        array's first task and its id is the array's. One transaction: a daemon killed half way leaves no
        record without its folders, and never a submission id without its job.
        """
        while True:
            created_at = time.time()
            with self.transaction():
                cur = self.db.execute(
                    "INSERT INTO jobs (name, state, spec, job_dir, checkpoint_dir, created_at, submission_id, "
                    "array_index) VALUES (?,?,?,?,?,?,?,?)",
                    (name, JobState.QUEUED, spec.to_json(), "", "", created_at, submission_id, array_index),
                )
                job_id = int(cur.lastrowid or 0)
                job_dir = jobs_dir / str(job_id)
                try:
                    job_dir.mkdir(parents=True)
                except FileExistsError:
                    # Left by an earlier database: never write into it; AUTOINCREMENT moves past this id.
                    self.db.execute("DELETE FROM jobs WHERE id=?", (job_id,))
                    continue
                self._made.append(job_dir)
                checkpoints = checkpoint_dir or checkpoint_root / f"{job_id}-{self.daemon_id}"
                array = None if array_index is None else array_id or job_id
                self.db.execute(
                    "UPDATE jobs SET job_dir=?, checkpoint_dir=?, array_id=? WHERE id=?",
                    (str(job_dir), str(checkpoints), array, job_id),
                )
            self._wrote(job_id)
            return JobRow(
                job_id, name, JobState.QUEUED, spec, str(job_dir), str(checkpoints), created_at,
                array_id=array, array_index=array_index,
            )  # fmt: skip

    def find_submission(self, submission_id: str) -> Optional[JobRow]:
        """The job that the submit with this client-made id created, if any."""
        row = self.db.execute(
            f"SELECT {', '.join(_COLUMNS)} FROM jobs WHERE submission_id=?", (submission_id,)
        ).fetchone()
        return _row(row) if row else None

    def array_tasks(self, array_id: int) -> list[JobRow]:
        """The tasks an array was submitted with (not their restarts), in index order."""
        rows = self.db.execute(
            f"SELECT {', '.join(_COLUMNS)} FROM jobs WHERE array_id=? ORDER BY array_index, id", (array_id,)
        )
        return [row for row in map(_row, rows) if row.spec.restart_of is None]

    def move(self, job_id: int, old: str, new: str, **values: Any) -> bool:
        """Set a job's state to `new` (and `values`) if it is `old`; False, with nothing written, if it is not.
        runner/records/lifecycle.py alone calls this: it checks the move first."""
        unknown = set(values) - _UPDATABLE
        if unknown:
            raise ValueError(f"not updatable: {sorted(unknown)}")
        assignments = "".join(f", {k}=?" for k in values)
        self._wrote(job_id)
        cur = self.db.execute(
            f"UPDATE jobs SET state=?{assignments} WHERE id=? AND state=?", (new, *values.values(), job_id, old)
        )
        return cur.rowcount == 1

    def _wrote(self, job_id: int) -> None:
        """Note a write to a job's row: the next list of unfinished jobs reads that row again."""
        self._bump()
        self._stale.add(job_id)

    def _forget_unfinished(self) -> None:
        """Read every unfinished job again at the next list (many rows written, or a write undone)."""
        self._bump()
        self._unfinished = None

    def _bump(self) -> None:
        self.job_writes += 1
        for wake in self.on_job_write:
            wake()

    def update(self, job_id: int, **values: Any) -> None:
        """Write fields of a job other than its state."""
        unknown = set(values) - _UPDATABLE
        if unknown:
            raise ValueError(f"not updatable: {sorted(unknown)}")
        assignments = ", ".join(f"{k}=?" for k in values)
        self._wrote(job_id)
        self.db.execute(f"UPDATE jobs SET {assignments} WHERE id=?", (*values.values(), job_id))

    def delete(self, job_id: int) -> None:
        """Forget a job that never started (its submission failed half way)."""
        for table in ("events", "job_alerts", "watches"):
            self.db.execute(f"DELETE FROM {table} WHERE job_id=?", (job_id,))
        self._wrote(job_id)
        self.db.execute("DELETE FROM jobs WHERE id=?", (job_id,))

    def remove_jobs(self, ids: list[int]) -> None:
        """Forget ended jobs (`tfrun rm`, `prune`): their rows, events, alert settings, watches, and their alerts
        with the deliveries still to make, in one transaction: the outbox sends only what this database
        lists, so no alert of a removed job goes out afterwards. A job that ran again as one of them no
        longer says so (`wait` would follow it to a job that is gone)."""
        self._forget_unfinished()
        with self.transaction():
            for start in range(0, len(ids), IDS_PER_STATEMENT):
                chunk = ids[start : start + IDS_PER_STATEMENT]
                marks = ", ".join("?" * len(chunk))
                self.db.execute(
                    f"DELETE FROM deliveries WHERE alert_id IN (SELECT id FROM alerts WHERE job_id IN ({marks}))", chunk
                )
                for table in ("alerts", "events", "job_alerts", "watches"):
                    self.db.execute(f"DELETE FROM {table} WHERE job_id IN ({marks})", chunk)
                self.db.execute(f"UPDATE jobs SET restarted_as=NULL WHERE restarted_as IN ({marks})", chunk)
                self.db.execute(f"DELETE FROM jobs WHERE id IN ({marks})", chunk)

    # -- jobs ---------------------------------------------------------------------------------------------

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

    def _read_list(self, include_final: bool) -> list[JobRow]:
        where = "" if include_final else f"WHERE state NOT IN ({', '.join('?' * len(JobState.FINAL))})"
        params = () if include_final else JobState.FINAL
        rows = self.db.execute(f"SELECT {', '.join(_COLUMNS)} FROM jobs {where} ORDER BY id", params)
        return [_row(r) for r in rows]

    # -- the alert tables: a job's rules and URLs, the watch over it, the outbox and its deliveries ----------

    def watched(self, ids: list[int]) -> bool:
        """Whether the alert watch has yet to store the end alerts of any of these jobs."""
        for start in range(0, len(ids), IDS_PER_STATEMENT):
            chunk = ids[start : start + IDS_PER_STATEMENT]
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

    def keep_texts(self, form: str, texts: list[tuple[int, str]]) -> None:
        """Keep ended jobs' `ps --json` records (job id, text) for the next listings; a database that takes no
        writes now (a full disk) only lists more slowly."""
        try:
            with self.transaction():
                self.db.executemany(
                    "INSERT OR REPLACE INTO job_texts (job_id, form, text) VALUES (?, ?, ?)",
                    [(job_id, form, text) for job_id, text in texts],
                )
        except sqlite3.OperationalError as exc:
            log.warning("ps --json records not kept: %s", exc)

    def watch_state(self, job_id: int) -> Optional[dict[str, Any]]:
        row = self.db.execute("SELECT state FROM watches WHERE job_id=?", (job_id,)).fetchone()
        return json.loads(row[0]) if row else None

    def save_watch_states(self, states: dict[int, dict[str, Any]]) -> None:
        """Where the watches of these jobs stand, in one statement: one commit for all the jobs whose save came
        due in a turn of the watch (a commit each cost a busy box a tenth of the watch's time)."""
        rows = [(job_id, json.dumps(state)) for job_id, state in states.items()]
        with self.transaction():
            self.db.executemany("INSERT OR REPLACE INTO watches (job_id, state) VALUES (?,?)", rows)

    def finish_watch(self, job_id: int) -> None:
        """The job has ended and its end alerts are stored: nothing more to watch."""
        self.db.execute("DELETE FROM watches WHERE job_id=?", (job_id,))

    def end_alerts_due(self, job_id: int) -> None:
        """In the transaction that ends the job: its watch stays until it has stored the job's end alerts
        (it starts afresh where the watch of a job that never ran is missing)."""
        self.db.execute("INSERT OR IGNORE INTO watches (job_id, state) VALUES (?, '{}')", (job_id,))

    def watched_jobs(self) -> set[int]:
        """Jobs whose watch has a row: running ones, and ended ones whose end alerts are not stored yet."""
        return {job_id for (job_id,) in self.db.execute("SELECT job_id FROM watches")}

    # -- the outbox: alerts, and their deliveries to each URL ----------------------------------------------

    def add_alert(self, alert: NewAlert, cooldown: float, expire: float) -> Optional[int]:
        """Store an alert and one pending delivery per URL, in one transaction; None (nothing stored) when
        the same job and rule alerted less than `cooldown` ago. Deliveries give up `expire` from now."""
        with self.transaction():
            recent = self.db.execute(
                "SELECT 1 FROM alerts WHERE job_id IS ? AND rule=? AND at > ? LIMIT 1",
                (alert.job_id, alert.rule, alert.at - cooldown),
            ).fetchone()
            if recent:
                return None
            cur = self.db.execute(
                "INSERT INTO alerts (job_id, rule, at, summary, body) VALUES (?,?,?,?,?)",
                (alert.job_id, alert.rule, alert.at, alert.summary, alert.body),
            )
            alert_id = int(cur.lastrowid or 0)
            now = time.time()
            for url, target in alert.targets.items():
                self.db.execute(
                    "INSERT INTO deliveries (alert_id, url, target, state, next_at, expires_at) VALUES (?,?,?,?,?,?)",
                    (alert_id, url, target, PENDING, now, now + expire),
                )
        return alert_id

    def retry_all_now(self) -> None:
        """Make every pending delivery due now."""
        self.db.execute("UPDATE deliveries SET next_at=? WHERE state=?", (time.time(), PENDING))

    def due_deliveries(self) -> list[DueDelivery]:
        """The pending deliveries whose time has come, oldest first."""
        rows = self.db.execute(
            "SELECT d.id, d.url, d.attempts, d.expires_at, a.rule, a.summary, a.body FROM deliveries d "
            "JOIN alerts a ON a.id = d.alert_id WHERE d.state=? AND d.next_at <= ? ORDER BY d.id",
            (PENDING, time.time()),
        )
        return [DueDelivery(*row) for row in rows]

    def next_delivery_at(self) -> Optional[float]:
        """When the next pending delivery is due; None when none is pending."""
        at: Optional[float] = self.db.execute(
            "SELECT min(next_at) FROM deliveries WHERE state=?", (PENDING,)
        ).fetchone()[0]
        return at

    def delivered(self, delivery_id: int, attempts: int, at: float) -> None:
        self.db.execute(
            "UPDATE deliveries SET state=?, attempts=?, sent_at=?, error=NULL WHERE id=?",
            (SENT, attempts, at, delivery_id),
        )

    def delivery_failed(self, delivery_id: int, attempts: int, error: str, retry_at: float, expired: bool) -> None:
        """Record a failed attempt: the delivery is tried again at `retry_at`, or never again if `expired`."""
        self.db.execute(
            "UPDATE deliveries SET state=?, attempts=?, next_at=?, error=? WHERE id=?",
            (EXPIRED if expired else PENDING, attempts, retry_at, error, delivery_id),
        )

    def alerts(self, job_id: Optional[int], limit: int) -> list[Alert]:
        """The newest `limit` alerts (of one job, or all), oldest first, with their deliveries."""
        where, params = ("WHERE job_id=?", (job_id,)) if job_id is not None else ("", ())
        rows = self.db.execute(
            f"SELECT id, job_id, rule, at, summary, body FROM alerts {where} ORDER BY id DESC LIMIT ?",
            (*params, limit),
        ).fetchall()
        return [
            Alert(
                id=alert_id,
                job_id=job,
                rule=rule,
                at=at,
                summary=summary,
                body=body,
                deliveries=self._deliveries(alert_id),
            )
            for alert_id, job, rule, at, summary, body in reversed(rows)
        ]

    def _deliveries(self, alert_id: int) -> list[Delivery]:
        rows = self.db.execute(
            "SELECT target, state, attempts, sent_at, error, next_at FROM deliveries WHERE alert_id=? ORDER BY id",
            (alert_id,),
        )
        return [
            Delivery(target=t, state=s, attempts=n, sent_at=sent, error=e, next_at=nxt if s == PENDING else None)
            for t, s, n, sent, e, nxt in rows
        ]

    # -- the jobs again: `list` is a method's name from here on, so no annotation below says list[...] ------

    def list(self, include_final: bool) -> list[JobRow]:
        """Every job, or the unfinished ones, by id. Of the unfinished, only the rows written since the last
        list are read again: the monitor, the alert watch and the scheduler ask for them many times a
        second, and 1,000 queued jobs took 20 ms to read and decode."""
        if include_final:
            return self._read_list(include_final)
        if self._unfinished is None:
            self._unfinished = {row.id: row for row in self._read_list(include_final)}
            self._listed, self._stale = list(self._unfinished.values()), set()
        elif self._stale:
            for job_id in self._stale:  # only the rows written since: a write costs one row read, not all
                row = self.get(job_id)
                if row is None or row.final:
                    self._unfinished.pop(job_id, None)
                else:
                    self._unfinished[job_id] = row
            self._listed, self._stale = [self._unfinished[k] for k in sorted(self._unfinished)], set()
        return list(self._listed)

    def counts(self) -> dict[str, int]:
        counts = dict.fromkeys(JobState.ALL, 0)
        for state, n in self.db.execute("SELECT state, count(*) FROM jobs GROUP BY state"):
            counts[state] = n
        return counts


def _refuse_empty_beside_jobs(path: Path, jobs_dir: Path) -> None:
    """An empty database file (0 bytes: a crash or a full disk can leave one) beside job folders is refused, not
    started over: SQLite would make it a new database, and the history of every job in the folders would be
    gone from every verb without a word. Rebuilding the rows from the folders is not offered: they hold what the
    shim ran and how it ended, not the job's spec (its name, alert rules and URLs, restart policy, array).
    A missing file is a new start (what "move it aside" asks for); an empty one beside no job folder too."""
    try:
        empty = path.stat().st_size == 0
    except FileNotFoundError:
        return
    if not empty:
        return
    try:
        folders = sum(1 for entry in os.scandir(jobs_dir) if is_digits(entry.name) and entry.is_dir())
    except FileNotFoundError:
        return
    if folders:
        raise StoreError(
            f"{path} is empty (0 bytes: a crash or a full disk left it) while {jobs_dir} holds {folders} job "
            "folder(s) it recorded; restore it from a backup, or move it aside to start afresh (the folders "
            "stay, and new jobs take new ids)"
        )


def _row(row: sqlite3.Row) -> JobRow:
    values = dict(zip(_COLUMNS, row))
    values["spec"] = from_json(values["spec"])
    values["gpus"] = None if values["gpus"] is None else json.loads(values["gpus"])
    return JobRow(**values)
