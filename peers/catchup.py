"""Catching up after a reconnect: hand the handlers what was sent while the peer was away.

A :class:`CatchUp` keeps the last epoch the handlers saw. After a reconnect it fetches what was
sent after it on the connection's subscriptions and hands it over in epoch order, as the bus
would have pushed it (:func:`missed`), while pushes wait; a push of a message already handed
over is answered as a duplicate. If the catch-up fails (the connection drops again), the next
one starts from the same epoch and skips what was handed meanwhile.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Iterable, Set
from typing import Protocol

from bus.core.pushes import PushOptions, push_window
from bus.core.topics import matches
from schemas.bus import SubscriptionInfo

from .errors import AuditUnavailable, EpochNotKept, PeerError, RequestRefused, ShuttingDown
from .messages import FetchPage, Message, Reply

__all__ = ["CATCH_UP_PAGE", "CatchUp", "Reader", "missed"]

logger = logging.getLogger("peers.client")

CATCH_UP_PAGE = 500
"""Messages asked for per ``fetchMessages`` call while catching up."""


class Reader(Protocol):
    """What a catch-up reads the bus with: a :class:`~peers.client.Peer`."""

    client_id: str

    async def list_subscriptions(self) -> list[SubscriptionInfo]: ...

    async def fetch(self, pattern: str, since_epoch: int = 0, limit: int = 100) -> FetchPage: ...


class CatchUp:
    """One peer's place in the bus's order, and its catch-ups.

    Call :meth:`begin` before a reconnect's ``initialize`` when :attr:`last_epoch` is known,
    then :meth:`run` once connected; pass each pushed epoch to :meth:`repeat` (True: drop it)
    and then :meth:`saw`, and wait on :attr:`delivering` before handing a push over.
    """

    def __init__(self) -> None:
        self.last_epoch: int | None = None
        """The epoch a reconnect catches up from: the latest of the first ``initialize`` and
        of the messages handed to handlers (None from a bus without epochs)."""
        self.delivering = asyncio.Event()
        """Set while deliveries may reach the handlers; cleared while a reconnect catches up,
        so that pushes wait for the missed messages to be handed over first."""
        self.delivering.set()
        # While a catch-up is unfinished (from the reconnect until it succeeds), last_epoch
        # stays put and the epochs handed meanwhile are remembered here instead, so that the
        # next catch-up skips them.
        self._catching_up = False
        self._handed: set[int] = set()
        self._fetched: set[int] = set()  # the last catch-up's epochs: pushes of them are dropped

    def begin(self) -> None:
        """A reconnect that will catch up starts: pushes wait from now on."""
        self._catching_up = True
        self.delivering.clear()

    def repeat(self, epoch: int | None) -> bool:
        """Whether the message at ``epoch`` was handed over already by a catch-up."""
        return epoch is not None and (epoch in self._fetched or epoch in self._handed)

    def saw(self, epoch: int | None) -> None:
        """Note that the message at ``epoch`` goes to the handlers."""
        if epoch is None:
            return
        if self._catching_up:
            self._handed.add(epoch)
        elif self.last_epoch is None or epoch > self.last_epoch:
            self.last_epoch = epoch

    async def run(self, peer: Reader, hand: Callable[[Message], Awaitable[Reply]]) -> None:
        """Hand ``hand``, in epoch order, what was sent after :attr:`last_epoch` on ``peer``'s
        subscriptions; then let the deliveries that waited through."""
        since = self.last_epoch
        assert since is not None
        try:
            subscriptions = await peer.list_subscriptions()
            fetched = await _fetch_since(peer, since, [s.topic for s in subscriptions])
            self._fetched = set(fetched)
            for message in missed(subscriptions, fetched.values(), skip=self._handed):
                self.saw(message.epoch)
                await hand(message)
        except PeerError as exc:
            if isinstance(exc, RequestRefused) and not isinstance(
                exc, AuditUnavailable | ShuttingDown
            ):
                # The bus cannot give the rest (-32009, -32010): go on without it.
                logger.error("%s: cannot catch up from epoch %s: %s", peer.client_id, since, exc)
                self._caught_up(since)
            else:
                # The connection or the bus failed meanwhile: the next reconnect tries again
                # from the same epoch, skipping what was handed.
                logger.warning(
                    "%s: catching up from epoch %s failed: %s", peer.client_id, since, exc
                )
        else:
            self._caught_up(max(self._fetched, default=since))
        finally:
            self.delivering.set()

    def _caught_up(self, epoch: int) -> None:
        self._catching_up = False
        self.last_epoch = max(epoch, *self._handed, self.last_epoch or 0)
        self._handed.clear()


async def _fetch_since(peer: Reader, since: int, patterns: list[str]) -> dict[int, Message]:
    """Every message after ``since`` on ``patterns``, by epoch, each once.

    Raises:
        RequestRefused: as :meth:`~peers.client.Peer.fetch`, but for an epoch the bus no longer
            keeps, from which it reads what is kept, and says so in the log.
    """
    found: dict[int, Message] = {}
    for pattern in patterns:
        cursor, more = since, True
        while more:
            try:
                page = await peer.fetch(pattern, cursor, limit=CATCH_UP_PAGE)
            except EpochNotKept as exc:
                if cursor != since:
                    raise
                cursor = _oldest_kept(exc)
                logger.error(
                    "%s: messages on %s before epoch %s are gone: %s",
                    peer.client_id,
                    pattern,
                    cursor + 1,
                    exc,
                )
                continue
            found.update((m.epoch, m) for m in page.messages if m.epoch is not None)
            cursor, more = page.next_epoch, page.more
    return found


def missed(
    subscriptions: Iterable[SubscriptionInfo], fetched: Iterable[Message], *, skip: Set[int]
) -> list[Message]:
    """What a catch-up hands the handlers: the ``fetched`` messages the ``subscriptions`` would
    have pushed, in epoch order, but those in ``skip``.

    As the bus pushes: a message below every matching subscription's ``minRelevance`` is left
    out; on a topic where every matching subscription that wants it debounces, only the latest
    is handed, with ``skipped`` counting the others.
    """
    subscriptions = list(subscriptions)
    handed: list[Message] = []
    held: dict[str, list[Message]] = {}
    for message in sorted(fetched, key=lambda m: m.epoch or 0):
        if message.epoch in skip:
            continue
        options = [
            PushOptions(s.debounce_ms, s.min_relevance)
            for s in subscriptions
            if matches(s.topic, message.topic)
        ]
        relevance = message.payload.get("relevance")
        window = push_window(options, relevance if isinstance(relevance, int | float) else None)
        if window == 0:
            handed.append(message)
        elif window is not None:
            held.setdefault(message.topic, []).append(message)
    for messages in held.values():
        latest = messages[-1]
        skipped = len(messages) - 1 or None
        handed.append(Message(latest.topic, latest.payload, latest.epoch, skipped))
    return sorted(handed, key=lambda m: m.epoch or 0)


def _oldest_kept(exc: EpochNotKept) -> int:
    """The epoch to fetch from to read what the bus keeps, from its -32009 ``data``."""
    data = exc.data if isinstance(exc.data, dict) else {}
    oldest = data.get("oldestEpoch")
    return oldest - 1 if type(oldest) is int and oldest > 0 else 0
