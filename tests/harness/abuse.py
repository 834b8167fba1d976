"""A client that breaks the protocol's rules on purpose (`Raw`: frames written by hand; `abusive_requests`),
and what the other clients see meanwhile (`ps_latencies`): for tests/test_fuzz.py and bench/abuse.py."""

from __future__ import annotations

import contextlib
import json
import socket
import statistics
import time
from pathlib import Path
from typing import Any, Optional

from tfrun.constants import MAX_CANCEL_JOBS, MAX_PATTERNS
from tfrun.protocol.channel import client_hello
from tfrun.protocol.wire import Hello, encode

from .home import Tfrun


class Raw:
    """A client that speaks frames by hand, so it can send what no tfrun client would."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.sock: Optional[socket.socket] = None
        self.reader: Any = None
        self.probes = 0

    def connect(self) -> None:
        self.close()
        self.sock = socket.socket(socket.AF_UNIX)
        self.sock.settimeout(30)
        self.sock.connect(str(self.path))
        self.reader = self.sock.makefile("rb")
        self.sock.sendall(encode(client_hello()))
        assert self.frame()[0]["type"] == Hello.TYPE

    def close(self) -> None:
        if self.sock is not None:
            self.reader.close()
            self.sock.close()
            self.sock = None

    def send(self, data: bytes) -> None:
        if self.sock is None:
            self.connect()
        assert self.sock is not None
        with contextlib.suppress(BrokenPipeError, ConnectionResetError):  # it refused an earlier part and hung
            self.sock.sendall(data)  # up: what it said before is read next

    def frame(self) -> tuple[dict[str, Any], bytes]:
        """The next frame, or ({}, b"") when the daemon has hung up."""
        try:
            line = self.reader.readline()
        except ConnectionResetError:
            line = b""
        if not line:
            return {}, b""
        header = json.loads(line)
        return header, self.reader.read(header.get("size", 0))

    def replies(self, data: bytes) -> list[dict[str, Any]]:
        """Send `data` (a request, maybe hostile), then a probe that no other request is answered like; the
        frames answering the first, up to the probe's answer or the daemon hanging up (which it does after
        a malformed frame)."""
        self.probes += 1
        probe = f"probe-{self.probes}"
        self.send(data + header_line({"type": "get", "job": probe}))
        got: list[dict[str, Any]] = []
        while True:
            header, _ = self.frame()
            if not header:
                self.close()
                return got
            if header.get("message") == f"no job {probe!r}":
                return got
            got.append(header)


def header_line(fields: dict[str, Any]) -> bytes:
    """A frame header as a hostile peer may write it: NaN, surrogates, numbers of any size."""
    return json.dumps(fields, ensure_ascii=True, allow_nan=True).encode() + b"\n"


def socket_path(tf: Tfrun) -> Path:
    return tf.home / "run" / "tfrund.sock"


def abusive_requests() -> list[tuple[bytes, str]]:
    """(frame, what the daemon must answer) for requests that once held the event loop for seconds."""
    many = [f"n{i:06d}" for i in range(100_000)]
    dear = [f"{i:04d}[a-z]+{'q' * 54}" for i in range(MAX_PATTERNS)]
    return [
        (header_line({"type": "read_log", "job": "1", "patterns": many}), "bad_request"),  # 1 MB of patterns
        (header_line({"type": "cancel", "jobs": many}), "bad_request"),
        # The most a request may ask: a thousand long patterns, dear to compile and to match every line with.
        (header_line({"type": "read_log", "job": "1", "patterns": dear}), ""),
        (header_line({"type": "cancel", "jobs": many[:MAX_CANCEL_JOBS]}), ""),
    ]


def describe(latencies: list[float]) -> str:
    p99 = statistics.quantiles(latencies, n=100)[98]
    return (
        f"{len(latencies)} answers, p50 {statistics.median(latencies) * 1000:.1f} ms, p99 {p99 * 1000:.1f} ms, "
        f"max {max(latencies) * 1000:.1f} ms"
    )


def ps_latencies(tf: Tfrun, seconds: float) -> list[float]:
    """Round trips of `ps` (ListJobs) from another client, for `seconds`."""
    raw = Raw(socket_path(tf))
    raw.connect()
    latencies = []
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        started = time.monotonic()
        assert raw.sock is not None
        raw.sock.sendall(b'{"type": "list"}\n')
        assert raw.frame()[0]["type"] == "jobs"
        latencies.append(time.monotonic() - started)
        time.sleep(0.01)
    return latencies
