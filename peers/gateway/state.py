"""The gateway's bookkeeping, pure: bit budgets, per-task escalation, and push rate limits.

No I/O here: the gateway records every change as an activity-log row (``bcp_bits_charged``,
``bcp_query_accepted``, ``bcp_delivered``) and rebuilds these objects from those rows when it
starts (:mod:`peers.gateway.restore`), so the log is the one durable ledger and a restart neither
resets nor forgets a budget.

A channel's budget is counted per *session*: from the channel's first use, or from the last
``bcp_budget_reset`` row an operator wrote with ``bcpbus gateway reset-budget``, to now. A
controller reconnecting or the gateway restarting does not start a new session.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

__all__ = ["ChannelKey", "Ledger", "RateLimiter", "TaskTracker", "Verdict"]

ChannelKey = tuple[str, str]
"""``(controller, reader)`` agent names."""


@dataclass
class _Account:
    bits_used: float = 0.0
    cat2_used: int = 0


class Ledger:
    """Bits and Cat-2 queries used per channel in the current session."""

    def __init__(self) -> None:
        self._accounts: dict[ChannelKey, _Account] = {}

    def used(self, channel: ChannelKey) -> float:
        """Return the bits charged to ``channel`` so far."""
        account = self._accounts.get(channel)
        return account.bits_used if account else 0.0

    def cat2_used(self, channel: ChannelKey) -> int:
        """Return the Cat-2 queries charged to ``channel`` so far."""
        account = self._accounts.get(channel)
        return account.cat2_used if account else 0

    def left(self, channel: ChannelKey, budget_bits: float) -> float:
        """Return what is left of ``budget_bits``; never negative."""
        return max(0.0, budget_bits - self.used(channel))

    def fits(self, channel: ChannelKey, bits: float, budget_bits: float) -> bool:
        """Return whether ``bits`` more stay within ``budget_bits``.

        A tolerance of 1e-9 absorbs float sums, so a budget of exactly 671 bits admits one
        671.0-bit charge.
        """
        return self.used(channel) + bits <= budget_bits + 1e-9

    def charge(self, channel: ChannelKey, bits: float, *, cat2: bool = False) -> None:
        """Add a charge. Check :meth:`fits` first: this never refuses."""
        account = self._accounts.setdefault(channel, _Account())
        account.bits_used += bits
        if cat2:
            account.cat2_used += 1

    def refund(self, channel: ChannelKey, bits: float, *, cat2: bool = False) -> None:
        """Take back a charge whose query never reached the reader."""
        account = self._accounts.setdefault(channel, _Account())
        account.bits_used = max(0.0, account.bits_used - bits)
        if cat2:
            account.cat2_used = max(0, account.cat2_used - 1)

    def reset(self, channel: ChannelKey) -> None:
        """Start a new session for ``channel``."""
        self._accounts.pop(channel, None)


@dataclass(frozen=True)
class Verdict:
    """The escalation check's answer: ``ok``, or the refusal reason code."""

    ok: bool
    reason: str | None = None
    escalation: bool = False
    """True when the query raises the task's category (it then counts against the limit)."""


@dataclass
class _Task:
    max_category: int
    escalations: int = 0


class TaskTracker:
    """The highest category each ``task_id`` has used, and its escalations.

    BCP escalation: a query whose category is higher than every earlier query of the same task
    is an escalation; it must carry ``escalation_justification`` and counts against the channel's
    ``max_escalations_per_task``. Queries without ``task_id`` are never escalations.
    """

    def __init__(self) -> None:
        self._tasks: dict[tuple[str, str, str], _Task] = {}

    def check(
        self,
        channel: ChannelKey,
        task_id: str | None,
        category: int,
        *,
        justified: bool,
        max_escalations: int,
    ) -> Verdict:
        """Return whether a query of ``category`` for ``task_id`` may go ahead."""
        if task_id is None:
            return Verdict(True)
        task = self._tasks.get((*channel, task_id))
        if task is None or category <= task.max_category:
            return Verdict(True)
        if not justified:
            return Verdict(False, "escalation_requires_justification", escalation=True)
        if task.escalations >= max_escalations:
            return Verdict(False, "escalation_limit_reached", escalation=True)
        return Verdict(True, escalation=True)

    def category_of(self, channel: ChannelKey, task_id: str | None) -> int | None:
        """Return the highest category ``task_id`` has used, or None for a new task."""
        task = self._tasks.get((*channel, task_id)) if task_id is not None else None
        return task.max_category if task is not None else None

    def record(self, channel: ChannelKey, task_id: str | None, category: int) -> None:
        """Note an accepted query: raise the task's category, count an escalation."""
        if task_id is None:
            return
        key = (*channel, task_id)
        task = self._tasks.get(key)
        if task is None:
            self._tasks[key] = _Task(category)
        elif category > task.max_category:
            task.max_category = category
            task.escalations += 1


@dataclass
class RateLimiter:
    """Accepted pushes per subscription, for ``min_interval_s`` and ``max_per_hour``.

    Times are seconds on any clock that only moves forward (the gateway uses wall-clock
    seconds so that the limits survive a restart).
    """

    _times: dict[tuple[str, str, str], deque[float]] = field(default_factory=dict)

    def allows(
        self,
        key: tuple[str, str, str],
        now: float,
        *,
        min_interval_s: float | None,
        max_per_hour: int | None,
    ) -> bool:
        """Return whether a push under ``key`` at ``now`` keeps within both limits."""
        times = self._times.get(key)
        if not times:
            return True
        while times and times[0] <= now - 3600:
            times.popleft()
        if min_interval_s is not None and times and now - times[-1] < min_interval_s:
            return False
        return max_per_hour is None or len(times) < max_per_hour

    def record(self, key: tuple[str, str, str], now: float) -> None:
        """Note an accepted push at ``now``."""
        self._times.setdefault(key, deque()).append(now)
