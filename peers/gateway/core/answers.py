"""Answers: a reader's ``bcp_response`` to a query, validated, retried, delivered or reviewed.

Every answer is a ``bcp_validation`` row. An invalid one costs a retry and tells the reader
what failed and how many tries are left; the last failure ends the query with
``retries_exhausted``. A valid one goes to the controller, or to a human first when the
validation asks for review. On a channel with screeners a valid Cat-2 or Cat-3 answer is judged
by them first (:mod:`.screens`), and the row and all that follows carry the combined verdict.
"""

from __future__ import annotations

from typing import Any

from schemas.agents import Channel
from schemas.bcp import ReasonCode

from ..bits import spec_ceiling
from ..events import Action, MessageReceived, Respond
from ..state import QueryState
from ..validation import ValidationResult, validate_response
from .approvals import Approvals
from .context import Context, Query, raw_answer
from .frames import anomalies
from .queries import Queries
from .screens import Screens

__all__ = ["Answers"]


class Answers:
    """Take readers' answers to pending queries."""

    def __init__(
        self, ctx: Context, queries: Queries, approvals: Approvals, screens: Screens
    ) -> None:
        self.ctx = ctx
        self.queries = queries
        self.approvals = approvals
        self.screens = screens

    def receive(
        self, event: MessageReceived, channel: Channel, query_id: str, raw: Any
    ) -> list[Action]:
        """Validate the answer ``raw`` to ``query_id``; tell the reader; reply."""
        ctx, ref = self.ctx, {"query_id": query_id}
        query = ctx.pending.get((channel.controller, query_id))
        if query is None or query.state is not QueryState.ASKING or query.channel is not channel:
            detail = "no pending query with this query_id on this channel"
            return [
                *ctx.tell_reader(event, channel, ref, ReasonCode.UNKNOWN_QUERY, detail),
                Respond(False, ReasonCode.UNKNOWN_QUERY, detail),
            ]
        result = validate_response(
            query.spec, raw, anomaly_action=channel.anomaly_action, max_bits=_answer_cap(query)
        )
        if self.screens.needed(channel, query.spec, result):
            # At once: a second answer meanwhile is not taken (see Queries.expire).
            query.state = QueryState.SCREENING

            def screened(final: ValidationResult) -> list[Action]:
                if ctx.pending.get((channel.controller, query_id)) is not query:
                    return []
                query.state = QueryState.ASKING
                return self._judged(event, query, final)

            asked = self.screens.ask(
                channel, query.spec, raw, result, ref, event.message_id, screened
            )
            return [*asked, Respond(True, "screening")]
        return self._judged(event, query, result)

    def _judged(
        self, event: MessageReceived, query: Query, result: ValidationResult
    ) -> list[Action]:
        """Carry the verdict on an answer through: retry, review, or delivery; reply."""
        ctx, channel, query_id = self.ctx, query.channel, query.query_id
        ref = {"query_id": query_id}
        row = ctx.validation(
            channel, result, event.message_id, raw_answer(event), query_id=query_id
        )
        if not result.accepted:
            return [row, *self._retry(event, query, result)]
        if result.approval_required:
            # At once: a second answer meanwhile is not taken, and the query timer leaves it.
            query.state = QueryState.APPROVING

            def review() -> list[Action]:
                return self.approvals.review(
                    channel, query.spec, result, query=query, bits=result.value_bits
                )

            # The approval opens once the reader has its verdict, as an approver joining
            # meanwhile is sent every open approval again.
            held = "valid; held for human approval"
            told = ctx.tell_reader(event, channel, ref, None, held, then=review)
            return [row, *told, Respond(True, "held_for_approval")]
        return [
            row,
            *ctx.tell_reader(event, channel, ref, None, "accepted"),
            *self.queries.complete(
                query, result.response or {}, anomalies(result), result.value_bits
            ),
            Respond(True, "delivered"),
        ]

    def _retry(
        self, event: MessageReceived, query: Query, result: ValidationResult
    ) -> list[Action]:
        """Count an invalid answer; tell the reader the tries left, or fail the query."""
        ctx, channel, ref = self.ctx, query.channel, {"query_id": query.query_id}
        query.retries_left -= 1
        if query.retries_left <= 0:
            reason = ReasonCode.RETRIES_EXHAUSTED
            return [
                *ctx.tell_reader(event, channel, ref, reason, result.detail(), result),
                *self.queries.fail(query, reason, "the reader's answers kept failing"),
                Respond(False, reason),
            ]
        reason = ReasonCode.VALIDATION_FAILED
        told = ctx.tell_reader(
            event, channel, ref, reason, result.detail(), result, retries_left=query.retries_left
        )
        return [*told, Respond(False, reason, result.detail())]


def _answer_cap(query: Query) -> float:
    """The most the answer itself may carry: the reserve's cap less a flag channel's codes."""
    if query.channel.anomaly_action != "flag":
        return query.cap
    codes = spec_ceiling(query.spec, flag=True) - spec_ceiling(query.spec)
    return query.cap - codes
