"""The ``messageId``\\ s each sender used recently, to refuse a message sent twice.

A publisher that loses the answer to ``sendMessage`` (a dropped connection, a timeout) cannot tell
whether the bus delivered it, so it sends it again with the same ``messageId``. The bus refuses
the second one with -32008 instead of delivering it twice. Remembering every id forever would need
unbounded memory, so the set forgets an id after ``window`` seconds, or sooner when more than
``max_ids`` newer ids arrived. The promise is therefore "no duplicate within the window, unless the
bus saw more than ``max_ids`` other messages in between"; docs/protocol.md states it.

Pure: the caller passes the clock in, so tests need no event loop and no sleeps::

    recent = RecentIds(window=300.0, max_ids=100_000)
    if not recent.claim(("tg:42", "m-1"), now):
        raise DuplicateMessage(...)
    ...                                  # delivery failed before anything was sent:
    recent.release(("tg:42", "m-1"))     # let a retry through
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Hashable

__all__ = ["RecentIds"]


class RecentIds:
    """A time- and count-bounded set of keys.

    Args:
        window: seconds a key is remembered after it was claimed.
        max_ids: most keys remembered; the oldest are forgotten first. None for no count bound.
    """

    def __init__(self, *, window: float, max_ids: int | None) -> None:
        self.window = window
        self.max_ids = max_ids
        self._seen: OrderedDict[Hashable, float] = OrderedDict()
        """Key -> the time it was claimed, oldest first (claims only append)."""

    def __len__(self) -> int:
        return len(self._seen)

    def claim(self, key: Hashable, now: float) -> bool:
        """Remember ``key`` at time ``now``; return False if it is already remembered.

        Call :meth:`release` if what the key stands for did not happen after all.
        """
        self._expire(now)
        if key in self._seen:
            return False
        self._seen[key] = now
        if self.max_ids is not None and len(self._seen) > self.max_ids:
            self._seen.popitem(last=False)
        return True

    def release(self, key: Hashable) -> None:
        """Forget ``key`` so that it can be claimed again."""
        self._seen.pop(key, None)

    def _expire(self, now: float) -> None:
        deadline = now - self.window
        seen = self._seen
        while seen:
            key, claimed = next(iter(seen.items()))
            if claimed > deadline:
                return
            del seen[key]
