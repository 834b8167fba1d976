"""Waking log followers as soon as a job's log grows: the kernel's file events (runner/logs/inotify.py), read on
the event loop, with polling as the fallback where events are missing (no inotify, inotify watches used up).

A *follower* is whoever waits for a log to grow: a client's `logs -f` (runner/logs/logstream.py), or the alert
watch (runner/alerts/watch.py). One inotify watch per job folder however many followers it has; a follower waits
on its subscription, which also tells which of the files it follows grew, so the alert watch reads only the
logs that did: a busy log costs one wake-up per batch of writes (the kernel merges repeated events while
nobody reads them), a quiet one nothing.

Events are read while a follower waits, and by each follower as it starts to wait; while none waits (the alert
watch between its turns, with no `logs -f` open) the kernel holds them, and a hundred jobs printing a line a
second each wake the daemon once a turn rather than a hundred times a second.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Optional

from .inotify import APPEARS, IN_IGNORED, IN_Q_OVERFLOW, WRITTEN, Inotify

log = logging.getLogger("tfrund")


class Subscription:
    """Set whenever a followed file may have grown; a write while the follower reads is not lost. `take()`
    says which files grew since the last take."""

    def __init__(self) -> None:
        self.event = asyncio.Event()
        self.grown: set[str] = set()
        self.growth: Optional[LogGrowth] = None  # whose events wake it: set by LogGrowth.follow

    def wake(self, path: str) -> None:
        self.grown.add(path)
        self.event.set()

    def poke(self) -> None:
        """Wake the follower though no file grew: it has something else to look at (a job written)."""
        self.event.set()

    def take(self) -> set[str]:
        """The followed files that grew since the last take."""
        grown, self.grown = self.grown, set()
        return grown

    async def wait(self, timeout: float) -> None:
        """Return once a followed file may have grown, or after `timeout` seconds in any case.

        Not asyncio.wait_for: before Python 3.12 it swallows a cancellation that comes as the event is set,
        and a follower whose client hung up (cancelled as other followers' handles close, which sets the
        event) would then follow on, for nobody, until its job ended. Nor a task of its own for the wait:
        each hop through one costs a turn of the event loop, and a followed line waited three of them.
        The timeout sets the event: a look that finds nothing new. The events the kernel holds are read first
        (none may have been while no follower waited), and while it waits, as they come."""
        growth = self.growth
        if growth is not None:
            growth.read_events()
        if not self.event.is_set():
            timer = asyncio.get_running_loop().call_later(timeout, self.event.set)
            if growth is not None:
                growth.listen()
            try:
                await self.event.wait()
            finally:
                timer.cancel()
                if growth is not None:
                    growth.unlisten()
        self.event.clear()


class LogGrowth:
    """The daemon's one view of its jobs' logs growing; followers subscribe with `follow`.

    Each followed file has a watch of its own (writes to it), and its folder one for files that appear
    (created, or renamed into place): the shim's log index and the daemon's own metrics files, written
    beside the log as often as it grows, wake nobody and cost no event. A followed file that does not exist
    yet is watched from the moment its folder says it appeared."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self.waiters: dict[str, set[Subscription]] = {}
        self.folders: dict[str, int] = {}  # folder: its watch for files that appear
        self.files: dict[str, int] = {}  # followed file: its watch for writes
        self._by_watch: dict[int, tuple[str, bool]] = {}  # watch: (the folder or file, whether a folder)
        self._inotify: Optional[Inotify] = None
        self._listening = 0  # followers waiting now: while there are any, the loop reads events as they come
        try:
            self._inotify = Inotify()
        except OSError as exc:  # no inotify here: followers poll, as they would anyway on timeout
            log.warning("file events unavailable (%s); log followers poll", exc)

    def stop(self) -> None:
        if self._inotify is not None:
            if self._listening:
                self.loop.remove_reader(self._inotify.fd)
            self._inotify.close()
            self._inotify = None

    def read_events(self) -> None:
        """Read the events waiting now, waking who follows each file."""
        if self._inotify is not None:
            self._read()

    def listen(self) -> None:
        """A follower starts waiting: events are read as they come (the first such follower registers the
        descriptor with the loop)."""
        self._listening += 1
        if self._listening == 1 and self._inotify is not None:
            self.loop.add_reader(self._inotify.fd, self._read)

    def unlisten(self) -> None:
        """A follower stopped waiting; once none waits, events wait in the kernel for the next one."""
        self._listening -= 1
        if self._listening == 0 and self._inotify is not None:
            self.loop.remove_reader(self._inotify.fd)

    def watches(self, folder: str) -> bool:
        """Whether the growth of the files followed in `folder` wakes their followers (else they must poll)."""
        return folder in self.folders

    @contextlib.contextmanager
    def follow(self, path: Path, subscription: Optional[Subscription] = None) -> Iterator[Subscription]:
        """Follow `path` for as long as the block runs: one follower's subscription to its growth (or a
        subscription given, which then wakes when any of the files it follows grows)."""
        key = os.fspath(path)
        folder = os.path.dirname(key)
        subscription = subscription or Subscription()
        subscription.growth = self
        first = key not in self.waiters
        self.waiters.setdefault(key, set()).add(subscription)
        if first:
            self._watch_folder(folder)  # before the file: one created in between is told by the folder
            self._watch_file(key)
        try:
            yield subscription
        finally:
            waiting = self.waiters.get(key, set())
            waiting.discard(subscription)
            if not waiting:
                self.waiters.pop(key, None)
                self._unwatch(self.files.pop(key, None))
                if not any(os.path.dirname(k) == folder for k in self.waiters):
                    self._unwatch(self.folders.pop(folder, None))

    def _watch_folder(self, folder: str) -> None:
        if self._inotify is None or folder in self.folders:
            return
        try:
            wd = self._inotify.add(folder, APPEARS)
        except OSError as exc:  # e.g. inotify watches used up: this folder is polled
            log.warning("cannot watch %s (%s); its followers poll", folder, exc)
            return
        self.folders[folder] = wd
        self._by_watch[wd] = (folder, True)

    def _watch_file(self, path: str) -> None:
        """Watch a followed file's writes (again, if it was replaced); one that does not exist yet is watched
        once its folder tells it appeared."""
        if self._inotify is None:
            return
        try:
            wd = self._inotify.add(path, WRITTEN)
        except FileNotFoundError:
            return
        except OSError as exc:  # watches used up: its folder is polled
            log.warning("cannot watch %s (%s); its followers poll", path, exc)
            self._unwatch(self.folders.pop(os.path.dirname(path), None))
            return
        self.files[path] = wd
        self._by_watch[wd] = (path, False)

    def _unwatch(self, wd: Optional[int]) -> None:
        if wd is not None and self._inotify is not None:
            self._by_watch.pop(wd, None)
            self._inotify.remove(wd)

    def _read(self) -> None:
        """The events waiting (on the event loop: when the descriptor is ready while a follower waits, and as one
        starts to wait): wake who follows each file."""
        assert self._inotify is not None
        for event in self._inotify.read():
            if event.mask & IN_Q_OVERFLOW:  # some were dropped: every follower looks again
                for path, subscriptions in self.waiters.items():
                    for subscription in subscriptions:
                        subscription.wake(path)
                continue
            watched = self._by_watch.get(event.watch)
            if watched is None:
                continue
            target, is_folder = watched
            if event.mask & IN_IGNORED:  # the file or folder is gone, and its watch with it
                del self._by_watch[event.watch]
                watches = self.folders if is_folder else self.files
                if watches.get(target) == event.watch:  # not the watch of a file that replaced it
                    del watches[target]
                continue
            path = os.path.join(target, event.name) if is_folder else target
            followers = self.waiters.get(path)
            if followers:
                if is_folder:  # a followed file appeared (or was replaced): its writes are watched from now
                    self._watch_file(path)
                for follower in followers:
                    follower.wake(path)
