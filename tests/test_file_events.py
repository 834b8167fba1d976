"""The daemon's file events (runner/inotify.py through runner/loggrowth.py): a follower learns which of its
files grew, a file nobody follows wakes nobody, and a folder that cannot be watched is said to be polled."""

from __future__ import annotations

import asyncio
from pathlib import Path

from tfrun.runner.loggrowth import LogGrowth, Subscription


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
