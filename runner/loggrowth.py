"""Waking log followers as soon as a job's log grows: file events (watchdog, inotify on Linux), with
polling as the fallback where events are missing (no inotify, a network filesystem, inotify watches used up).

A *follower* is whoever waits for a log to grow: a client's `logs -f` (runner/logstream.py), or the alert
watch (runner/alerts.py). One inotify watch per job folder however many followers it has; a follower waits
on an asyncio event that the watchdog thread sets through the loop, so a busy log costs one wake-up per
batch of writes (the kernel merges repeated events while nobody reads them), not one per line.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Optional

log = logging.getLogger("tfrund")


class Subscription:
    """Set whenever the followed file may have grown; a write while the follower reads is not lost."""

    def __init__(self) -> None:
        self.event = asyncio.Event()

    async def wait(self, timeout: float) -> None:
        """Return once the file may have grown, or after `timeout` seconds in any case.

        Not asyncio.wait_for: before Python 3.12 it swallows a cancellation that comes as the event is set,
        and a follower whose client hung up (cancelled as other followers' handles close, which sets the
        event) would then follow on, for nobody, until its job ended."""
        woken = asyncio.ensure_future(self.event.wait())
        try:
            await asyncio.wait({woken}, timeout=timeout)
        finally:
            woken.cancel()
        self.event.clear()


class LogGrowth:
    """The daemon's one view of its jobs' logs growing; followers subscribe with `follow`."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self.waiters: dict[str, set[asyncio.Event]] = {}
        self.observed: dict[str, Any] = {}  # folder: watchdog's handle on its inotify watch
        self.observer: Optional[Any] = None
        try:
            from watchdog.observers import Observer

            observer = Observer()
            observer.daemon = True
            observer.start()
            self.observer = observer
        except Exception as exc:  # no inotify here: followers poll, as they would anyway on timeout
            log.warning("file events unavailable (%s); log followers poll", exc)

    def stop(self) -> None:
        if self.observer is not None:
            self.observer.stop()

    @contextlib.contextmanager
    def follow(self, path: Path, subscription: Optional[Subscription] = None) -> Iterator[Subscription]:
        """Follow `path` for as long as the block runs: one follower's subscription to its growth (or a
        subscription given, which then wakes when any of the files it follows grows)."""
        key = os.fspath(path)
        folder = os.path.dirname(key)
        subscription = subscription or Subscription()
        self.waiters.setdefault(key, set()).add(subscription.event)
        self._watch(folder)
        try:
            yield subscription
        finally:
            waiting = self.waiters.get(key, set())
            waiting.discard(subscription.event)
            if not waiting:
                self.waiters.pop(key, None)
            if not any(os.path.dirname(k) == folder for k in self.waiters):
                self._unwatch(folder)

    def _watch(self, folder: str) -> None:
        if self.observer is None or folder in self.observed:
            return
        from watchdog.events import FileSystemEventHandler

        growth = self

        class Handler(FileSystemEventHandler):
            def on_any_event(self, event: Any) -> None:  # called on watchdog's thread
                growth.loop.call_soon_threadsafe(growth._wake, os.fsdecode(event.src_path))

        try:
            self.observed[folder] = self.observer.schedule(Handler(), folder, recursive=False)
        except Exception as exc:  # e.g. inotify watches used up: this folder is polled
            log.warning("cannot watch %s (%s); its followers poll", folder, exc)

    def _unwatch(self, folder: str) -> None:
        handle = self.observed.pop(folder, None)
        if handle is not None and self.observer is not None:
            with contextlib.suppress(Exception):  # already gone with its folder
                self.observer.unschedule(handle)

    def _wake(self, path: str) -> None:
        for event in self.waiters.get(path, ()):
            event.set()
