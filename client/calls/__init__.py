"""Every request the client sends and gets one reply to, a function each, grouped as tfrun/protocol/ is: what
it asks, and what of the reply its caller gets back (a `Call`).

Two ways of asking take a Call: `AsyncClient.call` (any daemon: a box's over SSH, or this machine's, started
on demand) and the CLI's `cli.call` (a daemon up on this machine already, over a plain socket without asyncio,
which keeps a verb's start short). With each request built here once, neither way builds one, and no verb does
(tests/test_codebase.py holds the verbs to it). A module here imports its own protocol module only, so a verb
pays for the messages it sends. Conversations of several steps (an upload, a follow, a pull, `wait`'s chain
of restarts) are not calls: they live with the code that holds them (client/files/transfer.py, client/link/follow.py).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Callable, Generic, TypeVar

from tfrun.protocol.wire import Message, Request

if TYPE_CHECKING:
    from tfrun.protocol.channel import Channel

M = TypeVar("M", bound=Message)
T = TypeVar("T")


@dataclass(frozen=True)
class Call(Generic[M, T]):
    """A request, and what its caller wants of the reply (of each part, for a reply in parts: `ps --json`)."""

    request: Request[M]
    result: Callable[[M], T]

    async def on(self, channel: Channel) -> T:
        """Asked on a channel the caller holds: a conversation of several calls (`wait`, through restarts)."""
        return self.result(await channel.ask(self.request))


def whole(reply: M) -> M:
    """The reply as it is: for a caller that reads several of its fields."""
    return reply
