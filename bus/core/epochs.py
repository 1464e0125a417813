"""Epochs: the number the bus gives every message it accepts, in the order it accepted them.

An epoch is a 64-bit integer, strictly increasing in acceptance order and stable across
restarts: the clock starts above the highest epoch already in the activity log. It is also the
wall clock in microseconds since 1970 whenever that is higher than the last epoch plus one, so

- epochs have gaps: they order messages, they do not count them;
- a bus started on a new, empty log still gives higher epochs than the log it replaced (unless
  the system clock went back), so a peer holding an epoch from the old log gets a clear
  "older than kept" error from ``fetchMessages`` rather than silently missing messages;
- they stay below 2**53 until the year 2255, so JavaScript numbers hold them exactly.

On a node of a cluster (:mod:`bus.transports.cluster`) the epochs **follow the cluster's
stream** instead: :meth:`Epochs.follow` gives the base the nodes agreed on, and the message at
stream sequence ``seq`` has the epoch ``base + seq * STREAM_STEP`` on every node
(:meth:`Epochs.at`), so an epoch read on one node means the same on another. The few messages
a node gives outside the stream (the bus's own presence while it is cut off from NATS) take
:meth:`Epochs.next`, ``last + 1``, which stays below the next stream epoch: there is room for
``STREAM_STEP - 1`` of them between two stream messages.

Pure: the clock is passed in, nothing here waits::

    epochs = Epochs(last=log.last_epoch)
    epoch = epochs.next()        # strictly above every epoch given before
    epochs.follow(base)          # a cluster node: from now on, the stream's epochs
    epoch = epochs.at(seq)       # base + seq * STREAM_STEP, the same on every node
"""

from __future__ import annotations

import time
from collections.abc import Callable

__all__ = ["MAX_EPOCH", "STREAM_STEP", "Epochs", "NoRoom"]

MAX_EPOCH = (1 << 63) - 1
"""The largest epoch: SQLite's integers, and the wire's, are signed 64-bit."""
STREAM_STEP = 1000
"""Epochs between two messages of a cluster's stream: room for the messages a node gives
outside it (``last + 1``). Above a base near the clock (some 1.8e15 in 2027) the epochs stay
below 2**53, exact in JavaScript, for some 7e12 stream messages."""


class NoRoom(OverflowError):
    """A cluster node gave the ``STREAM_STEP - 1`` epochs between two stream messages already:
    the next one is the stream's."""


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
        self.base: int | None = None
        """The cluster's base (:meth:`follow`); None on a bus of its own."""
        self.on_read: Callable[[], None] | None = None
        """Told each time :meth:`at` moves this node's place in the stream (a read waiting for
        it to reach a cursor given on another node: :mod:`bus.readback`)."""

    def follow(self, base: int) -> None:
        """Give epochs from the cluster's stream from now on, above ``base``.

        Raises:
            ValueError: ``base`` is outside 1..2**63-1.
        """
        if not 0 < base <= MAX_EPOCH - STREAM_STEP:
            raise ValueError(f"base {base} is outside 1..2**63-1")
        self.base = base

    def read(self) -> int:
        """The stream sequence this node's epochs have reached: 0 if none of the stream
        above :attr:`base` (a node new to it), else the last whose epoch it gave or passed."""
        return self.seq_of(self.last)

    def seq_of(self, epoch: int) -> int:
        """The stream sequence at or before ``epoch`` (0: before the stream's first)."""
        if self.base is None or epoch < self.base:
            return 0
        return (epoch - self.base) // STREAM_STEP

    def at(self, seq: int) -> int:
        """The epoch of the stream's message ``seq``, now :attr:`last` (given or not).

        Raises:
            ValueError: not following a stream, or ``seq`` is not past what was read already.
        """
        if self.base is None:
            raise ValueError("this bus follows no stream")
        epoch = self.base + seq * STREAM_STEP
        if seq < 1 or epoch <= self.last:
            raise ValueError(f"stream sequence {seq} (epoch {epoch}) is not after {self.last}")
        if epoch > MAX_EPOCH:
            raise OverflowError("epochs exhausted: the stream is past 2**63-1")
        self.last = epoch
        if self.on_read is not None:
            self.on_read()
        return epoch

    def next(self) -> int:
        """Return the next epoch: above :attr:`last`, and at least the clock (on a cluster
        node, ``last + 1``, below the next stream epoch).

        Raises:
            NoRoom: on a cluster node, the room before the next stream epoch is used up.
            OverflowError: the epochs are exhausted (only a clock set some 290,000 years ahead).
        """
        if self.base is not None:
            epoch = self.last + 1
            if epoch > self.base and (epoch - self.base) % STREAM_STEP == 0:
                raise NoRoom(f"no epoch left before the stream's next ({epoch})")
            self.last = epoch
            return epoch
        epoch = max(self.last + 1, self._clock())
        if epoch > MAX_EPOCH:
            raise OverflowError("epochs exhausted: the clock or the log is past 2**63-1")
        self.last = epoch
        return epoch
