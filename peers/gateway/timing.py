"""Time as a charged quantity: deliveries to a controller leave on a grid, and the slot is paid.

A controller sees *when* each delivery arrives. Left alone, that time is a channel a reader
drives: it answers early or late, it fails a retry or two on purpose (each adds a few
milliseconds), it pushes now or in a minute. So every delivery to a controller (an answer, a
push, a ``bcp_query_failed``) is released at a point of a grid of step ``delivery_quantum``
seconds laid from an *anchor* the controller knows:

- for a query, the moment the reader was asked;
- for a push, the moment the subscription allowed it: the previous push's grid point plus
  ``min_interval_s``, or the gateway's start (the grid point, not the moment the reader
  pushed, which would show in the next push's release time).

Whatever happened within a step, the controller sees only the slot ``k`` (the ``k``-th step
after the anchor). That slot is what the reader still chooses, and it is charged
:func:`slot_bits`: ``1 + min(gamma(k + 1), log2(N))`` bits, where ``gamma(n) = 2 floor(log2 n)
+ 1`` is Elias gamma's length and ``N`` the number of slots a query can end in (its time to
live, screening and approval, over the step). So 2 bits for the first step, 4 for the next two,
and never more than ``1 + log2(N)``: 12.6 bits for a query that may wait 300 s on a 0.1 s grid.
A push has no last slot and pays ``1 + gamma(k + 1)``. Either way the lengths satisfy Kraft's
inequality (the minimum of two codes plus one bit: ``sum 2**-(1 + min(a, b)) <= (sum 2**-a +
sum 2**-b) / 2 <= 1``), so the slots of a run of deliveries add at most their charge to what a
controller can tell apart. A query's charge is reserved up to its dearest slot and settled to
the slot it used.

Pure: no clock is read here; the core passes times in.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from schemas.agents import DEFAULT_DELIVERY_QUANTUM, DEFAULT_MIN_INTERVAL_S

__all__ = [
    "DEFAULT_DELIVERY_QUANTUM",
    "DEFAULT_MIN_INTERVAL_S",
    "Release",
    "max_slot",
    "release",
    "slot_bits",
]


@dataclass(frozen=True, slots=True)
class Release:
    """When a delivery leaves, and what its timing is charged."""

    at: float
    """The grid point it is released at (same clock as the times given)."""
    slot: int
    """Steps after the anchor: 0 for the first."""
    bits: float
    """:func:`slot_bits` of :attr:`slot`."""


def slot_bits(slot: int, slots: int | None = None) -> float:
    """Return what releasing in ``slot`` (0, 1, ...) of ``slots`` tells a controller.

    ``1 + min(gamma(slot + 1), log2(slots))``; ``slots`` None (a push): ``1 + gamma(slot + 1)``.
    """
    gamma = float(2 * ((slot + 1).bit_length() - 1) + 1)
    return 1.0 + (gamma if slots is None else min(gamma, math.log2(max(slots, 1))))


def max_slot(window: float, quantum: float) -> int:
    """Return the last slot of a delivery that comes at most ``window`` s after its anchor."""
    if quantum <= 0:
        return 0
    return math.floor(max(0.0, window) / quantum)


def release(anchor: float, now: float, quantum: float, *, last: int | None = None) -> Release:
    """Return when a delivery whose outcome is known at ``now`` leaves, and its slot's charge.

    Args:
        anchor: the moment the grid is laid from (see the module docstring).
        now: the moment the outcome became known.
        quantum: the channel's ``delivery_quantum``; 0 turns the grid off (release at once,
            slot 0, and timing is not counted: for tests and trusted readers only).
        last: a query's last slot (:func:`max_slot`), which bounds its charge; a later one
            (the gateway was slow) is charged as this one. ``None`` for a push.
    """
    if quantum <= 0:
        return Release(now, 0, 0.0)
    slot = max(0, math.floor((now - anchor) / quantum))
    if last is None:
        return Release(anchor + (slot + 1) * quantum, slot, slot_bits(slot))
    charged = slot_bits(min(slot, last), last + 1)
    return Release(anchor + (slot + 1) * quantum, slot, charged)
