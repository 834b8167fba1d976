"""The outbox: every alert is written to the database first, then delivered through apprise in the
background, retried with backoff until it is sent or expires, across daemon restarts.

Apprise speaks to mail servers, Slack, and a hundred other services, each named by a URL; the URLs hold
passwords and tokens. They stay in the daemon's database and config: what leaves the daemon (replies to
clients, its own log, the error texts it keeps) shows them masked past their scheme and host (`masked`).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import difflib
import functools
import hashlib
import logging
import re
import ssl
import time
import urllib.parse
from pathlib import Path
from typing import Any, Optional

from tfrun.protocol.watching import Delivery
from tfrun.shorten import shorten

from ..records.store import EXPIRED, PENDING, SENT, NewAlert, Store
from . import alerttext

log = logging.getLogger("tfrund")

FAILED = "failed"  # a test message's state when it was not sent (stored deliveries: runner/records/store.py)
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
    _reuse_tls_context()
    return apprise


class ReusedContext:
    """Stands for the `ssl` module in apprise's SMTP plugin, which makes a new default TLS context for every
    mail, plain SMTP included: loading the system's certificates took 15 to 30 ms of the 20 to 45 a mail cost
    (20 mails to the tests' aiosmtpd: 0.37 to 0.42 s without it, 0.06 s with it). It hands out one context,
    made once, with certificate and host checks turned on again each time (the plugin turns them off on the
    context it was given for a URL that says so); everything else is the module's. Safe because mail goes out
    one message at a time (the outbox's one sender thread), and because the plugin does nothing else to its
    context, which holds for the plugin this was checked against (REVIEWED_SMTP_PLUGINS) and no other."""

    def __init__(self, module: Any) -> None:
        self._module = module
        self._context: Any = None

    def __getattr__(self, name: str) -> Any:
        return getattr(self._module, name)

    def create_default_context(self, *args: Any, **kwargs: Any) -> Any:
        if args or kwargs:
            return self._module.create_default_context(*args, **kwargs)
        if self._context is None:
            self._context = self._module.create_default_context()
        self._context.verify_mode = self._module.CERT_REQUIRED
        self._context.check_hostname = True
        return self._context


# SHA-256 of apprise/plugins/email/smtp.py where ReusedContext was checked against it: apprise 2.0.0 to 2.3.0
# (the same file). Its one use of `ssl` is AppriseSMTPController.__enter__: `ssl.create_default_context()` for
# each mail, checks off for verify=no, the context handed to smtplib. apprise has no hook for the context (no
# parameter, no attribute, no caching of its own; a subclass of its mail plugin would copy its send()).
REVIEWED_SMTP_PLUGINS = frozenset({"f8ec0083bf8d29b430ab025d6593110d4bdc3a7be7080c105ce8500a30c7e61c"})


def reviewed(source: bytes) -> bool:
    """Whether `source` is an SMTP plugin ReusedContext was checked against, byte for byte."""
    return hashlib.sha256(source).hexdigest() in REVIEWED_SMTP_PLUGINS


@functools.cache
def _reuse_tls_context() -> bool:
    """Put ReusedContext in apprise's SMTP plugin where the plugin is one it was checked against; elsewhere
    leave apprise alone (each mail then pays for its own context), say so once in the daemon's log, and
    return False. The file's hash, not a version pin: a pin would hold back apprise's fixes for a hundred
    services over 15 ms a mail, and holds for a version, not for the code read (a distribution's patched
    apprise). tests/test_alert_delivery.py fails on any other plugin, so that an apprise upgrade gets this
    read again rather than one context shared where a newer plugin configures it per URL."""
    try:
        from apprise.plugins.email import smtp

        fits = reviewed(Path(smtp.__file__).read_bytes())
    except (ImportError, OSError, TypeError):  # no such plugin, or no source beside it
        fits = False
    if not fits:
        log.info("apprise's SMTP plugin is not one tfrun was checked against: each mail makes its own TLS context")
        return False
    smtp.ssl = ReusedContext(ssl)  # type: ignore[assignment,attr-defined]
    return True


def _plugin(url: str) -> Any:
    """apprise's notifier for `url`, or None when apprise cannot use it."""
    try:
        return _apprise().Apprise.instantiate(url)
    except Exception:  # a plugin that chokes on a URL must not take its secrets into a traceback
        return None


def usable(url: str) -> bool:
    return _plugin(url) is not None


_HOSTNAME = re.compile(r"(localhost|\[[0-9A-Fa-f:.]+\]|[A-Za-z0-9-]+(\.[A-Za-z0-9-]+)+)(:[0-9]+)?")
MASK = "***"


@functools.lru_cache(maxsize=256)
def masked(url: str) -> str:
    """`url` as it may be shown: its scheme and host, everything else (user, password, path, query) masked,
    json://hooks.example.com/***, mailto://***@smtp.example.com?***. Apprise's own privacy form is not
    enough: it shows a json:// or xml:// path, an ntfy topic, whole, and those are the secret. A "host" that
    is no host name (slack://TOKEN/..., ntfy://TOPIC) is masked too."""
    scheme, sep, rest = url.partition("://")
    if not sep or not re.fullmatch(r"[A-Za-z][A-Za-z0-9+.-]*", scheme):
        return "(not a URL)"
    netloc, tail = re.match(r"([^/?#]*)(.*)", rest, re.S).groups()  # type: ignore[union-attr]
    _, at, host = netloc.rpartition("@")
    head = f"{scheme}://{MASK + '@' if at else ''}{host if _HOSTNAME.fullmatch(host) else MASK}"
    path, query, _ = tail.partition("?")
    return head + (f"/{MASK}" if path.strip("/") else "") + (f"?{MASK}" if query else "")


def shown_url(url: str, secrets: bool) -> str:
    """`url` whole where its own user asked for it (`tfrun config --show-secrets`), else masked."""
    return url if secrets else masked(url)


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


# -- why a URL is refused -------------------------------------------------------------------------------------

_MAILTO_FORM = "://USER:PASSWORD@SMTP_HOST[:PORT]?from=ADDRESS&to=ADDRESS"  # after mailto or mailtos
_SERVICES = "https://github.com/caronc/apprise/wiki"


def diagnose(url: str) -> str:
    """Why apprise cannot use `url`, in words its owner can act on; never a secret of it. tfrun's own checks
    name what is missing for the common services; for the rest, apprise's own complaint, scrubbed."""
    scheme, sep, _ = url.partition("://")
    if not sep or not re.fullmatch(r"[A-Za-z][A-Za-z0-9+.-]*", scheme):
        return f"not a URL: expected SERVICE://..., such as mailto{_MAILTO_FORM} (the services: {_SERVICES})"
    scheme = scheme.lower()
    if scheme in ("http", "https"):
        return (
            f"apprise takes {scheme}:// only as a service's own web address (such as a Slack webhook's); "
            "to POST to any web server, write json://HOST/PATH (or jsons:// for https)"
        )
    known = _apprise().NotificationManager().schemas()
    if scheme not in known:
        near = difflib.get_close_matches(scheme, known, n=1)
        hint = f"; did you mean {near[0]}://?" if near else f" (the services: {_SERVICES})"
        return f"no service called {scheme}:// in apprise{hint}"
    try:
        parts = urllib.parse.urlsplit(url)
    except ValueError as exc:  # a bracket that opens an IPv6 address and never closes it
        return f"this {scheme}:// URL cannot be parsed ({exc})"
    query = urllib.parse.parse_qs(parts.query)
    if scheme in ("mailto", "mailtos"):
        if not parts.hostname and not parts.username:
            return f"{scheme}:// needs the mail server: {scheme}{_MAILTO_FORM}"
        if "from" not in query and not parts.username:
            return (
                f"{scheme}:// needs a sender: add from=ADDRESS ({scheme}://SMTP_HOST?from=you@example.com&to=ADDRESS), "
                "or log in as USER@SMTP_HOST, whose address is then the sender"
            )
    if scheme == "slack":
        tokens = [piece for piece in f"{parts.netloc}{parts.path}".split("/") if piece and piece[0] not in "#@"]
        if not (tokens and tokens[0].startswith("xox")) and len(tokens) < 3:
            return (
                f"{scheme}:// needs three tokens, {scheme}://TOKEN_A/TOKEN_B/TOKEN_C/#CHANNEL (the three parts "
                f"after https://hooks.slack.com/services/ in a webhook's address), or a bot token, "
                f"{scheme}://xoxb-TOKEN/#CHANNEL; this URL has {len(tokens)}"
            )
    if not parts.netloc:
        return f"{scheme}:// needs more after the ://: a host, or the service's tokens (its page: {_SERVICES})"
    reason = _apprise_reason(url)
    if scheme in ("mailto", "mailtos") and "~From~" in reason:
        return (
            f"{scheme}:// has no valid sender: add from=you@example.com (without it the sender is "
            "USER@SMTP_HOST, which must be a mail address)"
        )
    return reason or f"apprise cannot use this {scheme}:// URL (its page: {_SERVICES})"


def _apprise_reason(url: str) -> str:
    """What apprise says when it refuses `url` (its exception, or what it logs), with every piece of the URL
    masked: apprise's messages quote the values they refuse, tokens and addresses included."""
    collect = _Collect()
    logger = logging.getLogger("apprise")
    logger.addHandler(collect)
    try:
        _apprise().Apprise.instantiate(url, suppress_exceptions=False)
        said = [line for line in collect.lines if not line.startswith("Could not load")]
    except Exception as exc:
        said = [str(exc)]
    finally:
        logger.removeHandler(collect)
    reason = scrub(" ".join(said[-1].split()), [url]) if said else ""
    return f"apprise says: {reason}" if reason else ""


def send(url: str, title: str, body: str) -> Optional[str]:
    """Send one message to one URL (blocking); None when it was sent, else why not (secrets masked). The
    body goes in the format the service reads (the URL's format= or the service's first: HTML for mail,
    Markdown for Slack, text for json://), made from the stored text by runner/alerts/alerttext.py, so apprise
    converts nothing: its own conversion of text to a mail's parts joins the lines."""
    plugin = _plugin(url)
    if plugin is None:
        return diagnose(url)
    form = plugin.resolve_format()
    collect = _Collect()
    logger = logging.getLogger("apprise")
    logger.addHandler(collect)
    try:
        notifier = _apprise().Apprise()
        notifier.add(plugin)
        if notifier.notify(body=alerttext.render(body, form.value), title=title, body_format=form):
            return None
        reason = "; ".join(dict.fromkeys(collect.lines)) or "the service refused it"
    except Exception as exc:
        reason = f"{type(exc).__name__}: {exc}"
    finally:
        logger.removeHandler(collect)
    return shorten(scrub(reason, [url]), 500)


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
        targets = {url: masked(url) for url in urls}
        alert_id = self.store.add_alert(NewAlert(job_id, rule, at, summary, body, targets), self.cooldown, self.expire)
        if alert_id is None:
            return None
        log.info("alert %d: %s: %s (%d URL(s))", alert_id, rule, summary, len(urls))
        if self._wake is not None:
            self._wake.set()
        return alert_id

    async def run(self) -> None:
        """Deliver what is due, forever; at start, everything pending is due (a restart is a good time to retry)."""
        self._wake = asyncio.Event()
        self.store.retry_all_now()
        loop = asyncio.get_running_loop()
        loop.run_in_executor(self._sender, usable, "json://localhost")  # load apprise's plugins now (0.5 s)
        while True:
            for due in self.store.due_deliveries():
                await self._deliver(
                    due.id, due.url, due.attempts, due.expires_at, title(due.rule, due.summary), due.body
                )
            next_at = self.store.next_delivery_at()
            wait = MAX_RETRY_S if next_at is None else max(0.0, next_at - time.time())
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
            self.store.delivered(delivery_id, attempts, now)
            log.info("delivery %d: sent to %s", delivery_id, masked(url))
            return
        retry_at = now + min(MAX_RETRY_S, FIRST_RETRY_S * 2 ** (attempts - 1))
        expired = retry_at > expires_at
        self.store.delivery_failed(delivery_id, attempts, error, retry_at, expired)
        state = EXPIRED if expired else PENDING
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
