"""What the bus watches per socket, as pure decisions: no sockets, no awaits, the clock passed in.

- :class:`Anonymous` counts the sockets that have not initialized yet, in total and per remote
  address, so that the handshake of one more can be refused (HTTP 503) before anonymous sockets
  take the places of peers.
- :class:`SlowConsumers` remembers since when each peer has not kept up with what the bus writes
  to it, and says which have been behind for longer than the timeout (close 4004).

The bus (:mod:`bus.server`) feeds them what happened and carries out what they decide.
"""

from __future__ import annotations

import collections
import logging
from collections.abc import Hashable, Iterable
from typing import Generic, TypeVar

from .actions import Action, Close, Record
from .errors import CLOSE_SLOW_CONSUMER
from .logevents import LogEvent

__all__ = ["Anonymous", "SlowConsumers", "disconnect_slow"]

logger = logging.getLogger("bus.server")

K = TypeVar("K", bound=Hashable)


class Anonymous:
    """Sockets that have not initialized, against a total and a per-address limit.

    Args:
        total: most such sockets at once; None for no limit.
        per_address: most from one remote address; None for no limit.
    """

    def __init__(self, *, total: int | None, per_address: int | None) -> None:
        self.total = total
        self.per_address = per_address
        self._count: collections.Counter[str] = collections.Counter()

    def __len__(self) -> int:
        return self._count.total()

    def refusal(self, address: str) -> tuple[str, int] | None:
        """The limit (its config name and value) one more socket from ``address`` would pass,
        or None if it may open."""
        if self.total is not None and self._count.total() >= self.total:
            return "max_anonymous_connections", self.total
        if self.per_address is not None and self._count[address] >= self.per_address:
            return "max_anonymous_per_address", self.per_address
        return None

    def opened(self, address: str) -> None:
        """A socket from ``address`` opened and has not initialized."""
        self._count[address] += 1

    def closed(self, address: str) -> None:
        """A socket from ``address`` initialized or closed before it did."""
        self._count[address] -= 1
        if self._count[address] <= 0:
            del self._count[address]


class SlowConsumers(Generic[K]):
    """Since when each peer has been behind, and who has been behind too long.

    Args:
        timeout: seconds a peer may stay behind before :meth:`check` names it.
    """

    def __init__(self, timeout: float) -> None:
        self.timeout = timeout
        self._since: dict[K, float] = {}

    def check(self, behind: Iterable[tuple[K, bool]], now: float) -> list[K]:
        """Take each peer's state now (``True``: behind); return those behind for ``timeout``.

        A peer returned is forgotten, as is a peer that caught up. Call :meth:`forget` for a
        peer that left.
        """
        expired: list[K] = []
        since = self._since
        for key, is_behind in behind:
            started = since.get(key)
            if not is_behind:
                since.pop(key, None)
            elif started is None:
                since[key] = now
            elif now - started >= self.timeout:
                del since[key]
                expired.append(key)
        return expired

    def forget(self, key: K) -> None:
        """Stop watching ``key`` (it disconnected)."""
        self._since.pop(key, None)


def disconnect_slow(link: K, name: str, unread: int, timeout: float) -> list[Action]:
    """What to do with a peer :meth:`SlowConsumers.check` named: a ``slow_consumer`` row, and
    a forced close with 4004 (its unread bytes would hold a polite close too)."""
    logger.info("disconnecting slow consumer %s (%d bytes unread)", name, unread)
    error = f"{unread} bytes unread, nothing written for {timeout:g}s"
    return [
        Record(LogEvent.SLOW_CONSUMER, actor=name, status=str(CLOSE_SLOW_CONSUMER), error=error),
        Close(link, CLOSE_SLOW_CONSUMER, "slow consumer", force=True),
    ]
