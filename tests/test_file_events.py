"""The daemon's file events (runner/logs/inotify.py through runner/logs/loggrowth.py): a follower learns which of its
files grew, a file nobody follows wakes nobody, and a folder that cannot be watched is said to be polled."""

from __future__ import annotations

import asyncio
from pathlib import Path

from tfrun.runner.logs.loggrowth import LogGrowth, Subscription


def test_a_subscription_says_which_followed_file_grew_and_no_other_wakes_it(tmp_path: Path) -> None:
    log, metrics, other = tmp_path / "output.log", tmp_path / "metrics.jsonl", tmp_path / "logmetrics.jsonl"
    log.write_bytes(b"")

    async def scenario() -> tuple[set[str], set[str], bool, bool]:
        growth = LogGrowth(asyncio.get_running_loop())
        grew = Subscription()
        try:
            with growth.follow(log, grew), growth.follow(metrics, grew):
                assert growth.watches(str(tmp_path))
                with open(log, "ab") as f:
                    f.write(b"step 1 loss=0.5\n")
                await grew.wait(10)
                first = grew.take()
                metrics.write_text('{"step": 1}\n')  # created after the follow began
                await grew.wait(10)
                second = grew.take()
                other.write_text("written by the daemon itself\n")
                await grew.wait(0.5)
                woken_by_other = bool(grew.take())
            watched_after = growth.watches(str(tmp_path))
            return first, second, woken_by_other, watched_after
        finally:
            growth.stop()

    first, second, woken_by_other, watched_after = asyncio.run(scenario())
    assert first == {str(log)}
    assert second == {str(metrics)}
    assert not woken_by_other
    assert not watched_after  # the last follower gone, the folder's watch goes too


def test_a_folder_that_cannot_be_watched_is_said_to_be_polled(tmp_path: Path) -> None:
    async def scenario() -> bool:
        growth = LogGrowth(asyncio.get_running_loop())
        try:
            with growth.follow(tmp_path / "missing" / "output.log"):
                return growth.watches(str(tmp_path / "missing"))
        finally:
            growth.stop()

    assert asyncio.run(scenario()) is False


def test_a_followed_file_replaced_by_a_rename_is_followed_on(tmp_path: Path) -> None:
    """A file renamed into place is another file: its writes are watched from the moment it appears."""
    log = tmp_path / "output.log"
    log.write_bytes(b"first\n")

    async def scenario() -> tuple[set[str], set[str]]:
        growth = LogGrowth(asyncio.get_running_loop())
        grew = Subscription()
        try:
            with growth.follow(log, grew):
                (tmp_path / "new.log").write_bytes(b"")
                (tmp_path / "new.log").rename(log)
                await grew.wait(10)
                replaced = grew.take()
                with open(log, "ab") as f:
                    f.write(b"second\n")
                await grew.wait(10)
                return replaced, grew.take()
        finally:
            growth.stop()

    replaced, written = asyncio.run(scenario())
    assert replaced == {str(log)} and written == {str(log)}


class _CountingGrowth(LogGrowth):
    """A LogGrowth that counts its reads of the kernel's events: each is a wake-up of the daemon."""

    reads = 0

    def _read(self) -> None:
        self.reads += 1
        super()._read()


def test_events_wait_in_the_kernel_while_no_follower_waits_and_the_next_wait_reads_them(tmp_path: Path) -> None:
    """Between the alert watch's turns nobody reads events: a hundred jobs printing a line a second each wake the
    daemon once a turn, not a hundred times a second, and no line is missed."""
    log = tmp_path / "output.log"
    log.write_bytes(b"")

    async def scenario() -> tuple[int, set[str], int]:
        growth = _CountingGrowth(asyncio.get_running_loop())
        grew = Subscription()
        try:
            with growth.follow(log, grew):
                before = growth.reads
                for step in range(5):  # the loop turns between the writes, and nobody waits
                    with open(log, "ab") as f:
                        f.write(b"step %d loss=0.5\n" % step)
                    await asyncio.sleep(0.05)
                read_meanwhile = growth.reads - before
                await grew.wait(10)
                return read_meanwhile, grew.take(), growth.reads - before
        finally:
            growth.stop()

    read_meanwhile, grown, reads = asyncio.run(scenario())
    assert read_meanwhile == 0
    assert grown == {str(log)}
    assert reads == 1  # the wait read them all at once, and did not wait


def test_more_events_than_the_kernel_holds_while_nobody_waits_wake_every_follower(tmp_path: Path) -> None:
    """Events that overflow the kernel's queue (fs.inotify.max_queued_events) are lost; the overflow itself is
    told, and every follower then looks at every file it follows."""
    logs = [tmp_path / f"{name}.log" for name in ("a", "b")]
    for path in logs:
        path.write_bytes(b"")
    limit = int(Path("/proc/sys/fs/inotify/max_queued_events").read_text())

    async def scenario() -> set[str]:
        growth = LogGrowth(asyncio.get_running_loop())
        grew = Subscription()
        try:
            with growth.follow(logs[0], grew), growth.follow(logs[1], grew):
                with open(logs[0], "ab", buffering=0) as a, open(logs[1], "ab", buffering=0) as b:
                    for _ in range(limit // 2 + 100):  # alternating: the kernel merges only repeats of one event
                        a.write(b"x")
                        b.write(b"x")
                await grew.wait(10)
                return grew.take()
        finally:
            growth.stop()

    assert asyncio.run(scenario()) == {str(path) for path in logs}
