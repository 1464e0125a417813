"""What a query's outcome costs: the controller learns which outcome happened, so each is charged.

Once the reader has a query, the controller sees one of these outcomes: a delivery of one of the
``2**b`` answers its spec allows (``b`` is the answer's bits, :func:`peers.gateway.bits.spec_bits`),
or one of :data:`FAILURE_OUTCOMES`, each a different ``bcp_query_failed`` frame. A reader that
answers or declines on purpose picks among all of them, so all of them must be paid for.

The charges form a prefix code: one bit says whether the query was answered, then the answer's
``b`` bits or ``log2(F)`` bits for which of the ``F`` failures it was. So a delivery costs
``b + 1`` bits and a failure ``1 + log2(F)``, and Kraft's inequality holds with equality::

    2**b * 2**-(b + 1)  +  F * 2**-(1 + log2 F)  =  1/2 + 1/2  =  1

which is what makes the ledger an upper bound: over any run of queries, the controller can tell
apart at most ``2**C`` transcripts whose charges add up to ``C`` bits, whatever the reader does.
A refund that took a failure below ``1 + log2(F)`` (the seed refunded everything when the reader
was away) breaks the inequality, and a reader that declines on purpose moves bits for free.

The gateway reserves :attr:`OutcomeCharge.reserve` (the dearer of the two) when it passes the
query to the reader, and gives back the difference once the outcome is known. ``b`` there is the
most the answer may carry: the spec's ceiling (:func:`peers.gateway.bits.spec_ceiling`), or what
is left of the budget when that is less (:func:`reserve`); a delivery is then settled to what
its answer carries, not to ``b``. The slot the outcome is released in is charged on top
(:mod:`peers.gateway.timing`), reserved up to the query's last slot.

A refusal at admission is not charged: it follows from the controller's own request and the
channel's state (ids, categories, budget, task escalations), all of which the controller already
knows from earlier outcomes, before the reader has seen anything.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

__all__ = [
    "ANSWERED",
    "FAILED",
    "FAILURE_OUTCOMES",
    "OutcomeCharge",
    "Reserve",
    "outcome_charge",
    "reserve",
]

FAILURE_OUTCOMES = (
    "reader_unavailable: the reader did not take the query",
    "timeout: no valid answer before the query expired",
    "timeout: the gateway restarted before the query was answered",
    "retries_exhausted: the reader's answers kept failing",
    "approval_rejected: a human rejected the answer",
    "approval_rejected: nobody decided on the answer in time",
)
"""Every ``bcp_query_failed`` a controller can get once its query reached the reader.

Each differs from the others in ``error`` or ``detail``, so each counts as its own outcome.
A new way for an accepted query to fail belongs here, or the charges undercount it.
"""


ANSWERED = 1.0
"""What a delivery's outcome tells beyond its answer: one bit, "answered"."""

FAILED = 1.0 + math.log2(len(FAILURE_OUTCOMES))
"""What a failure tells: one bit, "failed", then which of the failures."""


@dataclass(frozen=True)
class OutcomeCharge:
    """The bits one query is charged, by outcome."""

    answer_bits: float
    """The most its answer can carry (``bandwidth_bits`` of its delivery)."""
    delivered: float
    """What a delivery costs in the end: the answer's bits plus one."""
    failed: float
    """What a failure costs in the end: one bit plus which failure it was."""

    @property
    def reserve(self) -> float:
        """What the query is charged when the reader gets it: the dearer outcome."""
        return max(self.delivered, self.failed)


def outcome_charge(answer_bits: float) -> OutcomeCharge:
    """Return what a query whose answer carries ``answer_bits`` costs, by outcome."""
    return OutcomeCharge(answer_bits, answer_bits + ANSWERED, FAILED)


@dataclass(frozen=True)
class Reserve:
    """What a query is charged when its reader gets it, and what its answer may then carry."""

    total: float
    """The charge: the dearer outcome with the most its answer may carry, and the last slot."""
    cap: float
    """The most the delivered value may carry (the answer, and a flag channel's codes)."""


def reserve(estimate: float, ceiling: float, timing: float, left: float) -> Reserve:
    """Return what to reserve for a query: its ceiling, or all that is left when that is less.

    Args:
        estimate: the spec's estimate (:func:`peers.gateway.bits.spec_bits`): admission
            checked that its reserve fits, so the answer may carry at least this.
        ceiling: the most any answer may carry (:func:`peers.gateway.bits.spec_ceiling`).
        timing: what the query's last slot costs (:func:`peers.gateway.timing.slot_bits`).
        left: what is left of the channel's budget.
    """
    low = outcome_charge(estimate).reserve + timing
    high = outcome_charge(ceiling).reserve + timing
    total = max(low, min(high, left))
    return Reserve(total, max(estimate, min(ceiling, total - timing - ANSWERED)))
