"""Waking log followers as soon as a job's log grows: the kernel's file events (runner/inotify.py), read on
the event loop, with polling as the fallback where events are missing (no inotify, inotify watches used up).

A *follower* is whoever waits for a log to grow: a client's `logs -f` (runner/logstream.py), or the alert
watch (runner/alerts.py). One inotify watch per job folder however many followers it has; a follower waits
on its subscription, which also tells which of the files it follows grew, so the alert watch reads only the
logs that did: a busy log costs one wake-up per batch of writes (the kernel merges repeated events while
nobody reads them), a quiet one nothing.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Optional

from tfrun.runner.inotify import IN_IGNORED, IN_Q_OVERFLOW, Inotify

log = logging.getLogger("tfrund")


class Subscription:
    """Set whenever a followed file may have grown; a write while the follower reads is not lost. `take()`
    says which files grew since the last take."""

    def __init__(self) -> None:
        self.event = asyncio.Event()
        self.grown: set[str] = set()

    def wake(self, path: str) -> None:
        self.grown.add(path)
        self.event.set()

    def take(self) -> set[str]:
        """The followed files that grew since the last take."""
        grown, self.grown = self.grown, set()
        return grown

    async def wait(self, timeout: float) -> None:
        """Return once a followed file may have grown, or after `timeout` seconds in any case.

        Not asyncio.wait_for: before Python 3.12 it swallows a cancellation that comes as the event is set,
        and a follower whose client hung up (cancelled as other followers' handles close, which sets the
        event) would then follow on, for nobody, until its job ended."""
        if not self.event.is_set():
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
        self.waiters: dict[str, set[Subscription]] = {}
        self.folders: dict[str, int] = {}  # folder: its inotify watch
        self._by_watch: dict[int, str] = {}
        self._inotify: Optional[Inotify] = None
        try:
            self._inotify = Inotify()
            loop.add_reader(self._inotify.fd, self._read)
        except OSError as exc:  # no inotify here: followers poll, as they would anyway on timeout
            log.warning("file events unavailable (%s); log followers poll", exc)

    def stop(self) -> None:
        if self._inotify is not None:
            self.loop.remove_reader(self._inotify.fd)
            self._inotify.close()
            self._inotify = None

    def watches(self, folder: str) -> bool:
        """Whether a growth of a file in `folder` wakes its followers (else they must poll)."""
        return folder in self.folders

    @contextlib.contextmanager
    def follow(self, path: Path, subscription: Optional[Subscription] = None) -> Iterator[Subscription]:
        """Follow `path` for as long as the block runs: one follower's subscription to its growth (or a
        subscription given, which then wakes when any of the files it follows grows)."""
        key = os.fspath(path)
        folder = os.path.dirname(key)
        subscription = subscription or Subscription()
        self.waiters.setdefault(key, set()).add(subscription)
        self._watch(folder)
        try:
            yield subscription
        finally:
            waiting = self.waiters.get(key, set())
            waiting.discard(subscription)
            if not waiting:
                self.waiters.pop(key, None)
                if not any(os.path.dirname(k) == folder for k in self.waiters):
                    self._unwatch(folder)

    def _watch(self, folder: str) -> None:
        if self._inotify is None or folder in self.folders:
            return
        try:
            wd = self._inotify.add(folder)
        except OSError as exc:  # e.g. inotify watches used up: this folder is polled
            log.warning("cannot watch %s (%s); its followers poll", folder, exc)
            return
        self.folders[folder] = wd
        self._by_watch[wd] = folder

    def _unwatch(self, folder: str) -> None:
        wd = self.folders.pop(folder, None)
        if wd is not None and self._inotify is not None:
            self._by_watch.pop(wd, None)
            self._inotify.remove(wd)

    def _read(self) -> None:
        """The events waiting (on the event loop, when the descriptor is ready): wake who follows each file."""
        assert self._inotify is not None
        for event in self._inotify.read():
            if event.mask & IN_Q_OVERFLOW:  # some were dropped: every follower looks again
                for path, subscriptions in self.waiters.items():
                    for subscription in subscriptions:
                        subscription.wake(path)
                continue
            folder = self._by_watch.get(event.watch)
            if folder is None:
                continue
            if event.mask & IN_IGNORED:  # the folder is gone, and its watch with it
                self._by_watch.pop(event.watch, None)
                self.folders.pop(folder, None)
                continue
            path = os.path.join(folder, event.name)
            for subscription in self.waiters.get(path, ()):
                subscription.wake(path)
