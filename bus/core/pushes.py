"""Which messages a subscription wants pushed: ``minRelevance`` and ``debounceMs``. Pure.

A subscription may ask for less than every message on its topics (Akashik SUBSCRIBE):

- ``minRelevance``: a message whose envelope ``relevance`` is below it is not pushed. A
  message with no ``relevance`` is pushed: the sender did not rate it, and most messages on a
  bus (presence, chats) never are.
- ``debounceMs``: after a push on a topic, further messages on that topic within the window are
  not pushed; when it ends, the latest of them is, with ``skipped``: how many others were not.
  So a peer never gets more than one push per topic per window.

A peer whose subscriptions overlap gets a message if any matching subscription wants it; if
every one that wants it debounces, the shortest window applies. Nothing here drops a message
from the bus: every one stays fetchable by epoch. :class:`Debounce` keeps one connection's
windows; the bus sets the timers it asks for::

    window = push_window(matching_options, relevance)   # None: skip; 0: push now; else ms
    offer = debounce.offer(topic, message, window / 1000, now)
    if offer.push: ...                                   # push now; a window opens
    elif offer.flush_at is not None: call_later(...)     # then debounce.due(topic, now)
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Generic, NamedTuple, TypeVar

__all__ = ["MAX_DEBOUNCED_TOPICS", "Debounce", "Offer", "PushOptions", "push_window"]

T = TypeVar("T")

MAX_DEBOUNCED_TOPICS = 1024
"""Topics one connection may have debounce windows open on. Past it, a message on a new topic
is pushed at once rather than held: memory stays bounded, and nothing is lost."""


@dataclass(frozen=True, slots=True)
class PushOptions:
    """What one subscription asked for; the defaults (0) push everything."""

    debounce_ms: int = 0
    min_relevance: float = 0.0

    @property
    def plain(self) -> bool:
        """Whether this subscription wants every message (no option set)."""
        return self.debounce_ms == 0 and self.min_relevance == 0


PLAIN = PushOptions()


def push_window(options: Iterable[PushOptions], relevance: float | None) -> int | None:
    """How a message should reach a peer whose matching subscriptions have ``options``.

    Returns:
        None: no subscription wants it (every one's ``minRelevance`` is above ``relevance``);
        0: push it now; otherwise the debounce window in milliseconds (the shortest among the
        subscriptions that want it).
    """
    window: int | None = None
    for option in options:
        if relevance is not None and relevance < option.min_relevance:
            continue
        if option.debounce_ms == 0:
            return 0
        window = option.debounce_ms if window is None else min(window, option.debounce_ms)
    return window


class Offer(NamedTuple):
    """What to do with a message offered to :meth:`Debounce.offer`."""

    push: bool
    """Push it now (a window opened); else it is held."""
    flush_at: float | None = None
    """When held and no flush is due yet: the time to call :meth:`Debounce.due` at."""


class _Window(Generic[T]):
    # A plain class rather than a dataclass: mypyc cannot compile a generic dataclass
    # (mypyc/mypyc#827), and the compiled build (setup.py) compiles this module.
    __slots__ = ("held", "latest", "seconds", "until")

    def __init__(self, until: float, seconds: float) -> None:
        self.until = until
        self.seconds = seconds
        self.latest: T | None = None
        self.held = 0


class Debounce(Generic[T]):
    """One connection's debounce windows, one per topic.

    Args:
        max_topics: windows kept at most; see :data:`MAX_DEBOUNCED_TOPICS`.
    """

    def __init__(self, max_topics: int = MAX_DEBOUNCED_TOPICS) -> None:
        self.max_topics = max_topics
        self._windows: dict[str, _Window[T]] = {}

    def __len__(self) -> int:
        """The topics with a window open or a message held."""
        return len(self._windows)

    def offer(self, topic: str, item: T, seconds: float, now: float) -> Offer:
        """Offer ``item``, a message on ``topic`` debounced by ``seconds``, at time ``now``.

        Returns:
            ``push=True``: push it now; a window of ``seconds`` opens. Else it is held as the
            latest on its topic: if ``flush_at`` is set, call :meth:`due` then (a held message
            already has its call due at the window's end, so only the first one gets one).
        """
        window = self._windows.get(topic)
        if window is None or (window.until <= now and window.latest is None):
            if window is None and not self._room(now):
                return Offer(push=True)  # full: push rather than hold, and keep no window
            self._windows[topic] = _Window(now + seconds, seconds)
            return Offer(push=True)
        # Within the window, or past it with a message held whose flush is due any moment:
        # this one replaces it, and that flush pushes this one.
        window.latest = item
        window.held += 1
        return Offer(push=False, flush_at=window.until if window.held == 1 else None)

    def due(self, topic: str, now: float) -> tuple[T, int] | None:
        """At the end of ``topic``'s window: the latest message held and how many other held
        ones it replaced (``skipped``), or None if none is held. A new window opens with it."""
        window = self._windows.get(topic)
        if window is None or window.latest is None:
            return None
        item, skipped = window.latest, window.held - 1
        window.latest, window.held = None, 0
        window.until = now + window.seconds
        return item, skipped

    def clear(self) -> None:
        """Forget every window and held message (they stay fetchable)."""
        self._windows.clear()

    def _room(self, now: float) -> bool:
        """Whether one more window fits, after dropping those that ended with nothing held."""
        if len(self._windows) < self.max_topics:
            return True
        ended = [t for t, w in self._windows.items() if w.until <= now and w.latest is None]
        for topic in ended:
            del self._windows[topic]
        return len(self._windows) < self.max_topics
