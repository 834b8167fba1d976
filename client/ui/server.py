"""The UI server: pages and their data, on 127.0.0.1, for the user who started it (client/ui/auth.py).

The pages are static files (client/ui/static/, shipped in the wheel: plain HTML and small scripts, uPlot
vendored for the charts); what they show comes as server-sent events from the feeds (client/ui/feeds.py),
which follow the boxes once however many tabs are open. Actions (cancel, restart) are POSTs, absent with
--read-only.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import math
import re
import socket
from collections.abc import AsyncIterator, Sequence
from pathlib import Path
from typing import Any, Callable

from aiohttp import web

from tfrun.constants import MAX_CONTEXT, MAX_PATTERNS
from tfrun.numerals import is_digits
from tfrun.protocol.channel import RemoteError
from tfrun.protocol.logs import LogQuery

from ..calls import jobs as job_calls
from ..calls import watching as watch_calls
from . import boxfeeds, compare, feeds, jobpages
from .auth import Guard
from .boxes import Box, Unreachable
from .feeds import Feed, Feeds

STATIC = Path(__file__).parent / "static"
HEARTBEAT_S = 15.0  # a comment on a quiet stream: a page that went away is noticed, its feed let go
SHUTDOWN_S = 1.0  # Ctrl-C: open pages' streams never end by themselves; they are cut after this
ACTION_S = 120.0  # a cancel is answered once the job has ended: its grace, and SIGKILL's


def listen(port: int) -> socket.socket:
    """A socket on 127.0.0.1:`port` (0: a free one), listening; never any other address."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", port))
    sock.listen(128)
    sock.setblocking(False)
    return sock


class Ui:
    """The application: its boxes, their feeds, and whether actions are offered."""

    def __init__(self, shown: Sequence[Box], read_only: bool) -> None:
        self.boxes = {box.name: box for box in shown}
        self.feeds = Feeds(shown)
        self.read_only = read_only

    def app(self, guard: Guard) -> web.Application:
        app = web.Application(middlewares=[guard.check])
        app.router.add_get("/", _page("jobs.html"))
        app.router.add_get("/job/{box}/{job:[0-9]+}", _page("job.html"))
        for name in ("compare", "alerts", "gpus"):
            app.router.add_get(f"/{name}", _page(f"{name}.html"))
        app.router.add_static("/static/", STATIC, follow_symlinks=False)
        app.router.add_get("/api/view", self.view)
        app.router.add_get("/events/jobs", self.jobs)
        app.router.add_get("/events/job/{box}/{job:[0-9]+}", self.job)
        app.router.add_get("/events/log/{box}/{job:[0-9]+}", self.log)
        app.router.add_get("/events/compare", self.compare)
        app.router.add_get("/events/alerts", self.alerts)
        app.router.add_get("/events/gpus", self.gpus)
        app.router.add_get("/api/array/{box}/{job:[0-9]+}", self.array)
        app.router.add_get("/api/metrics/{box}/{job:[0-9]+}", self.zoomed)
        if not self.read_only:
            app.router.add_post("/api/job/{box}/{job:[0-9]+}/{action:cancel|restart}", self.act)
        return app

    async def view(self, request: web.Request) -> web.Response:
        """What the pages need to know of this server: its boxes, and whether they may offer actions."""
        return web.json_response({"boxes": list(self.boxes), "read_only": self.read_only})

    async def jobs(self, request: web.Request) -> web.StreamResponse:
        """A page of the jobs table: `box`, `state`, `q` and each box's cursor (`before=BOX:ID`) in its URL."""
        try:
            view = jobpages.view_of(request.query, request.query.getall("before", []), list(self.boxes))
        except jobpages.BadView as exc:
            raise web.HTTPBadRequest(text=f"tfrun ui: {exc}\n") from None
        return await _stream(request, self.feeds.jobs(view))

    async def job(self, request: web.Request) -> web.StreamResponse:
        box, job = self._job(request)
        return await _stream(request, self.feeds.job(box, job))

    async def log(self, request: web.Request) -> web.StreamResponse:
        box, job = self._job(request)
        return await _stream(request, self.feeds.log(box, job, _query(request)))

    async def compare(self, request: web.Request) -> web.StreamResponse:
        """The records and metrics of the jobs in `?jobs=box:1,box:2`, in one stream (client/ui/compare.py)."""
        try:
            jobs = compare.named(request.query.get("jobs", ""), self.boxes)
        except compare.BadJobs as exc:  # said in the page: a stream's own answer, not a status it cannot read
            return await _sse(request, compare.refused(str(exc)))
        feeds = [self.feeds.job(box, job) for box, job in jobs]
        after = compare.resumed_from(request.headers.get("Last-Event-ID", ""), len(feeds))
        return await _sse(request, compare.merged(feeds, after))

    async def alerts(self, request: web.Request) -> web.StreamResponse:
        feed = self.feeds.get(("alerts",), lambda: boxfeeds.AlertsFeed(list(self.boxes.values())))
        return await _stream(request, feed)

    async def gpus(self, request: web.Request) -> web.StreamResponse:
        return await _stream(request, self.feeds.get(("gpus",), lambda: boxfeeds.GpusFeed(list(self.boxes.values()))))

    async def array(self, request: web.Request) -> web.Response:
        """The ids of the jobs of an array (the id of its first task), for the Compare page's one click."""
        box, array = self._job(request)
        try:
            tasks = await compare.array_tasks(box, array)
            return web.json_response({"ok": True, "jobs": tasks[: compare.MAX_COMPARED], "tasks": len(tasks)})
        except RemoteError as exc:
            return web.json_response({"ok": False, "message": exc.message})
        except Unreachable as exc:
            return web.json_response({"ok": False, "message": f"{box.name}: {exc}"})

    async def zoomed(self, request: web.Request) -> web.Response:
        """A zoomed chart's samples: those at steps above `after` and up to `upto`, thinned as a first draw is
        (feeds.CHART_BUCKETS) where they are more than it draws, so that a zoom in far enough shows each one."""
        box, job = self._job(request)
        after, upto = (_step(request.query.get(name, ""), name) for name in ("after", "upto"))
        asked = watch_calls.metrics(str(job), after=after, upto=upto, buckets=feeds.CHART_BUCKETS)
        try:
            reply = await box.ask(asked.on)
        except RemoteError as exc:
            return web.json_response({"ok": False, "message": exc.message})
        except Unreachable as exc:
            return web.json_response({"ok": False, "message": f"{box.name}: {exc}"})
        return web.Response(text=_json({"ok": True, **feeds.columns(reply.samples, reply.thinned)}),
                            content_type="application/json")  # fmt: skip

    async def act(self, request: web.Request) -> web.Response:
        """Cancel or restart a job, as `tfrun cancel` and `tfrun restart` do; the result in words."""
        box, job = self._job(request)
        try:
            if request.match_info["action"] == "cancel":
                asked = job_calls.cancel([str(job)])
                (result,) = await box.ask(asked.on, ACTION_S)
                return web.json_response({"ok": result.ok, "message": result.message})
            restarted = await box.ask(job_calls.restart(str(job)).on)
            return web.json_response({"ok": True, "message": f"restarted as job {restarted.id}", "job": restarted.id})
        except RemoteError as exc:
            return web.json_response({"ok": False, "message": exc.message})
        except Unreachable as exc:
            return web.json_response({"ok": False, "message": str(exc)})

    def _job(self, request: web.Request) -> tuple[Box, int]:
        name = request.match_info["box"]
        if name not in self.boxes:
            raise web.HTTPNotFound(text=f"tfrun ui: no box {name!r} here (this page shows {', '.join(self.boxes)})\n")
        return self.boxes[name], int(request.match_info["job"])


def _page(name: str) -> Callable[[web.Request], Any]:
    async def page(request: web.Request) -> web.FileResponse:
        return web.FileResponse(STATIC / name)

    return page


def _number(text: str, low: int, high: int, what: str) -> int:
    if not is_digits(text) or not low <= int(text) <= high:
        raise web.HTTPBadRequest(text=f"tfrun ui: {what} must be a number from {low} to {high}\n")
    return int(text)


def _step(text: str, what: str) -> int:
    """A step of a zoom's URL: a whole number, negative too (a step is what the job printed)."""
    if not re.fullmatch(r"-?[0-9]{1,18}", text):
        raise web.HTTPBadRequest(text=f"tfrun ui: {what} must be a step, a whole number\n")
    return int(text)


def _query(request: web.Request) -> LogQuery:
    """The log filters of a page's URL, as `tfrun logs` takes them: grep (each an ERE, ORed), i, v, F, A, B, C."""
    given = request.query
    patterns = [pattern for pattern in given.getall("grep", []) if pattern][:MAX_PATTERNS]
    context = _number(given.get("C", "0") or "0", 0, MAX_CONTEXT, "C")
    return LogQuery(
        patterns=patterns,
        ignore_case=given.get("i") == "1",
        invert=given.get("v") == "1",
        fixed=given.get("F") == "1",
        after=_number(given.get("A", "") or str(context), 0, MAX_CONTEXT, "A"),
        before=_number(given.get("B", "") or str(context), 0, MAX_CONTEXT, "B"),
    )


async def _stream(request: web.Request, feed: Feed) -> web.StreamResponse:
    """Server-sent events from `feed`, from the one after the browser's Last-Event-ID (it sends that when it
    opens a stream again): a page whose connection dropped gets what it missed, not everything again."""
    last = request.headers.get("Last-Event-ID", "0")
    return await _sse(request, feed.read(int(last) if is_digits(last) else 0))


async def _sse(request: web.Request, events: AsyncIterator[tuple[Any, str, Any]]) -> web.StreamResponse:
    """`events` (id, kind, data) as server-sent events, for as long as they come and the page reads them."""
    response = web.StreamResponse(headers={"Content-Type": "text/event-stream", "Cache-Control": "no-store"})
    await response.prepare(request)
    await response.write(b"retry: 2000\n\n")
    beat = asyncio.get_running_loop().create_task(_heartbeat(response))
    try:
        async for number, kind, data in events:
            await response.write(f"id: {number}\nevent: {kind}\ndata: {_json(data)}\n\n".encode())
    except (ConnectionResetError, ConnectionError):
        pass
    finally:
        await events.aclose()  # type: ignore[attr-defined]
        beat.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await beat
    return response


def _json(data: Any) -> str:
    """`data` as JSON a browser parses: a loss that went NaN (a job's last, an alert's) is null there, as in a
    chart's points; Python's `NaN` would make the page's JSON.parse throw, and the whole event lost."""
    try:
        return json.dumps(data, allow_nan=False)
    except ValueError:
        return json.dumps(_finite(data), allow_nan=False)


def _finite(data: Any) -> Any:
    if isinstance(data, float):
        return data if math.isfinite(data) else None
    if isinstance(data, dict):
        return {key: _finite(value) for key, value in data.items()}
    if isinstance(data, (list, tuple)):
        return [_finite(value) for value in data]
    return data


async def _heartbeat(response: web.StreamResponse) -> None:
    with contextlib.suppress(ConnectionError):
        while True:
            await asyncio.sleep(HEARTBEAT_S)
            await response.write(b": still here\n\n")


async def serve(ui: Ui, sock: socket.socket, guard: Guard, ready: Callable[[], None]) -> None:
    """Serve on `sock` until cancelled: each connection accepted here, and closed unread unless `Guard.admitted`
    says it is this user's; aiohttp is handed only the admitted ones."""
    runner = web.AppRunner(ui.app(guard), access_log=None, handle_signals=False, shutdown_timeout=SHUTDOWN_S)
    await runner.setup()
    factory = runner.server
    assert factory is not None
    loop = asyncio.get_running_loop()
    sweep = loop.create_task(ui.feeds.sweep())
    ready()
    try:
        while True:
            connection, _ = await loop.sock_accept(sock)
            if guard.admitted(connection):
                await loop.connect_accepted_socket(factory, connection)
            else:
                connection.close()
    finally:
        sock.close()
        sweep.cancel()
        await ui.feeds.close()
        await runner.cleanup()
