"""tfrund's main loop: hold the home's lock, reconcile, serve the protocol on the Unix socket.

One daemon per TFRUN_HOME: it holds an flock on run/tfrund.lock for its whole life, so a second one
refuses to start, and a crashed one's lock vanishes with it (no stale pid file to clean up). A daemon whose
home, lock file or socket is removed or replaced under it (`rm -rf ~/.local/state/tfrun`) no longer serves
that home: nobody can reach it, and the next verb starts another beside it. It looks every few seconds
(`HomeWatch`) and stops, saying why; its jobs keep running, and the next daemon adopts those it can find.

Requests are read and handled on one event loop. A big one (a `have_blobs` of 100,000 digests is a 6.6 MB
frame) is decoded and served in a worker thread, so that the other clients wait for none of it, and the
memory it took is given back to the system once it is answered.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import ctypes
import functools
import logging
import os
import signal
import time
from collections.abc import Awaitable, Coroutine
from typing import IO, TYPE_CHECKING, Any, Callable, Optional, TypeVar, Union

import tfrun
from tfrun.constants import MAX_HEADER_BYTES
from tfrun.paths import Layout
from tfrun.private import peer_is_self, private_key
from tfrun.protocol.channel import daemon_hello, mismatch_message
from tfrun.protocol.fields import ErrorCode, JobState
from tfrun.protocol.proof import KEY_BYTES, proof_of
from tfrun.protocol.wire import (
    PROTOCOL_VERSION,
    Error,
    Hello,
    Message,
    ProtocolError,
    decode_header,
    read_header,
    read_message,
    read_rest,
    write_message,
)

from .alerts.diskfull import DiskWatch
from .alerts.outbox import Outbox
from .alerts.watch import Alerts
from .config import live
from .config.settings import Config, ConfigError
from .executors.executor import Executor
from .executors.local import LocalExecutor
from .executors.runs import Runs
from .executors.slurm.executor import SlurmExecutor
from .gpus.devices import device_ids
from .gpus.history import GpuHistory
from .handlers import (
    HANDLERS,
    WATCHING,
    Connection,
    RequestError,
    admin,
    jobs,
    logs,
    services,
    submit,
    watching,
)
from .handlers.base import Shown
from .home import HomeWatch
from .logs.loggrowth import LogGrowth
from .queue.scheduler import Scheduler
from .records.job import JobRow
from .records.lifecycle import Lifecycle
from .records.store import Store
from .storage.uploader import Uploader
from .workdir.blobs import BlobStore, Spares

log = logging.getLogger("tfrund")

_HELLO_TIMEOUT_S = 10.0
_WATCH_S = 2.0  # how often the daemon looks whether its home, lock and socket are still its own: three stats
_BIG_FRAME_BYTES = 256 << 10  # a request header above this is decoded off the event loop, its memory given back
_HEAVY_THREADS = 2  # threads for big requests: they queue behind each other, not in front of the other clients

T = TypeVar("T")


class Daemon:
    def __init__(self, layout: Layout, config: Config, store: Store, lock: IO[str]) -> None:
        self.layout = layout
        self.watch = HomeWatch(layout, lock)
        self.heavy = concurrent.futures.ThreadPoolExecutor(_HEAVY_THREADS, thread_name_prefix="tfrund-heavy")
        self._trimming = False  # a malloc_trim under way
        self.config = config
        self.store = store
        self.lifecycle = Lifecycle(store, layout.jobs_dir, lambda: self.config.checkpoint_root)
        # Chosen once, at start (`executor` applies when tfrund restarts); [slurm] is read at each launch.
        self.executor: Executor = (
            SlurmExecutor(lambda: self.config.slurm, layout.shim_pythonpath)
            if config.executor == "slurm"
            else LocalExecutor(layout, device_ids(config.gpus))
        )
        self.runs = Runs(store, self.lifecycle, self.executor)
        self.blobs = BlobStore(layout.blobs_dir)
        self.spares = Spares(layout.spares_dir, self.blobs)
        self._background: set[asyncio.Future[Any]] = set()
        self.outbox = Outbox(store, config.cooldown, config.expire)
        self.alerts = Alerts(config, store, self.outbox)
        self.alerts.poll_logs = not self.executor.capabilities.files_here
        self.disk = DiskWatch(layout.home, store, self.outbox, lambda: self.config)
        self.uploader = Uploader(store, self.blobs, self.outbox, self.alerts, lambda: self.config)
        self.scheduler = Scheduler(store, self.runs, self.spares, layout, lambda: self.config, self.uploader)
        self.runs.after_final = self._after_end
        self._connections = 0
        self.submissions: dict[str, asyncio.Future[list[JobRow]]] = {}  # submits being made (a job, an array's tasks)
        self.started_at = time.time()
        self._stopping: Optional[asyncio.Event] = None  # made in serve(): on 3.9 an Event binds to a loop

    @functools.cached_property
    def key(self) -> bytes:
        """The daemon key (tfrun/protocol/proof.py), read or made on first use, in its home's private run/."""
        return private_key(self.layout.daemon_key, KEY_BYTES)

    def in_background(self, work: Union[Callable[[], object], Coroutine[Any, Any, None]]) -> None:
        """Run `work` (a function, in a worker thread, or a coroutine) without waiting for it; a failure is
        logged, never raised."""

        def done(future: asyncio.Future[Any]) -> None:
            self._background.discard(future)
            if not future.cancelled() and future.exception() is not None:
                log.error("background work failed: %s", future.exception())

        loop = asyncio.get_running_loop()
        future = loop.create_task(work) if asyncio.iscoroutine(work) else loop.run_in_executor(None, work)
        self._background.add(future)
        future.add_done_callback(done)

    async def off_loop(self, work: Callable[[], T]) -> T:
        """`work()`, run in a thread for big requests: what it costs holds up no other client. Its result
        comes back through a list, not as the future's result: a concurrent future and the callback that
        chains it to asyncio's refer to each other, so it lives until the garbage collector's rare full pass
        (a 6.6 MB request stayed in memory with it)."""
        found: list[T] = []
        await asyncio.get_running_loop().run_in_executor(self.heavy, lambda: found.append(work()))
        return found.pop()

    def _after_end(self, job_id: int) -> None:
        """Once a job's end is committed: its restart, if it called for one, is built and started, and its
        GPUs are free, so jobs that wait for them or run after it may start."""
        self.build_restarts()
        self.in_background(self.scheduler.run_pass())

    def build_restarts(self) -> None:
        """Build and start, in the background, every restart that is recorded but not built: the one a job's
        end just called for, or at daemon start one whose daemon died before it was built or started.
        Scheduler.build_restart redoes only what is missing, so this is safe to repeat."""
        for row in self.store.list(include_final=False):
            restart = row.spec.restart_of is not None and row.state == JobState.QUEUED and not row.prepared
            if restart and not self.runs.is_starting(row.id):
                self.runs.mark_starting(row.id)
                self.in_background(self.scheduler.build_restart(row))

    def stop(self) -> None:
        if self._stopping is not None:
            self._stopping.set()

    def apply_config(self, config: Config) -> None:
        """Use a config read again (`tfrun config reload` or `set`, SIGHUP) from now on. Every part reads its
        settings from here when it next needs them: the alerts (the notify URLs of every job's next alert),
        the outbox, the scheduler (its GPUs and CPU slots, with a pass now, as a cap may have risen)."""
        self.config = config
        self.alerts.reconfigure(config)
        self.outbox.cooldown, self.outbox.expire = config.cooldown, config.expire
        self.executor.use_devices(device_ids(config.gpus))
        self.in_background(self.scheduler.run_pass())

    def _reload_on_hangup(self) -> None:
        """SIGHUP: read config.toml again, as `tfrun config reload` does. A file that cannot be used is
        logged, and the running config stays."""
        try:
            live.reload(self, "SIGHUP")
        except ConfigError as exc:
            log.error("config not reloaded (SIGHUP): %s; the running config stays", exc)

    async def serve(self) -> None:
        """Reconcile, listen, and serve until asked to stop (Shutdown, SIGTERM or SIGINT)."""
        self._stopping = asyncio.Event()
        self.log_growth = LogGrowth(asyncio.get_running_loop())
        self.runs.reconcile()
        self.build_restarts()
        await self.runs.resume_queued()
        await self.scheduler.run_pass()
        socket_path = self.layout.socket
        socket_path.unlink(missing_ok=True)  # left by a daemon that died; we hold the lock, so it is stale
        server = await asyncio.get_running_loop().create_unix_server(self._protocol, path=str(socket_path))
        socket_path.chmod(0o600)
        self.watch.bound()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, self.stop)
        loop.add_signal_handler(signal.SIGHUP, self._reload_on_hangup)
        monitor = asyncio.create_task(self.runs.monitor())
        watch = asyncio.create_task(self.alerts.run(self.log_growth))
        outbox = asyncio.create_task(self.outbox.run())
        home = asyncio.create_task(self._watch_home())
        uploads = asyncio.create_task(self.uploader.run())
        # each job's GPUs over its life; none sampled where Slurm places jobs (this NVML does not see theirs)
        held = lambda: {} if self.runs.executor.places_jobs() else self.scheduler.held()  # noqa: E731
        gpu_use = asyncio.create_task(GpuHistory(held, self.store).run())
        log.info("tfrund %s (pid %d) serving %s", tfrun.__version__, os.getpid(), socket_path)
        try:
            await self._stopping.wait()
        finally:
            server.close()
            for task in (monitor, watch, outbox, home, gpu_use, uploads):
                task.cancel()
            self.log_growth.stop()
            self.heavy.shutdown(wait=False)
            if self.watch.owns_socket():  # never a later daemon's
                socket_path.unlink(missing_ok=True)
            log.info("tfrund (pid %d) stopped; running jobs keep running", os.getpid())

    async def _watch_home(self) -> None:
        """Stop once this daemon no longer serves its home (`HomeWatch`), saying why; look at its disk too."""
        while True:
            await asyncio.sleep(_WATCH_S)
            self.disk.look(self.alerts.host)
            reason = self.watch.lost()
            if reason is not None:
                _say_last(f"tfrund (pid {os.getpid()}) stops: {reason}; its jobs keep running, and the next tfrun "
                          "verb starts a daemon for the home")  # fmt: skip
                self.stop()
                return

    async def _decode(self, reader: _ClientReader, line: bytes, big: bool) -> Message:
        """The request whose header is `line`: a big one decoded and checked in a worker thread (100,000
        digests cost 25 ms of JSON and checks that the other clients would wait through)."""
        decoded = await self.off_loop(lambda: decode_header(line)) if big else decode_header(line)
        return await read_rest(reader, *decoded)

    async def _serve(self, msg: Message, conn: Connection, reader: _ClientReader) -> bool:
        """Answer one request; False when the connection is to end (not a request, or its client hung up)."""
        handler = HANDLERS.get(type(msg))
        if handler is None:
            await conn.send(Error(ErrorCode.BAD_REQUEST, f"{msg.TYPE!r} is not a request"))
            return False
        try:
            if isinstance(msg, WATCHING):
                return await _unless_hung_up(handler(self, msg, conn), reader.hung_up)
            await handler(self, msg, conn)
        except RequestError as exc:
            await conn.send(Error(exc.code, exc.message))
        return True

    def _give_memory_back(self) -> None:
        """After a big request: hand the memory it took back to the system, in a worker thread. glibc keeps
        what is freed for reuse (a worker thread's arena too), so without this a daemon that once read
        ten 6.6 MB requests stayed 110 MB larger for the rest of its life. One trim at a time."""
        if _MALLOC_TRIM is None or self._trimming:
            return
        self._trimming = True

        def trim() -> None:
            try:
                _MALLOC_TRIM(0)
            finally:
                self._trimming = False

        self.in_background(trim)

    def _protocol(self) -> asyncio.StreamReaderProtocol:
        """What asyncio.start_unix_server makes for each client, with a reader that tells of a hang-up."""
        return asyncio.StreamReaderProtocol(_ClientReader(MAX_HEADER_BYTES + 1), self._connection)

    async def _connection(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        """One client: the version handshake, then requests until it hangs up. A client of another uid (root
        aside, none can reach the 0700 folder) is hung up on unheard: tfrund serves its own user alone."""
        assert isinstance(reader, _ClientReader)
        if not peer_is_self(writer.get_extra_info("socket")):
            log.warning("a client of another user connected: hung up on")
            writer.close()
            return
        self._connections += 1
        conn = Connection(writer, f"c{os.getpid()}-{self._connections}")
        try:
            hello = await asyncio.wait_for(read_message(reader), _HELLO_TIMEOUT_S)
            if not isinstance(hello, Hello):
                await conn.send(Error(ErrorCode.BAD_REQUEST, "expected a hello frame first: is this a tfrun client?"))
                return
            if hello.protocol != PROTOCOL_VERSION:
                await conn.send(Error(ErrorCode.VERSION_MISMATCH, mismatch_message(hello, daemon_hello())))
                return
            await conn.send(daemon_hello(proof_of(self.key, hello.challenge) if hello.challenge else ""))
            while True:
                line = await read_header(reader)
                if line is None:
                    return
                big = len(line) > _BIG_FRAME_BYTES
                if not await self._serve(await self._decode(reader, line, big), conn, reader):
                    return
                if big:
                    del line  # before the trim: the frame is the largest block it can give back
                    conn.big = True
                    self._give_memory_back()
        except ProtocolError as exc:  # ends the connection: logged once, as one line, whatever the peer sends
            log.warning("%s: bad request: %.200s", conn.key, exc)
            await _try_send(writer, Error(ErrorCode.BAD_REQUEST, str(exc)))
        except (ConnectionError, asyncio.TimeoutError, asyncio.IncompleteReadError):
            pass
        except asyncio.CancelledError:  # the daemon stops with the client still connected (`tfrund stop`'s own)
            pass  # ended, not re-raised: asyncio's stream callback before Python 3.12 logs a cancelled one as an ERROR
        except Exception as exc:
            log.exception("request failed")
            await _try_send(writer, Error(ErrorCode.INTERNAL, f"tfrund internal error: {exc}"))
        finally:
            self.blobs.discard(conn.key)
            writer.close()
            if conn.big:  # what it held (the digests of its uploads) is given back too
                self._give_memory_back()


class _ClientReader(asyncio.StreamReader):
    """A client's stream that also tells, without consuming anything, when the client hung up: the end of
    what it sends (every tfrun client, the keeper and dial-stdio pass that on), or a broken connection."""

    def __init__(self, limit: int) -> None:
        super().__init__(limit=limit)
        self.hung_up = asyncio.Event()

    def feed_eof(self) -> None:
        super().feed_eof()
        self.hung_up.set()

    def set_exception(self, exc: Exception) -> None:
        super().set_exception(exc)
        self.hung_up.set()


async def _unless_hung_up(work: Awaitable[None], hung_up: asyncio.Event) -> bool:
    """Run a handler that only watches (a wait, a follow) until it is done or its client hangs up; False
    if the client went first. Such a handler may sit for days beside a job that prints nothing, with no
    write to fail on: without this, each client that gave up would hold its socket, its handle on the log
    and its polling loop until the job ended."""
    task = asyncio.ensure_future(work)
    gone = asyncio.ensure_future(hung_up.wait())
    try:
        await asyncio.wait({task, gone}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        gone.cancel()
        if not task.done():
            task.cancel()
    if not task.done():
        await asyncio.wait({task})  # its cleanup (closing the log, leaving the watch) runs now, not later
        return False
    task.result()  # its RequestError, or a failure, as if it had been awaited directly
    return True


def _malloc_trim() -> Optional[Callable[[int], int]]:
    """glibc's malloc_trim, or None where the C library has none (musl, macOS)."""
    try:
        trim: Callable[[int], int] = ctypes.CDLL(None).malloc_trim  # the C library the interpreter uses
    except (OSError, AttributeError):
        return None
    return trim


_MALLOC_TRIM = _malloc_trim()


def _say_last(line: str) -> None:
    """Log the daemon's last words: to stderr, as every line (a `tfrund run` in a terminal, a container's
    log, the home's tfrund.log for a daemon a verb started). When stderr is a file that is gone (the home's
    log, removed with the home), to syslog too, the one place left that a person may look: a daemon never
    makes again a home that someone removed. Where there is no syslog, the line is lost with the log."""
    log.error("%s", line)
    try:
        gone = os.fstat(2).st_nlink == 0
    except OSError:
        gone = True
    if gone:
        import syslog  # here: only a daemon whose home went needs it

        syslog.openlog("tfrund", syslog.LOG_PID, syslog.LOG_DAEMON)
        syslog.syslog(syslog.LOG_ERR, line)


async def _try_send(writer: asyncio.StreamWriter, msg: Message) -> None:
    with contextlib.suppress(ConnectionError, RuntimeError):
        await write_message(writer, msg)


if TYPE_CHECKING:  # for mypy alone: the table of handlers (runner/handlers/base.py) takes any context
    Contexts = tuple[
        Shown, admin.Context, jobs.Context, logs.Context, services.Context, submit.Context, watching.Context
    ]

    def _handlers_context(daemon: Daemon) -> Contexts:
        """Each handler takes what its module's Context names, and the daemon is every one of them."""
        return daemon, daemon, daemon, daemon, daemon, daemon, daemon
