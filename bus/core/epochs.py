"""Epochs: the number the bus gives every message it accepts, in the order it accepted them.

An epoch is a 64-bit integer, strictly increasing in acceptance order and stable across
restarts: the clock starts above the highest epoch already in the activity log. It is also the
wall clock in microseconds since 1970 whenever that is higher than the last epoch plus one, so

- epochs have gaps: they order messages, they do not count them;
- a bus started on a new, empty log still gives higher epochs than the log it replaced (unless
  the system clock went back), so a peer holding an epoch from the old log gets a clear
  "older than kept" error from ``fetchMessages`` rather than silently missing messages;
- they stay below 2**53 until the year 2255, so JavaScript numbers hold them exactly.

Pure: the clock is passed in, nothing here waits::

    epochs = Epochs(last=log.last_epoch)
    epoch = epochs.next()        # strictly above every epoch given before
"""

from __future__ import annotations

import time
from collections.abc import Callable

__all__ = ["MAX_EPOCH", "Epochs"]

MAX_EPOCH = (1 << 63) - 1
"""The largest epoch: SQLite's integers, and the wire's, are signed 64-bit."""


def _micros() -> int:
    return time.time_ns() // 1000


class Epochs:
    """The epoch counter of one bus.

    Args:
        last: the highest epoch given so far (``ActivityLog.last_epoch``); 0 for none.
        clock: microseconds since 1970; the wall clock by default.
    """

    def __init__(self, last: int = 0, *, clock: Callable[[], int] = _micros) -> None:
        if not 0 <= last <= MAX_EPOCH:
            raise ValueError(f"last epoch {last} is outside 0..2**63-1")
        self.last = last
        """The highest epoch given so far; 0 before the first message ever."""
        self._clock = clock

    def next(self) -> int:
        """Return the next epoch: above :attr:`last`, and at least the clock.

        Raises:
            OverflowError: the epochs are exhausted (only a clock set some 290,000 years ahead).
        """
        epoch = max(self.last + 1, self._clock())
        if epoch > MAX_EPOCH:
            raise OverflowError("epochs exhausted: the clock or the log is past 2**63-1")
        self.last = epoch
        return epoch
