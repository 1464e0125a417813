"""What the bus knows of each open link, in one place. Pure: no sockets, no awaits, no clock.

One :class:`PeerState` per link (a WebSocket, an in-process link, a webhook peer) holds the
facts that outlive one request: when it joined, the error answers it got before it
authenticated, its debounce windows and the timers that push what they hold. The routing
facts (clientId, grants, subscriptions) stay in :class:`bus.core.router.Route`, which the
router indexes for delivery. :class:`PeerStates` creates a state when a link opens and forgets
it, with everything it holds, when the link closes: one place, so nothing is left behind::

    states: PeerStates[Connection] = PeerStates()
    state = states.open(conn)
    state.joined(timestamp())
    ...
    for timer in states.close(conn):
        timer.cancel()                 # the shell owns the loop's timers
"""

from __future__ import annotations

from collections.abc import Hashable, Iterator
from dataclasses import dataclass, field
from typing import Any, Generic, Protocol, TypeVar

from .pushes import Debounce

__all__ = ["MAX_ANONYMOUS_ERRORS", "PeerState", "PeerStates", "Timer"]

K = TypeVar("K", bound=Hashable)

MAX_ANONYMOUS_ERRORS = 10
"""Error answers a connection may get before a successful ``initialize``; then close 1008."""


class Timer(Protocol):
    """A timer the shell set for a state (an ``asyncio.TimerHandle``): it can be cancelled."""

    def cancel(self) -> None: ...


@dataclass(eq=False, slots=True)
class PeerState:
    """The facts about one link that are not routing facts."""

    since: str | None = None
    """When it joined (RFC 3339), for ``listPeers``; None while it has not authenticated."""
    errors_before_init: int = 0
    """Error answers it got before it authenticated."""
    debounce: Debounce[Any] = field(default_factory=Debounce)
    """Its subscriptions' debounce windows and the messages they hold."""
    timers: dict[str, Timer] = field(default_factory=dict)
    """The timer that pushes what a window holds, by topic."""

    def joined(self, moment: str) -> None:
        """It authenticated (or was attached) at ``moment``."""
        self.since = moment

    def count_error(self) -> bool:
        """Count one error answer before ``initialize``; True once it has had too many and
        must be closed (1008): otherwise anyone could fill the audit log with error rows."""
        self.errors_before_init += 1
        return self.errors_before_init >= MAX_ANONYMOUS_ERRORS

    def release(self) -> list[Timer]:
        """Forget what its windows hold; return the timers the shell must cancel."""
        timers = list(self.timers.values())
        self.timers.clear()
        self.debounce.clear()
        return timers


class PeerStates(Generic[K]):
    """The :class:`PeerState` of every open link."""

    def __init__(self) -> None:
        self._states: dict[K, PeerState] = {}

    def __len__(self) -> int:
        return len(self._states)

    def __iter__(self) -> Iterator[K]:
        return iter(self._states)

    def items(self) -> Iterator[tuple[K, PeerState]]:
        """Every open link with its state."""
        return iter(self._states.items())

    def open(self, link: K) -> PeerState:
        """The state of ``link``, created empty when it opens (or when it is first needed)."""
        state = self._states.get(link)
        if state is None:
            state = self._states[link] = PeerState()
        return state

    def get(self, link: K) -> PeerState | None:
        """The state of ``link``; None if it is not open."""
        return self._states.get(link)

    def close(self, link: K) -> list[Timer]:
        """Forget ``link`` and all it held; return the timers the shell must cancel."""
        state = self._states.pop(link, None)
        return [] if state is None else state.release()

    def close_all(self) -> list[Timer]:
        """Forget every link (the bus is closing); return the timers to cancel."""
        timers = [timer for state in self._states.values() for timer in state.release()]
        self._states.clear()
        return timers
