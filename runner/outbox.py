"""The outbox: every alert is written to the database first, then delivered through apprise in the
background, retried with backoff until it is sent or expires, across daemon restarts.

Apprise speaks to mail servers, Slack, and a hundred other services, each named by a URL; the URLs hold
passwords and tokens. They stay in the daemon's database and config: what leaves the daemon (replies to
clients, its own log, the error texts it keeps) shows them masked, as apprise itself masks them.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import functools
import logging
import re
import time
import urllib.parse
from typing import Any, Optional

from tfrun.protocol import Alert, Delivery
from tfrun.runner.store import Store

log = logging.getLogger("tfrund")

PENDING, SENT, EXPIRED, FAILED = "pending", "sent", "expired", "failed"
FIRST_RETRY_S = 2.0
MAX_RETRY_S = 300.0
SEND_TIMEOUT_S = 60.0  # apprise's own timeouts are shorter; this only bounds a plugin that hangs


def _apprise() -> Any:
    """apprise, imported on first use (about half a second: it loads every plugin) and made quiet: its log
    lines can name URLs, and the daemon's log must never show a secret."""
    import apprise

    quiet = logging.getLogger("apprise")
    quiet.propagate = False
    quiet.addHandler(logging.NullHandler())
    return apprise


def _plugin(url: str) -> Any:
    """apprise's notifier for `url`, or None when apprise cannot use it."""
    try:
        return _apprise().Apprise.instantiate(url)
    except Exception:  # a plugin that chokes on a URL must not take its secrets into a traceback
        return None


def usable(url: str) -> bool:
    return _plugin(url) is not None


@functools.lru_cache(maxsize=256)
def masked(url: str) -> str:
    """`url` with its secrets masked (apprise's privacy form, less its query of settings); unknown kinds of
    URL show only their scheme."""
    plugin = _plugin(url)
    if plugin is None:
        scheme = url.partition("://")[0] if "://" in url else ""
        return f"{scheme}://…" if scheme.isalnum() else "(not a URL)"
    return str(plugin.url(privacy=True)).split("?", 1)[0]


def secret_parts(url: str) -> list[str]:
    """The pieces of `url` that its masked form hides: the strings to scrub from anything said about it."""
    shown = masked(url)
    pieces = set()
    for piece in re.split(r"[/:@?&=#,]+", url.partition("://")[2]):
        for form in {piece, urllib.parse.unquote(piece)}:
            if len(form) >= 3 and form not in shown:
                pieces.add(form)
    return sorted(pieces, key=len, reverse=True)


def scrub(text: str, urls: list[str]) -> str:
    """`text` with every secret of `urls` in it replaced by ****."""
    for url in urls:
        for piece in secret_parts(url):
            text = text.replace(piece, "****")
    return text


def title(rule: str, summary: str) -> str:
    """A message's subject: the rule first, so a mail filter or a Slack search can sort on it."""
    return f"[tfrun {rule}] {summary}"


class _Collect(logging.Handler):
    """What apprise says while it sends one message: the reason when it fails."""

    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(record.getMessage())


def send(url: str, title: str, body: str) -> Optional[str]:
    """Send one message to one URL (blocking); None when it was sent, else why not (secrets masked)."""
    apprise = _apprise()
    collect = _Collect()
    logger = logging.getLogger("apprise")
    logger.addHandler(collect)
    try:
        notifier = apprise.Apprise()
        if not notifier.add(url):
            return f"apprise cannot use this URL ({masked(url)}): unknown kind of service or a malformed URL"
        if notifier.notify(body=body, title=title):
            return None
        reason = "; ".join(dict.fromkeys(collect.lines)) or "the service refused it"
    except Exception as exc:
        reason = f"{type(exc).__name__}: {exc}"
    finally:
        logger.removeHandler(collect)
    return scrub(reason, [url])[:500]


class Outbox:
    def __init__(self, store: Store, cooldown: float, expire: float) -> None:
        self.store = store
        self.cooldown = cooldown
        self.expire = expire
        self._wake: Optional[asyncio.Event] = None
        # One sender thread: deliveries go out one at a time, and apprise's log is read per message.
        self._sender = concurrent.futures.ThreadPoolExecutor(max_workers=1, thread_name_prefix="tfrund-notify")

    def record(
        self, job_id: Optional[int], rule: str, summary: str, body: str, urls: list[str], at: Optional[float] = None
    ) -> Optional[int]:
        """Store an alert and one delivery per URL, in one transaction, before anything is sent. None when
        the same job and rule alerted less than the cooldown ago: one incident, one message."""
        at = time.time() if at is None else at
        db = self.store.db
        db.execute("BEGIN IMMEDIATE")
        try:
            recent = db.execute(
                "SELECT 1 FROM alerts WHERE job_id IS ? AND rule=? AND at > ? LIMIT 1",
                (job_id, rule, at - self.cooldown),
            ).fetchone()
            if recent:
                db.execute("COMMIT")
                return None
            cur = db.execute(
                "INSERT INTO alerts (job_id, rule, at, summary, body) VALUES (?,?,?,?,?)",
                (job_id, rule, at, summary, body),
            )
            alert_id = int(cur.lastrowid or 0)
            now = time.time()
            for url in dict.fromkeys(urls):
                db.execute(
                    "INSERT INTO deliveries (alert_id, url, target, state, next_at, expires_at) VALUES (?,?,?,?,?,?)",
                    (alert_id, url, masked(url), PENDING, now, now + self.expire),
                )
            db.execute("COMMIT")
        except BaseException:
            db.execute("ROLLBACK")
            raise
        log.info("alert %d: %s: %s (%d URL(s))", alert_id, rule, summary, len(urls))
        if self._wake is not None:
            self._wake.set()
        return alert_id

    async def run(self) -> None:
        """Deliver what is due, forever; at start, everything pending is due (a restart is a good time to retry)."""
        self._wake = asyncio.Event()
        self.store.db.execute("UPDATE deliveries SET next_at=? WHERE state=?", (time.time(), PENDING))
        loop = asyncio.get_running_loop()
        loop.run_in_executor(self._sender, usable, "json://localhost")  # load apprise's plugins now (0.5 s)
        while True:
            due = self.store.db.execute(
                "SELECT d.id, d.url, d.attempts, d.expires_at, a.rule, a.summary, a.body FROM deliveries d "
                "JOIN alerts a ON a.id = d.alert_id WHERE d.state=? AND d.next_at <= ? ORDER BY d.id",
                (PENDING, time.time()),
            ).fetchall()
            for delivery_id, url, attempts, expires_at, rule, summary, body in due:
                await self._deliver(delivery_id, url, attempts, expires_at, title(rule, summary), body)
            row = self.store.db.execute("SELECT min(next_at) FROM deliveries WHERE state=?", (PENDING,)).fetchone()
            wait = MAX_RETRY_S if row[0] is None else max(0.0, row[0] - time.time())
            self._wake.clear()
            if wait > 0:
                with contextlib.suppress(asyncio.TimeoutError):
                    await asyncio.wait_for(self._wake.wait(), wait)

    async def _deliver(
        self, delivery_id: int, url: str, attempts: int, expires_at: float, title: str, body: str
    ) -> None:
        loop = asyncio.get_running_loop()
        try:
            error = await asyncio.wait_for(loop.run_in_executor(self._sender, send, url, title, body), SEND_TIMEOUT_S)
        except asyncio.TimeoutError:
            error = f"no answer in {SEND_TIMEOUT_S:g} s"
        now = time.time()
        attempts += 1
        if error is None:
            self.store.db.execute(
                "UPDATE deliveries SET state=?, attempts=?, sent_at=?, error=NULL WHERE id=?",
                (SENT, attempts, now, delivery_id),
            )
            log.info("delivery %d: sent to %s", delivery_id, masked(url))
            return
        retry_at = now + min(MAX_RETRY_S, FIRST_RETRY_S * 2 ** (attempts - 1))
        state = EXPIRED if retry_at > expires_at else PENDING
        self.store.db.execute(
            "UPDATE deliveries SET state=?, attempts=?, next_at=?, error=? WHERE id=?",
            (state, attempts, retry_at, error, delivery_id),
        )
        log.warning("delivery %d to %s failed (attempt %d, %s): %s", delivery_id, masked(url), attempts, state, error)

    async def test(self, urls: list[str], title: str, body: str) -> list[Delivery]:
        """Send one message to each URL now, and say how each went; nothing is stored or retried."""
        loop = asyncio.get_running_loop()
        results = []
        for url in urls:
            error = await loop.run_in_executor(self._sender, send, url, title, body)
            results.append(
                Delivery(target=masked(url), state=SENT if error is None else FAILED, attempts=1, error=error)
            )
        return results

    def alerts(self, job_id: Optional[int], limit: int) -> list[Alert]:
        """The newest `limit` alerts (of one job, or all), oldest first, with their deliveries."""
        where, params = ("WHERE job_id=?", (job_id,)) if job_id is not None else ("", ())
        rows = self.store.db.execute(
            f"SELECT id, job_id, rule, at, summary, body FROM alerts {where} ORDER BY id DESC LIMIT ?",
            (*params, limit),
        ).fetchall()
        out = []
        for alert_id, job, rule, at, summary, body in reversed(rows):
            deliveries = [
                Delivery(target=t, state=s, attempts=n, sent_at=sent, error=e, next_at=nxt if s == PENDING else None)
                for t, s, n, sent, e, nxt in self.store.db.execute(
                    "SELECT target, state, attempts, sent_at, error, next_at FROM deliveries WHERE alert_id=? "
                    "ORDER BY id",
                    (alert_id,),
                )
            ]
            out.append(
                Alert(id=alert_id, job_id=job, rule=rule, at=at, summary=summary, body=body, deliveries=deliveries)
            )
        return out
