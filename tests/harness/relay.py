"""A TCP relay on 127.0.0.1 that can freeze its connections without closing them: a link that dies silently.

A laptop that sleeps, a Wi-Fi or VPN change, a NAT that forgets an idle flow: nothing sends a FIN or an RST,
packets just stop. The relay stands for such a link between tfrun and a test's sshd. `freeze_held()` stops
every byte of the connections it holds (nothing passes, nothing closes) while new connections pass;
`freeze_all()` stops new connections too (they are taken but get nothing, as behind a dead link the SYN
that got through would); `resume()` lets everything flow again, held bytes included. No root is needed.

Each direction of a connection is a thread that reads a chunk, then waits for the link to be up before it
passes it on: while frozen, the reader holds one chunk and the kernel's buffers fill, so the far end's
writes stall as they would on a dead link, and its reads see nothing.
"""

from __future__ import annotations

import contextlib
import socket
import threading
from typing import Optional


class _Link:
    """One relayed connection: both sockets, and whether bytes may pass."""

    def __init__(self, near: socket.socket, frozen: bool) -> None:
        self.near = near
        self.far: Optional[socket.socket] = None
        self.up = threading.Event()
        if not frozen:
            self.up.set()

    def close(self) -> None:
        for sock in (self.near, self.far):
            if sock is not None:
                with contextlib.suppress(OSError):
                    sock.close()


class Relay:
    """Listens on 127.0.0.1 (its `port`) and relays each connection to 127.0.0.1:`target`."""

    def __init__(self, target: int) -> None:
        self.target = target
        self.server = socket.socket()
        self.server.bind(("127.0.0.1", 0))
        self.server.listen(64)
        self.port = int(self.server.getsockname()[1])
        self.links: list[_Link] = []
        self.all_frozen = False
        self.lock = threading.Lock()
        self.closed = False
        threading.Thread(target=self._accept, daemon=True).start()

    def freeze_held(self) -> int:
        """Nothing passes on the connections held now; new ones pass. Returns how many were frozen."""
        with self.lock:
            held = [link for link in self.links if link.up.is_set()]
            for link in held:
                link.up.clear()
            return len(held)

    def freeze_all(self) -> None:
        """Nothing passes on any connection, held or new, until `resume`."""
        with self.lock:
            self.all_frozen = True
            for link in self.links:
                link.up.clear()

    def resume(self) -> None:
        """Everything flows again, the bytes held meanwhile first."""
        with self.lock:
            self.all_frozen = False
            for link in self.links:
                link.up.set()

    def close(self) -> None:
        self.closed = True
        with contextlib.suppress(OSError):
            self.server.close()
        with self.lock:
            for link in self.links:
                link.up.set()
                link.close()

    def _accept(self) -> None:
        while not self.closed:
            try:
                near, _ = self.server.accept()
            except OSError:
                return
            with self.lock:
                link = _Link(near, self.all_frozen)
                self.links.append(link)
            threading.Thread(target=self._serve, args=(link,), daemon=True).start()

    def _serve(self, link: _Link) -> None:
        """Connect onward once the link is up (a connection taken while all is frozen waits), then pump."""
        link.up.wait()
        try:
            link.far = socket.create_connection(("127.0.0.1", self.target))
        except OSError:
            link.close()
            return
        threading.Thread(target=self._pump, args=(link, link.far, link.near), daemon=True).start()
        self._pump(link, link.near, link.far)

    @staticmethod
    def _pump(link: _Link, source: socket.socket, sink: socket.socket) -> None:
        """Copy `source` to `sink`, each chunk only while the link is up; an end is passed on as a half-close."""
        while True:
            try:
                data = source.recv(1 << 16)
            except OSError:
                data = b""
            link.up.wait()
            try:
                if not data:
                    sink.shutdown(socket.SHUT_WR)
                    return
                sink.sendall(data)
            except OSError:
                return
