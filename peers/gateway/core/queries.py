"""Queries: a request checked and admitted or refused, the reader asked, the query failed,
expired or completed.

:meth:`Queries.check` runs every check on a controller's ``bcp_query_request`` and reserves
nothing; :meth:`Queries.ask_reader` charges the query its dearer outcome and sends it;
:meth:`Queries.fail` and :meth:`Queries.complete` end it with a ``bcp_query_failed`` or a
delivery to the controller, held if it is offline, and give back what that outcome does not
cost (see :mod:`.outcomes`): a failure is charged too, as the controller learns of it.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from bus.core.logevents import LogEvent
from schemas.agents import Channel
from schemas.bcp import (
    ID_PATTERN,
    BcpQuery,
    BcpQueryFailed,
    BcpQueryRequest,
    DeliveryBits,
    NormalizedResponse,
    QuerySpec,
    ReasonCode,
)
from schemas.common import agent_id

from .. import timing
from ..bits import findings_bits, spec_bits, spec_ceiling
from ..events import (
    Action,
    CancelTimer,
    Commit,
    MessageReceived,
    Record,
    Respond,
    Send,
    SetTimer,
    Spawn,
)
from ..state import QueryState
from .context import GATEWAY_CLIENT_ID, Context, Leaving, Query, Refusal, channel_of, parse
from .frames import codes_only, delivery, question, wire
from .outbox import Outbox
from .outcomes import ANSWERED, FAILED, outcome_charge, reserve
from .sealed import seal, sealed_charge

__all__ = ["Admitted", "Queries", "Refused"]

_ID_RE = re.compile(ID_PATTERN)

_ESCALATION_TEXT = {
    "escalation_requires_justification": "a higher category than earlier queries of this task "
    "needs escalation_justification",
    "escalation_limit_reached": "this task has used its max_escalations_per_task",
}


@dataclass(frozen=True)
class Admitted:
    """A query request that passed every check; nothing is reserved yet."""

    channel: Channel
    request: BcpQueryRequest
    spec: QuerySpec
    bits: float
    escalation: bool
    """True when a Cat-3 escalation must be approved by a human before the reader is asked."""


@dataclass(frozen=True)
class Refused:
    """A query request refused at once: carry out ``actions`` in order."""

    actions: tuple[Action, ...]


class Queries:
    """Admit, ask, fail, expire and complete queries."""

    def __init__(self, ctx: Context, outbox: Outbox) -> None:
        self.ctx = ctx
        self.outbox = outbox

    def check(self, event: MessageReceived) -> Admitted | Refused:
        """Check a ``bcp_query_request``; reserve nothing.

        Returns :class:`Admitted`, which the caller must charge before anything else runs, or
        :class:`Refused`, whose actions it must carry out in order.
        """
        query_id = str(event.content.get("query_id", ""))[:128] or None
        try:
            channel = channel_of(self.ctx.channels, event, sender_is="controller")
            request = parse(BcpQueryRequest, event.content)
            query_id = request.query_id
            return self._admit(channel, request)
        except Refusal as refusal:
            return Refused(_refuse_query(event, query_id, refusal))

    def _admit(self, channel: Channel, request: BcpQueryRequest) -> Admitted:
        state, key = self.ctx.state, channel.key
        if (channel.controller, request.query_id) in state.used_query_ids:
            raise Refusal(ReasonCode.DUPLICATE_QUERY_ID, f"query_id {request.query_id!r} was used")
        if not channel.allows(request.category):
            raise Refusal(
                ReasonCode.CATEGORY_NOT_ALLOWED,
                f"category {request.category} is above this channel's max_category "
                f"{channel.max_category}",
            )
        spec = request.as_spec()
        bits = spec_bits(spec)
        least = self.least(channel, spec, bits)
        if not state.ledger.fits(key, least, channel.budget_bits):
            left = state.ledger.left(key, channel.budget_bits)
            raise Refusal(
                ReasonCode.BUDGET_EXHAUSTED,
                f"this query needs {least:.1f} bits; {left:.1f} of {channel.budget_bits:.1f} "
                f"are left{self._in_flight(channel)}",
            )
        limit = channel.max_cat2_queries
        if request.category == 2 and limit is not None and state.ledger.cat2_used(key) >= limit:
            raise Refusal(ReasonCode.CAT2_LIMIT_REACHED, f"max_cat2_queries ({limit}) used up")
        verdict = state.tasks.check(
            key,
            request.task_id,
            request.category,
            justified=bool(request.escalation_justification),
            max_escalations=channel.max_escalations_per_task,
        )
        if verdict.reason is not None:
            raise Refusal(verdict.reason, _ESCALATION_TEXT[verdict.reason])
        escalation = verdict.escalation and request.category == 3
        return Admitted(channel, request, spec, bits, escalation)

    def _in_flight(self, channel: Channel) -> str:
        """Say so when queries still hold reserves on ``channel``: the refusal may pass later."""
        ctx = self.ctx
        asking = [q for q in ctx.pending.values() if q.channel.key == channel.key and q.charged]
        queued = ctx.releases.get(channel.controller, [])
        leaving = [r for r in queued if r.channel == channel and "query_id" in r.content]
        if not asking and not leaving:
            return ""
        return (
            f" ({len(asking) + len(leaving)} queries in flight hold reserves and give back what "
            "they do not use when their outcome is delivered: ask again then)"
        )

    def least(self, channel: Channel, spec: QuerySpec, estimate: float) -> float:
        """Return the least a query of ``estimate`` bits reserves: what admission checks."""
        return outcome_charge(estimate).reserve + self._last_slot_bits(channel, spec)

    def _last_slot_bits(self, channel: Channel, spec: QuerySpec) -> float:
        if not channel.delivery_quantum:
            return 0.0
        last = self.ctx.last_slot(channel, spec.category)
        return timing.slot_bits(last, last + 1)

    def open(self, admitted: Admitted) -> Query:
        """Start a query from an admitted request; its id is used from now on."""
        request = admitted.request
        query = Query(
            admitted.channel,
            request.query_id,
            admitted.spec,
            admitted.bits,
            self.ctx.settings.max_retries + 1,
            request.task_id,
        )
        self.ctx.state.used_query_ids.add((admitted.channel.controller, query.query_id))
        return query

    def ask_reader(self, query: Query, message_id: str) -> list[Action]:
        """Charge ``query`` and send it to the reader; reply ``accepted`` once it took it.

        It is charged its dearer outcome with the most its answer may carry, and its last slot
        (:func:`~.outcomes.reserve`) now; a reader that takes nothing is one of the failures,
        charged like the others.
        """
        ctx, channel, key = self.ctx, query.channel, query.channel.key
        last = self._last_slot_bits(channel, query.spec)
        flag = channel.anomaly_action == "flag"
        left = ctx.state.ledger.left(key, channel.budget_bits)
        held = reserve(query.bits, spec_ceiling(query.spec, flag=flag), last, left)
        ctx.state.ledger.charge(key, held.total, cat2=query.spec.category == 2)
        query.charged, query.cap, query.asked_at = held.total, held.cap, ctx.clock()
        ctx.state.tasks.record(key, query.task_id, query.spec.category)
        content = self._question(query)
        ctx.pending[(channel.controller, query.query_id)] = query
        query.state = QueryState.ASKING
        ref = {"query_id": query.query_id, "category": query.spec.category}
        accepted = ctx.record(
            LogEvent.BCP_QUERY_ACCEPTED,
            channel,
            "accepted",
            **ref,
            task_id=query.task_id,
            bits=query.bits,
            spec=ctx.content(query.spec.model_dump(mode="json", exclude_none=True)),
            message_id=message_id,
        )

        def sent(delivered_to: int) -> list[Action]:
            if delivered_to:
                return []
            # The controller learns that the reader was away: an outcome, charged as a failure.
            detail = f"{agent_id(channel.reader)} did not take it"
            return self.fail(query, ReasonCode.READER_UNAVAILABLE, detail)

        send = ctx.send_then(agent_id(channel.reader), "bcp_query", content, sent)
        charged = ctx.charged(channel, held.total, **ref, answer_bits=held.cap)
        # The controller's reply does not wait for the reader's: a reader that held its
        # processMessage answer back would otherwise time the controller's sendMessage, a
        # channel no grid point covers. The query's time runs from now, whenever it is taken.
        return [
            accepted,
            charged,
            Commit(),
            SetTimer(query.timer, ctx.settings.query_ttl),
            Respond(True, "accepted"),
            Spawn((send,)),
        ]

    def _question(self, query: Query) -> BcpQuery:
        """What the reader is asked: the spec, whose query it is, until when it may answer."""
        ctx = self.ctx
        expires_at = ctx.clock() + ctx.settings.query_ttl
        return question(query.spec, query.query_id, query.channel.controller, expires_at)

    def fail(self, query: Query, reason: str, detail: str) -> list[Action]:
        """End ``query`` with ``bcp_query_failed`` to its controller, after a committed row.

        One the reader had is charged its failure and its slot, and leaves on the grid; one it
        never had (an escalation refused, a restart's stand-in) is not charged and leaves now.
        """
        channel = query.channel
        self.ctx.pending.pop((channel.controller, query.query_id), None)
        fields: dict[str, Any] = {"query_id": query.query_id, "error": reason, "detail": detail}
        cost: float | None = None
        at = None
        if query.asked_at is not None:
            # reader_unavailable too: a reader can answer its processMessage "not taken" when
            # it likes, so that moment is a slot like any other.
            slot = self._slot(query)
            bits = DeliveryBits(value=0.0, outcome=FAILED, timing=slot.bits)
            cost = FAILED + slot.bits
            fields["bits"] = bits
            at = slot.at
        failed = BcpQueryFailed.model_validate(fields)
        split = fields["bits"].model_dump() if "bits" in fields else None
        row = self.ctx.record(
            LogEvent.BCP_QUERY_FAILED,
            channel,
            reason,
            query_id=query.query_id,
            detail=detail,
            split=split,
        )
        settle = None if cost is None else self._settle_on_release(query, cost, reason)
        return [
            CancelTimer(query.timer),
            row,
            Commit(),
            *self.outbox.deliver(channel, "bcp_query_failed", wire(failed), at=at, leaving=settle),
        ]

    def _slot(self, query: Query) -> timing.Release:
        assert query.asked_at is not None
        last = self.ctx.last_slot(query.channel, query.spec.category)
        quantum = query.channel.delivery_quantum
        return timing.release(query.asked_at, self.ctx.clock(), quantum, last=last)

    def expire(self, controller: str, query_id: str) -> list[Action]:
        """Fail a query that got no valid answer in time; one under approval waits for it.

        An answer with the screeners when time runs out gets their verdict first: the query is
        looked at again ``screener_timeout`` seconds later, by when they have decided.
        """
        query = self.ctx.pending.get((controller, query_id))
        if query is not None and query.state is QueryState.SCREENING:
            return [SetTimer(query.timer, self.ctx.settings.screener_timeout)]
        if query is None or query.state is not QueryState.ASKING:
            return []  # Already ended, or an approval is under way and its own timeout ends it.
        row = self.ctx.record(LogEvent.BCP_EXPIRED, query.channel, "timeout", query_id=query_id)
        detail = "no valid answer before the query expired"
        return [row, *self.fail(query, ReasonCode.TIMEOUT, detail)]

    def complete(
        self,
        query: Query,
        response: NormalizedResponse,
        found: list[dict[str, Any]],
        value_bits: float,
    ) -> list[Action]:
        """Deliver a valid (or approved) answer to the controller at its grid point.

        It is charged what it carries (``value_bits``, and a flag channel's codes), one bit
        for the outcome, and its slot; the rest of the reserve comes back.
        """
        channel = query.channel
        self.ctx.pending.pop((channel.controller, query.query_id), None)
        # A sealed field's text is not delivered: only its facts are charged.
        value_bits = sealed_charge(query.spec, response, value_bits)
        if found and channel.anomaly_action == "flag":
            codes = [(f.get("field"), f["code"]) for f in codes_only(query.spec, found)]
            value_bits += findings_bits(query.spec, codes)
        elif channel.anomaly_action == "flag":
            value_bits += findings_bits(query.spec, [])
        slot = self._slot(query)
        bits = DeliveryBits(value=value_bits, outcome=ANSWERED, timing=slot.bits)
        ref = {"query_id": query.query_id}
        values, sealed = seal(self.ctx, channel, query.spec, response, found, **ref)
        content = delivery(channel, query.spec, values, bits, found, **ref)
        settle = self._settle_on_release(query, value_bits + ANSWERED + slot.bits, "delivered")
        return [
            CancelTimer(query.timer),
            *sealed,
            *self.outbox.deliver(
                channel, "bcp_response_delivery", content, at=slot.at, leaving=settle
            ),
        ]

    def _settle_on_release(self, query: Query, cost: float, outcome: str) -> Leaving:
        """Return what settles ``query`` once its outcome leaves for the controller.

        Not before: the budget left decides admission, so a refund at the moment the reader
        answered would show that moment to a controller probing with queries it expects
        refused, finer than the grid. A lost refund row only leaves the ledger charging more:
        no commit is needed for it.
        """
        return lambda: (True, self._settle(query, cost, outcome))

    def _settle(self, query: Query, cost: float, outcome: str) -> list[Action]:
        """Give back what ``query`` was charged beyond ``cost``, what its outcome costs."""
        refund = query.charged - cost
        if abs(refund) <= 1e-9 or not query.charged:
            return []  # Not charged (refused before the reader), or charged exactly that.
        channel = query.channel
        if refund > 0:
            self.ctx.state.ledger.refund(channel.key, refund)
        else:
            # More than reserved (a human's edit measured more): the ledger records it all.
            self.ctx.state.ledger.charge(channel.key, -refund)
        query.charged = cost
        ref = {"query_id": query.query_id, "category": query.spec.category}
        return [self.ctx.charged(channel, -refund, **ref, outcome=outcome)]

    def orphan(self, channel: Channel, query_id: str) -> Query:
        """Return a stand-in for a query that was in flight when the gateway stopped."""
        return Query(channel, query_id, QuerySpec.model_construct(category=1), 0.0, 0, None)

    def refund_orphan(self, query: Query, charged: float) -> list[Action]:
        """Give back what a restart's stand-in was ``charged`` (its reserve) beyond what a
        failure costs: without it, a restart would keep a whole Cat-3 reserve spent."""
        query.charged = charged
        return self._settle(query, min(FAILED, charged), ReasonCode.TIMEOUT)


def _refuse_query(
    event: MessageReceived, query_id: str | None, refusal: Refusal
) -> tuple[Action, ...]:
    row = Record(
        LogEvent.BCP_QUERY_REFUSED,
        actor=GATEWAY_CLIENT_ID,
        topic=event.topic,
        status=refusal.reason,
        payload={"channel": event.topic, "query_id": query_id, "detail": refusal.detail},
        message_id=event.message_id,
    )
    actions: list[Action] = [row, Commit()]
    # An id that breaks the id pattern is not echoed: the frame must match schemas/json.
    if query_id is not None and _ID_RE.match(query_id):
        failed = BcpQueryFailed(query_id=query_id, error=refusal.reason, detail=refusal.detail)
        actions.append(Send(agent_id(event.sender.partition(":")[2]), "bcp_query_failed", failed))
    actions.append(Respond(False, refusal.reason, refusal.detail))
    return tuple(actions)
