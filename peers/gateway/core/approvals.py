"""Approvals: a human decides an escalation into Cat-3, or an answer or push under review.

An approval is a committed ``bcp_approval_requested`` row, then a ``bcp_approval_request`` on
``system:approval`` and a timer of ``approval_timeout`` seconds. The first decision is final:
it is remembered before anything else happens, logged as ``bcp_approval_decided`` (committed),
and then the escalated query goes to the reader or fails, the answer is delivered or the query
fails, the push is delivered or its reader learns that a human refused it.
"""

from __future__ import annotations

import uuid
from typing import Any, Literal

from pydantic import ValidationError

from bus.core.logevents import LogEvent
from schemas.agents import Channel, Subscription
from schemas.bcp import (
    UNTRUSTED_NOTICE,
    BcpApprovalDecision,
    BcpApprovalRequest,
    BcpQueryRequest,
    BcpValidationResult,
    DecisionRefusal,
    DeliveryBits,
    NormalizedResponse,
    QuerySpec,
    ReasonCode,
)
from schemas.common import agent_id

from ..events import Action, CancelTimer, Commit, MessageReceived, Record, Respond, Send, SetTimer
from ..state import DECISION_STATUS, ApprovalStatus, Decided, QueryState
from ..validation import ValidationResult, validate_response
from .context import APPROVAL_TOPIC, GATEWAY_CLIENT_ID, Approval, Context, Query
from .frames import anomalies, delivery, iso, wire
from .outbox import Outbox
from .queries import Queries

__all__ = ["Approvals"]


class Approvals:
    """Ask humans, take their decisions, expire what they leave undecided."""

    def __init__(self, ctx: Context, queries: Queries, outbox: Outbox) -> None:
        self.ctx = ctx
        self.queries = queries
        self.outbox = outbox

    def escalate(self, query: Query, request: BcpQueryRequest) -> list[Action]:
        """Hold an escalation into Cat-3 for a human before the reader is asked."""
        query.state = QueryState.APPROVING_ESCALATION
        content = {
            "kind": "escalation",
            "query_id": query.query_id,
            "task_id": request.task_id,
            "from_category": self.ctx.state.tasks.category_of(query.channel.key, request.task_id),
            "escalation_justification": request.escalation_justification,
        }
        return self._open(query.channel, "escalation", query.spec, content, query=query)

    def review(
        self,
        channel: Channel,
        spec: QuerySpec,
        result: ValidationResult,
        *,
        query: Query | None = None,
        subscription: Subscription | None = None,
        bits: float,
        split: DeliveryBits | None = None,
    ) -> list[Action]:
        """Hold a valid answer or push for a human before the controller gets it.

        ``bits`` is what the answer carries; ``split`` a push's whole charge, made already.
        """
        content: dict[str, Any] = {"kind": "response", "response": result.response}
        if query is not None:
            content["query_id"] = query.query_id
        if subscription is not None:
            content["subscription_id"] = subscription.id
        if result.anomalies:
            content["anomalies"] = anomalies(result)
        return self._open(
            channel,
            "response",
            spec,
            content,
            query=query,
            subscription=subscription,
            bits=bits,
            split=split,
            response=result.response,
            anomalies=anomalies(result),
        )

    def _open(
        self,
        channel: Channel,
        kind: Literal["response", "escalation"],
        spec: QuerySpec,
        content: dict[str, Any],
        **details: Any,
    ) -> list[Action]:
        ctx = self.ctx
        approval_id = f"ap-{uuid.uuid4().hex[:12]}"
        request = BcpApprovalRequest.model_validate(
            {
                "approval_id": approval_id,
                "controller": channel.controller,
                "reader": channel.reader,
                "spec": spec.model_dump(exclude_none=True),
                "taint": channel.reader_taint,
                "untrusted": True,
                "notice": UNTRUSTED_NOTICE,
                "expires_at": iso(ctx.clock() + ctx.settings.approval_timeout),
                **{k: v for k, v in content.items() if v is not None},
            }
        )
        content = wire(request)
        ctx.approvals[approval_id] = Approval(approval_id, kind, channel, spec, content, **details)
        row = ctx.record(
            LogEvent.BCP_APPROVAL_REQUESTED,
            channel,
            "pending",
            approval_id=approval_id,
            kind=kind,
            query_id=content.get("query_id"),
            subscription_id=content.get("subscription_id"),
            request=content,
        )
        return [
            row,
            Commit(),
            SetTimer(("approval", approval_id), ctx.settings.approval_timeout),
            Send(APPROVAL_TOPIC, "bcp_approval_request", request),
        ]

    def resend(self, approver: str) -> list[Action]:
        """Send every open approval to an approver who joined, one background send each."""
        # To the approver's own address: it is subscribed to it from initialize on, whereas
        # its subscription to system:approval may come after this peer_joined.
        return [
            Send(approver, "bcp_approval_request", approval.content)
            for approval in list(self.ctx.approvals.values())
        ]

    def receive_decision(self, event: MessageReceived) -> list[Action]:
        """Take an approver's ``bcp_approval_decision``; reply with the status it gave."""
        try:
            decision = BcpApprovalDecision.model_validate(event.content)
        except ValidationError:
            return [Respond(False, DecisionRefusal.INVALID_DECISION, "not a bcp_approval_decision")]
        approval_id = decision.approval_id
        approval = self.ctx.approvals.get(approval_id)
        if approval is None:
            # The bus logs this reply in the decision's process_finish row (error "code: detail").
            decided = self.ctx.state.decided.get(approval_id)
            if decided is not None:
                detail = f"approval {approval_id} was already decided: {decided.describe()}"
                return [Respond(False, DecisionRefusal.ALREADY_DECIDED, detail)]
            detail = f"no pending or recently decided approval {approval_id}"
            return [Respond(False, DecisionRefusal.UNKNOWN_APPROVAL, detail)]
        response = approval.response
        if decision.decision == "edit":
            if approval.kind != "response" or decision.edited_response is None:
                detail = "only a response can be edited, with text"
                return [Respond(False, DecisionRefusal.INVALID_EDIT, detail)]
            # The human's text is validated again: an edit cannot smuggle in what screening stops.
            result = validate_response(approval.spec, decision.edited_response)
            if not result.accepted:
                return [Respond(False, DecisionRefusal.INVALID_EDIT, result.detail()[:500])]
            response = result.response
        status = DECISION_STATUS[decision.decision]
        actions = self.decide(approval, status, event.sender, response, decision.reason)
        return [*actions, Respond(True, status)]

    def expire(self, approval_id: str) -> list[Action]:
        """Decide an approval nobody decided in time as expired."""
        approval = self.ctx.approvals.get(approval_id)
        if approval is None:
            return []
        reason = "no decision in time"
        return self.decide(approval, ApprovalStatus.EXPIRED, GATEWAY_CLIENT_ID, None, reason)

    def decide(
        self,
        approval: Approval,
        status: ApprovalStatus,
        decided_by: str,
        response: NormalizedResponse | None,
        reason: str | None,
    ) -> list[Action]:
        """End ``approval`` as ``status``, log it, and carry the decision through."""
        ctx, channel = self.ctx, approval.channel
        ctx.approvals.pop(approval.approval_id, None)
        note = reason if status is ApprovalStatus.EXPIRED else None
        decided = Decided(status, decided_by, iso(ctx.clock()), note)
        ctx.state.decided.remember(approval.approval_id, decided)
        row = Record(
            LogEvent.BCP_APPROVAL_DECIDED,
            actor=decided_by,
            topic=channel.topic,
            status=status,
            payload={
                "channel": channel.topic,
                "approval_id": approval.approval_id,
                "kind": approval.kind,
                "query_id": approval.query.query_id if approval.query else None,
                "subscription_id": approval.subscription.id if approval.subscription else None,
                "reason": reason,
                "edited": status is ApprovalStatus.EDITED,
            },
        )
        head: list[Action] = [CancelTimer(("approval", approval.approval_id)), row, Commit()]
        return [*head, *self._carry_through(approval, status, response)]

    def _carry_through(
        self, approval: Approval, status: ApprovalStatus, response: NormalizedResponse | None
    ) -> list[Action]:
        channel, query, accepted = approval.channel, approval.query, status.accepted
        if approval.kind == "escalation":
            assert query is not None
            if accepted:
                return self._ask_after_escalation(query)
            self.ctx.state.used_query_ids.add((channel.controller, query.query_id))
            detail = f"the escalation was {status}"
            return self.queries.fail(query, ReasonCode.ESCALATION_REJECTED, detail)
        if query is not None:
            if accepted:
                return self.queries.complete(
                    query, response or {}, approval.anomalies, approval.bits
                )
            detail = f"the answer was {status}"
            return self.queries.fail(query, ReasonCode.APPROVAL_REJECTED, detail)
        assert approval.subscription is not None
        sid = approval.subscription.id
        if accepted:
            # Charged when it was accepted (value, outcome, slot); it leaves once approved.
            assert approval.split is not None
            content = delivery(
                channel,
                approval.spec,
                response or {},
                approval.split,
                approval.anomalies,
                subscription_id=sid,
            )
            return self.outbox.deliver(channel, "bcp_response_delivery", content)
        verdict = BcpValidationResult(
            subscription_id=sid,
            success=False,
            error=ReasonCode.APPROVAL_REJECTED,
            detail=f"a human {status} the push",
        )
        return [Send(agent_id(channel.reader), "bcp_validation_result", verdict)]

    def _ask_after_escalation(self, query: Query) -> list[Action]:
        channel = query.channel
        # The budget may have been spent while the human decided: check again.
        least = self.queries.least(channel, query.spec, query.bits)
        if not self.ctx.state.ledger.fits(channel.key, least, channel.budget_bits):
            detail = "the budget ran out during approval"
            return self.queries.fail(query, ReasonCode.BUDGET_EXHAUSTED, detail)
        return self.queries.ask_reader(query, f"escalation-{query.query_id}")
