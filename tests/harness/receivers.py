"""Where alerts go in tests: a real SMTP server (aiosmtpd, `Mailbox`), an HTTP receiver of json:// posts
(`Receiver`), and proxies that keep a real service's URL from leaving this machine (`no_internet`)."""

from __future__ import annotations

import json
import time
from typing import Any, Optional

from .processes import free_port


class Mailbox:
    """A real SMTP server (aiosmtpd) on 127.0.0.1 that keeps what it receives; it can be stopped and started
    again on the same port, as a mail server that goes down and comes back."""

    def __init__(self, port: Optional[int] = None) -> None:
        self.port = port or free_port()
        self.messages: list[Any] = []  # email.message.EmailMessage, in arrival order
        self.arrived: list[float] = []  # when each one's data was in (time.time())
        self.controller: Optional[Any] = None

    @property
    def url(self) -> str:
        return f"mailto://127.0.0.1:{self.port}?from=tfrund@example.com&to=ml-team@example.com"

    def start(self) -> None:
        import email
        import email.policy

        from aiosmtpd.controller import Controller

        box = self

        class Handler:
            async def handle_DATA(self, server: Any, session: Any, envelope: Any) -> str:
                box.arrived.append(time.time())
                box.messages.append(email.message_from_bytes(envelope.content, policy=email.policy.default))
                return "250 OK"

        self.controller = Controller(Handler(), hostname="127.0.0.1", port=self.port)
        self.controller.start()

    def stop(self) -> None:
        if self.controller is not None:
            self.controller.stop()
            self.controller = None

    def texts(self) -> list[tuple[str, str]]:
        """(subject, plain-text body) of each message received."""
        out = []
        for message in self.messages:
            body = message.get_body(preferencelist=("plain",))
            out.append((str(message["Subject"]), body.get_content() if body is not None else ""))
        return out


class Receiver:
    """A real HTTP server on 127.0.0.1 that keeps the JSON bodies POSTed to it: what apprise's json:// sends."""

    def __init__(self) -> None:
        import http.server
        import threading

        receiver = self
        self.posts: list[dict[str, Any]] = []

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                length = int(self.headers.get("Content-Length", 0))
                receiver.posts.append(json.loads(self.rfile.read(length) or b"{}"))
                self.send_response(200)
                self.end_headers()

            def log_message(self, format: str, *args: Any) -> None:
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.port = self.server.server_address[1]
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    @property
    def url(self) -> str:
        return f"json://127.0.0.1:{self.port}/alerts"

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def no_internet(env: dict[str, str]) -> None:
    """Send any web request a daemon started with `env` makes to a dead port on loopback, so a test that
    names a real service (Slack) never reaches beyond this machine; loopback itself stays direct."""
    dead = f"http://127.0.0.1:{free_port()}"
    env.update(HTTP_PROXY=dead, HTTPS_PROXY=dead, http_proxy=dead, https_proxy=dead)
    env.update(NO_PROXY="127.0.0.1,localhost", no_proxy="127.0.0.1,localhost")
