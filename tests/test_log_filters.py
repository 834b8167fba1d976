"""The log filter's two paths (runner/logs/lines.py): blocks matched whole find exactly the lines the line path finds
and leave terminal effects and bad UTF-8 to it; small reads matched on the event loop send what the filter
threads send, and costly filters are kept off the loop.
"""

from __future__ import annotations

import random
from pathlib import Path

import pytest

from tfrun.runner.logs.lines import BlockMatcher, LineFilter, Selector, TerminalLines, display

pytestmark = [pytest.mark.slow]


# Words that trip case folding: the Kelvin sign folds to k, the long s to s; ß is not SS to RE2.
BLOCK_WORDS = [
    "step",
    "loss=1.5",
    "LOSS",
    "a.b",
    "axb",
    "Straße",
    "STRASSE",
    "\u212a",
    "k",
    "\u017f",
    "s",
    "\t",
    "ß",
    "",
    "|",
]


@pytest.mark.parametrize(
    ("patterns", "ignore_case", "fixed"),
    [
        ((), False, False),
        (("loss",), False, False),
        (("loss|step",), False, False),
        (("LOSS", "axb"), True, False),
        (("a.b",), False, True),
        (("a.b",), False, False),
        (("^step", "ß$"), False, False),
        (("k",), True, False),
        (("ß",), True, False),
        (("x|",), False, False),
        (("[^z]*ß",), True, False),
        (("|",), False, True),
    ],
)
def test_the_block_path_finds_exactly_the_lines_the_line_path_finds(
    patterns: tuple[str, ...], ignore_case: bool, fixed: bool
) -> None:
    """The fast path over whole blocks must agree with the per-line path, Unicode case folding included."""
    rng = random.Random(len(patterns) * 7 + ignore_case * 3 + fixed)
    for ascii_only in (True, False):
        words = [w for w in BLOCK_WORDS if w.isascii() or not ascii_only]
        lines = [" ".join(rng.choice(words) for _ in range(rng.randint(0, 4))) for _ in range(3000)]
        block = ("\n".join(lines) + "\n").encode()
        line_filter = LineFilter(patterns, ignore_case=ignore_case, fixed=fixed)
        texts = [display(x) for x in TerminalLines().feed(block)]
        per_line = Selector(line_filter.compile(), invert=False).select(texts)
        fast = BlockMatcher(line_filter).lines(block)
        if fast is None:  # allowed only where the literal search would fold case differently from RE2
            assert ignore_case and not ascii_only
            continue
        assert fast == [text.encode() for text in per_line]


def test_the_block_path_leaves_terminal_effects_and_bad_utf8_to_the_line_path() -> None:
    matcher = BlockMatcher(LineFilter(("loss",)))
    for block in (b"loss 1\rloss 2\n", b"loss\b\bx\n", b"\x1b[1mloss\x1b[0m\n", b"loss \xff\n"):
        assert matcher.lines(block) is None
    assert matcher.lines(b"loss 1\nnoise\nloss 2\n") == [b"loss 1", b"loss 2"]


def test_small_reads_matched_on_the_loop_send_what_the_filter_threads_send() -> None:
    """A follower's small reads are matched on the event loop (no thread hop), big ones or costly filters in
    the filter threads: both ways must send the same frames, for partial lines and terminal effects too."""
    import asyncio

    from tfrun.protocol.logs import ReadLog
    from tfrun.runner.logs import logstream

    reads = [b"step 1 loss=0.5\nno", b"ise 1\nstep 2 lo", b"ss=0.4\r", b"\x1b[2Kstep 3 loss=0.3\n", b"x" * 70 + b"\n"]

    async def frames(inline: bool) -> list[tuple[int, int, bytes]]:
        req = ReadLog(job="1", patterns=["loss"], follow=True)
        sent: list[tuple[int, int, bytes]] = []

        async def send(msg: object) -> None:
            sent.append((msg.offset, msg.next_offset, msg.data))  # type: ignore[attr-defined]

        reader = logstream._line_reader(req, await logstream.selection(req), send, Path("output.log"), None, None)
        assert reader is not None
        assert reader.inline_bytes >= max(map(len, reads))  # cheap pattern, small reads: on the loop
        if not inline:
            reader.inline_bytes = 0
        offset = 0
        for data in reads:
            await reader.feed(data, offset)
            offset += len(data)
        return sent

    on_loop, in_threads = asyncio.run(frames(True)), asyncio.run(frames(False))
    assert on_loop == in_threads
    assert on_loop == [(0, 16, b"step 1 loss=0.5\n"), (16, 60, b"\x1b[2Kstep 3 loss=0.3\n")]


def test_costly_filters_are_not_matched_on_the_loop() -> None:
    """A thousand long patterns can cost a third of a second per chunk: even a short read of theirs goes to the
    filter threads, so no client's filter holds up the daemon's event loop."""
    import asyncio

    from tfrun.protocol.logs import ReadLog
    from tfrun.runner.logs import logstream

    async def inline_bytes(patterns: list[str]) -> int:
        req = ReadLog(job="1", patterns=patterns, follow=True)

        async def send(msg: object) -> None:
            pass

        reader = logstream._line_reader(req, await logstream.selection(req), send, Path("output.log"), None, None)
        assert reader is not None
        return reader.inline_bytes

    assert asyncio.run(inline_bytes([f"pattern{i:04d}-" + "x" * 100 for i in range(1000)])) < 16
    assert asyncio.run(inline_bytes(["loss"])) >= 4096
