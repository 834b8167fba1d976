"""Who may use a `tfrun ui`: the user who started it, in their own browser, and no one else.

127.0.0.1 keeps the network out, not the other users of the machine (a shared laptop, a login node), nor a
web page in the user's own browser that sends requests to 127.0.0.1 or rebinds a name of its own to it. So:

- a connection is admitted only if the kernel says its peer is this user's (client/link/loopback.py, as `tfrun
  forward` admits them), else closed before a byte is read;
- every request needs the run's secret: given once in the URL `tfrun ui` prints (`/?key=SECRET`), it is
  exchanged for an HttpOnly, SameSite=Strict cookie and the browser sent on to the URL without it (out of the
  history and the address bar); the secret is made here, so it is on no command line;
- the Host header must name this server (127.0.0.1:PORT or localhost:PORT): a page of another site whose name
  was rebound to 127.0.0.1 sends its own name;
- a request that changes something (not GET) needs an Origin header of this server (no cross-site form or
  fetch can cancel a job); no CORS header is ever sent, so no other origin reads a reply.
"""

from __future__ import annotations

import hmac
import os
import secrets
from collections.abc import Awaitable
from typing import Any, Callable

from aiohttp import web

from ..link import loopback

KEY_PARAM = "key"
Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


class Guard:
    """The secret of one run of `tfrun ui` on `port`, and the checks every connection and request pass."""

    def __init__(self, port: int, warn: Callable[[str], None]) -> None:
        self.port = port
        self.secret = secrets.token_urlsafe(32)
        self.cookie = f"tfrun-ui-{port}"  # cookies are per host, not per port: two servers, two names
        self.hosts = {f"127.0.0.1:{port}", f"localhost:{port}"}
        self.origins = {f"http://{host}" for host in self.hosts}
        self.warn = warn
        self.strangers: set[Any] = set()

    def url(self) -> str:
        """The URL to open: the only place the secret is ever written (stdout, or the --open page's file)."""
        return f"http://127.0.0.1:{self.port}/?{KEY_PARAM}={self.secret}"

    def admitted(self, sock: Any) -> bool:
        """Whether a new connection comes from this user (where the kernel can say); told once per stranger."""
        if not loopback.can_tell():
            return True
        uid = loopback.peer_uid(sock)
        if uid == os.geteuid():
            return True
        if uid not in self.strangers:
            self.strangers.add(uid)
            who = "a socket the kernel does not list" if uid is None else f"uid {uid}, not you"
            self.warn(f"refused a connection to 127.0.0.1:{self.port} from {who}: only you may use this page")
        return False

    @web.middleware
    async def check(self, request: web.Request, handler: Handler) -> web.StreamResponse:
        """Every request: the Host, then the Origin of an action, then the secret (in the URL once, then the
        cookie). A refusal is 403 with one line saying why, and nothing of the page."""
        if request.headers.get("Host") not in self.hosts:
            return _refused("this server answers only as 127.0.0.1 or localhost on its own port")
        if request.method != "GET" and request.headers.get("Origin") not in self.origins:
            return _refused("an action must come from this server's own page")
        given = request.query.get(KEY_PARAM)
        if given is not None:
            if not hmac.compare_digest(given.encode(), self.secret.encode()):
                return _refused("wrong key: open the URL `tfrun ui` printed")
            return self._exchanged(request)
        cookie = request.cookies.get(self.cookie, "")
        if not hmac.compare_digest(cookie.encode(), self.secret.encode()):
            return _refused("no key: open the URL `tfrun ui` printed (its key is asked once, then kept by the browser)")
        response = await handler(request)
        response.headers["Cache-Control"] = "no-store"
        response.headers["X-Content-Type-Options"] = "nosniff"
        response.headers["Referrer-Policy"] = "no-referrer"
        return response

    def _exchanged(self, request: web.Request) -> web.StreamResponse:
        """The secret as a cookie, and the same URL without it: the address bar and history keep no key."""
        query = [(name, value) for name, value in request.query.items() if name != KEY_PARAM]
        response = web.Response(status=303, headers={"Location": request.rel_url.with_query(query).path_qs})
        response.set_cookie(self.cookie, self.secret, httponly=True, samesite="Strict", path="/")
        response.headers["Cache-Control"] = "no-store"
        response.headers["Referrer-Policy"] = "no-referrer"
        return response


def _refused(why: str) -> web.Response:
    return web.Response(status=403, text=f"tfrun ui: refused: {why}\n", headers={"Cache-Control": "no-store"})
