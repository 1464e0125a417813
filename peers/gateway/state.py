"""The gateway's bookkeeping, pure: bit budgets, per-task escalation, push rate limits, and the
approvals already decided.

No I/O here: the gateway records every change as an activity-log row (``bcp_bits_charged``,
``bcp_query_accepted``, ``bcp_delivered``, ``bcp_approval_decided``) and rebuilds these objects
from those rows when it starts (:mod:`peers.gateway.restore`), so the log is the one durable
ledger and a restart neither resets nor forgets a budget or a decision.

A channel's budget is counted per *session*: from the channel's first use, or from the last
``bcp_budget_reset`` row an operator wrote with ``bcpbus budget reset``, to now. A
controller reconnecting or the gateway restarting does not start a new session.
"""

from __future__ import annotations

from collections import OrderedDict, deque
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

from schemas.common import TaintLevel

__all__ = [
    "DECISION_STATUS",
    "DEFAULT_MAX_DECIDED",
    "ApprovalStatus",
    "ChannelKey",
    "Decided",
    "DecidedApprovals",
    "GatewayState",
    "Held",
    "Ledger",
    "Orphans",
    "QueryState",
    "RateLimiter",
    "Seal",
    "TaskTracker",
    "Verdict",
]

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
        """Give back what a charge reserved beyond what its outcome cost (see ``core.outcomes``)."""
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

    def last(self, key: tuple[str, str, str]) -> float | None:
        """Return when the latest accepted push under ``key`` was, or ``None``."""
        times = self._times.get(key)
        return times[-1] if times else None

    def record(self, key: tuple[str, str, str], now: float) -> None:
        """Note an accepted push at ``now``."""
        self._times.setdefault(key, deque()).append(now)


DEFAULT_MAX_DECIDED = 10_000
"""How many decided approvals :class:`DecidedApprovals` remembers by default.

Every approval ends (decided or expired after ``approval_timeout``), and a hostile reader can
cause approvals as fast as its budget and rate limits allow, so an unbounded record would grow
with the log. An entry is a few hundred bytes: the bound keeps it to a few megabytes. A late
decision comes from an approver who saw the request minutes earlier, and approvals are decided
at human speed, so the latest 10,000 cover that many times over; a decision on an older one
is refused as ``unknown_approval``."""


@dataclass(frozen=True)
class Decided:
    """How an approval ended: what the ``bcp_approval_decided`` row says."""

    status: str
    """``approved``, ``rejected``, ``edited`` or ``expired``."""
    decided_by: str
    """The approver's clientId, or ``system:gateway`` for an expiry."""
    decided_ts: str
    """When, RFC 3339."""
    note: str | None = None
    """Why an approval expired (the gateway's words; an approver's own reason is not kept)."""

    def describe(self) -> str:
        """Return how it ended in words: ``rejected by human:bob at ...`` or ``expired at ...``."""
        if self.status == "expired":
            text = f"expired at {self.decided_ts}"
            return f"{text} ({self.note})" if self.note else text
        return f"{self.status} by {self.decided_by} at {self.decided_ts}"


class QueryState(StrEnum):
    """Where a pending query stands."""

    APPROVING_ESCALATION = "approving_escalation"
    """An escalation into Cat-3 waits for a human before the reader is asked."""
    ASKING = "asking"
    """The reader has the query; its answers are taken until it expires."""
    SCREENING = "screening"
    """A valid answer waits for the channel's screeners; no other answer is taken meanwhile."""
    APPROVING = "approving"
    """A valid answer waits for a human; the approval's own timeout ends it."""


class ApprovalStatus(StrEnum):
    """How an approval stands: the ``status`` of its ``bcp_approval_decided`` row."""

    PENDING = "pending"
    APPROVED = "approved"
    REJECTED = "rejected"
    EDITED = "edited"
    EXPIRED = "expired"

    @property
    def accepted(self) -> bool:
        """Whether the answer or escalation goes ahead."""
        return self in (ApprovalStatus.APPROVED, ApprovalStatus.EDITED)


DECISION_STATUS = {
    "approve": ApprovalStatus.APPROVED,
    "reject": ApprovalStatus.REJECTED,
    "edit": ApprovalStatus.EDITED,
}
"""The status an approver's ``decision`` gives an approval."""


class DecidedApprovals:
    """The most recently decided approvals, by ``approval_id``, oldest forgotten first.

    The gateway keeps them so that a decision on an approval it already decided is refused as
    ``already_decided`` rather than ``unknown_approval``. Past ``max_entries`` the oldest is
    forgotten, and a late decision on it is refused as ``unknown_approval``; the
    ``bcp_approvals`` view still tells the whole story.
    """

    def __init__(self, max_entries: int = DEFAULT_MAX_DECIDED) -> None:
        if max_entries < 1:
            raise ValueError("max_entries must be at least 1")
        self.max_entries = max_entries
        self._entries: OrderedDict[str, Decided] = OrderedDict()

    def remember(self, approval_id: str, decided: Decided) -> None:
        """Note that ``approval_id`` ended as ``decided``; the first record of it stands."""
        if approval_id in self._entries:
            return  # BCP: the first decision is final.
        self._entries[approval_id] = decided
        while len(self._entries) > self.max_entries:
            self._entries.popitem(last=False)

    def get(self, approval_id: str) -> Decided | None:
        """Return how ``approval_id`` ended, or None if it is unknown or forgotten."""
        return self._entries.get(approval_id)

    def __len__(self) -> int:
        return len(self._entries)


@dataclass(frozen=True)
class Held:
    """A delivery waiting for its controller to come online: a ``bcp_held`` row."""

    hold_id: str
    controller: str
    content: dict[str, Any]
    """``{"type": ..., "content": ...}``: the message as it will be sent."""
    expires_at: float
    reader: str


@dataclass(frozen=True)
class Seal:
    """A sealed value: its text, kept by the gateway, and who may forward it until when.

    A ``bcp_sealed`` row; the controller has only :attr:`handle`.
    """

    handle: str
    controller: str
    reader: str
    text: str
    taint: TaintLevel
    """The text's taint, as a delivery would carry it: the reader's, one step down."""
    expires_at: float
    ref: dict[str, str]
    """``{"query_id": ...}`` or ``{"subscription_id": ...}``, and ``field``."""


@dataclass
class Orphans:
    """What was in flight when the gateway last stopped."""

    queries: list[tuple[str, str, str]] = field(default_factory=list)
    """``(controller, reader, query_id)`` accepted but never answered, failed or expired."""
    approvals: list[tuple[str, str, str]] = field(default_factory=list)
    """``(controller, reader, approval_id)`` requested but never decided."""
    charged: dict[tuple[str, str], float] = field(default_factory=dict)
    """``(controller, query_id)`` -> the bits an orphaned query was charged (its reserve):
    settling it gives back all but what a failure costs."""


@dataclass
class GatewayState:
    """Everything the gateway carries over a restart, as :mod:`.restore` reads it from the log.

    The gateway starts from it; ``orphans`` are then failed by ``Gateway.settle``.
    """

    ledger: Ledger = field(default_factory=Ledger)
    tasks: TaskTracker = field(default_factory=TaskTracker)
    rates: RateLimiter = field(default_factory=RateLimiter)
    used_query_ids: set[tuple[str, str]] = field(default_factory=set)
    """``(controller, query_id)`` pairs already used: a query id is never reused."""
    decided: DecidedApprovals = field(default_factory=DecidedApprovals)
    held: list[Held] = field(default_factory=list)
    """Held deliveries, oldest first."""
    sealed: dict[str, Seal] = field(default_factory=dict)
    """Sealed values by handle, until they expire."""
    orphans: Orphans = field(default_factory=Orphans)
