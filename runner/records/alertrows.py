"""The store's alert tables: a job's alert rules and URLs (job_alerts), where the alert watch over it stands
(watches), and the outbox (alerts, deliveries): every alert stored before anything is sent, and its way to each
URL. Store (runner/records/store.py) is AlertRows too, so each table's SQL is written once, beside its kin.
"""

from __future__ import annotations

import contextlib
import json
import logging
import sqlite3
import time
from collections.abc import Callable
from typing import Any, NamedTuple, Optional

from tfrun.protocol.watching import Alert, Delivery

from .schema import IDS_PER_STATEMENT

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


class AlertRows:
    """The alert tables' SQL, on the connection and in the transactions of the Store it is part of."""

    db: sqlite3.Connection
    transaction: Callable[[], contextlib.AbstractContextManager[None]]

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
