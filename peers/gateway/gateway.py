"""The BCP gateway: the one peer that reads what readers write.

It connects to the bus as ``system:gateway`` like any peer, under the same authentication,
policy and activity log, subscribes to ``bcp:*``, ``system:presence`` and ``system:approval``,
and runs every BCP flow:

- a controller's ``bcp_query_request`` is checked (channel, sender, category, spec, budget,
  Cat-2 limit, escalation) and either refused at once with ``bcp_query_failed`` or charged and
  passed to the reader as ``bcp_query``;
- a reader's ``bcp_response`` is validated and normalized; the reader learns the verdict in
  ``bcp_validation_result`` and may retry; a valid answer reaches the controller as
  ``bcp_response_delivery``, after a human's approval for Cat-3 and for answers under review;
- a reader's push (``bcp_response`` with ``subscription_id``) is validated against the
  controller's declared subscription, rate-limited and charged to the same budget;
- deliveries to a controller that is offline are held and sent when it joins, or expire.

Every decision is an activity-log row, committed before the message it allows is sent.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import re
import time
import uuid
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, Literal

from pydantic import BaseModel, ValidationError

from bus.activity import ActivityLog
from bus.errors import BusError
from peers.client import Message, Peer, Reply
from schemas.agents import Channel, Subscription
from schemas.bcp import (
    ID_PATTERN,
    SUBSCRIPTION_ID_PATTERN,
    UNTRUSTED_NOTICE,
    BcpApprovalDecision,
    BcpApprovalRequest,
    BcpQuery,
    BcpQueryFailed,
    BcpQueryRequest,
    BcpResponse,
    BcpResponseDelivery,
    BcpSubscriptionsActive,
    BcpValidationResult,
    DecisionRefusal,
    NormalizedResponse,
    QuerySpec,
    ReasonCode,
)
from schemas.common import step_down

from .bits import spec_bits
from .core import (
    GATEWAY_CLIENT_ID,
    Admitted,
    GatewayCore,
    Refusal,
    Refused,
    channel_of,
    parse,
)
from .events import Action, Commit, MessageReceived, Record, Respond, Send
from .settings import GatewaySettings
from .state import (
    DECISION_STATUS,
    ApprovalStatus,
    ChannelKey,
    Decided,
    GatewayState,
    Held,
    Orphans,
    QueryState,
)
from .validation import ValidationResult, validate_response

__all__ = ["GATEWAY_CLIENT_ID", "Gateway"]

logger = logging.getLogger("peers.gateway")

APPROVAL_TOPIC = "system:approval"


@dataclass
class _Query:
    channel: Channel
    query_id: str
    spec: QuerySpec
    bits: float
    retries_left: int
    task_id: str | None
    state: QueryState = QueryState.ASKING
    timer: asyncio.TimerHandle | None = None


@dataclass
class _Approval:
    approval_id: str
    kind: Literal["response", "escalation"]
    channel: Channel
    spec: QuerySpec
    content: dict[str, Any]
    query: _Query | None = None
    subscription: Subscription | None = None
    bits: float = 0.0
    response: NormalizedResponse | None = None
    anomalies: list[dict[str, Any]] = field(default_factory=list)
    timer: asyncio.TimerHandle | None = None


class Gateway:
    """Run the BCP flows over one :class:`~peers.client.Peer` connected as ``system:gateway``.

    Args:
        peer: an unconnected peer with the gateway's clientId and token.
        channels: the channels from the agent definitions, by ``(controller, reader)``.
        log: the activity log (the bus's own when running beside it).
        settings: expiry, retries, approval and outbox timeouts.
        clock: wall-clock seconds; tests may pass their own.
    """

    def __init__(
        self,
        peer: Peer,
        channels: Mapping[ChannelKey, Channel],
        log: ActivityLog,
        *,
        settings: GatewaySettings | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.peer = peer
        self.channels = dict(channels)
        self.log = log
        self.settings = settings or GatewaySettings()
        self.clock = clock
        self.pending: dict[tuple[str, str], _Query] = {}
        self.approvals: dict[str, _Approval] = {}
        self.outbox: dict[str, list[Held]] = {}
        self._held_timers: dict[str, asyncio.TimerHandle] = {}
        self.core = GatewayCore(self.channels, GatewayState())
        """The decisions, sans I/O; this class carries out the actions they return."""
        self.adopt(self.core.state)
        self.readers = {reader for _c, reader in self.channels}
        self.controllers = {controller for controller, _r in self.channels}
        self._work: set[asyncio.Task[None]] = set()
        self._closed = False
        handlers: dict[str, Callable[[Message], Awaitable[Reply]]] = {
            "bcp_query_request": self._on_query_request,
            "bcp_response": self._on_response,
            "bcp_approval_decision": self._on_decision,
            "peer_joined": self._on_peer_joined,
        }
        for message_type, handler in handlers.items():
            peer.handle(message_type, handler)
        peer.handle(None, self._ignore)

    def adopt(self, state: GatewayState) -> None:
        """Start from ``state`` (see :func:`peers.gateway.restore.load_state`); before start."""
        self.core.state = state
        self.ledger = state.ledger
        self.tasks = state.tasks
        self.rates = state.rates
        self.used_query_ids = state.used_query_ids
        self.decided = state.decided
        """Approvals that ended, so a late decision is refused as ``already_decided``; bounded
        (see :data:`~peers.gateway.state.DEFAULT_MAX_DECIDED`)."""
        for held in state.held:
            self.keep(held)

    # Lifecycle

    async def start(self) -> None:
        """Connect, subscribe, and tell every reader its active subscriptions.

        Call :func:`peers.gateway.restore.restore` before this to carry budgets over a restart.
        """
        await self.peer.connect()
        for pattern in ("bcp:*", "system:presence", APPROVAL_TOPIC):
            await self.peer.subscribe(pattern)
        for reader in sorted(self.readers):
            await self._announce_subscriptions(reader)
        for controller in list(self.outbox):
            await self._flush_outbox(controller)
        logger.info("gateway started with %d channels", len(self.channels))

    async def settle(self, orphans: Orphans) -> None:
        """Fail what was in flight when the gateway last stopped (see :mod:`.restore`).

        Each orphaned approval is logged as expired and each orphaned query ends in
        ``bcp_query_failed`` (``timeout``) to its controller, held if it is offline.
        """
        for controller, reader, approval_id in orphans.approvals:
            channel = self.channels[(controller, reader)]
            reason = "the gateway restarted"
            self.decided.remember(
                approval_id,
                Decided(ApprovalStatus.EXPIRED, GATEWAY_CLIENT_ID, _iso(self.clock()), reason),
            )
            self._record(
                "bcp_approval_decided",
                channel,
                ApprovalStatus.EXPIRED,
                approval_id=approval_id,
                reason=reason,
            )
        for controller, reader, query_id in orphans.queries:
            channel = self.channels[(controller, reader)]
            query = _Query(channel, query_id, QuerySpec.model_construct(category=1), 0.0, 0, None)
            await self._fail_query(
                query, ReasonCode.TIMEOUT, "the gateway restarted before the query was answered"
            )
        await self.log.commit()

    async def close(self) -> None:
        """Stop timers, finish running work, flush the log and disconnect. Idempotent."""
        if self._closed:
            return
        self._closed = True
        for query in self.pending.values():
            if query.timer is not None:
                query.timer.cancel()
        for approval in self.approvals.values():
            if approval.timer is not None:
                approval.timer.cancel()
        for timer in self._held_timers.values():
            timer.cancel()
        if self._work:
            await asyncio.wait(set(self._work), timeout=5)
        with contextlib.suppress(BusError):
            await self.log.commit()
        await self.peer.close()

    def _later(self, delay: float, work: Callable[[], Awaitable[None]]) -> asyncio.TimerHandle:
        loop = asyncio.get_running_loop()
        return loop.call_later(delay, lambda: self._spawn(work()))

    def _spawn(self, coro: Awaitable[None]) -> None:
        if self._closed:
            if asyncio.iscoroutine(coro):
                coro.close()
            return
        task = asyncio.ensure_future(coro)
        self._work.add(task)
        task.add_done_callback(self._work.discard)

    # Sending and logging

    async def _send(
        self, topic: str, message_type: str, content: BaseModel | dict[str, Any], **kw: Any
    ) -> int:
        wire = content if isinstance(content, dict) else _wire(content)
        try:
            result = await self.peer.send(topic, message_type, wire, **kw)
        except (BusError, ConnectionError, TimeoutError) as exc:
            logger.warning("could not send %s to %s: %s", message_type, topic, exc)
            return 0
        return int(result.get("deliveredTo", 0))

    def _record(
        self, event: str, channel: Channel, status: str | None = None, **payload: Any
    ) -> None:
        self.log.record(
            event,
            actor=GATEWAY_CLIENT_ID,
            topic=channel.topic,
            status=status,
            payload={"channel": channel.topic, **payload},
            message_id=payload.get("message_id"),
        )

    # Queries

    async def _on_query_request(self, message: Message) -> Reply:
        match self.core.receive_query_request(_event(message)):
            case Refused(actions=actions):
                reply = await self._carry_out(actions)
                logger.info("refused query on %s: %s", message.topic, reply.status)
                return reply
            case Admitted() as admitted:
                request = admitted.request
        # retries_left counts the answers still allowed: the first one plus max_retries.
        query = _Query(
            admitted.channel,
            request.query_id,
            admitted.spec,
            admitted.bits,
            self.settings.max_retries + 1,
            request.task_id,
        )
        self.used_query_ids.add((admitted.channel.controller, query.query_id))
        if admitted.escalation:
            query.state = QueryState.APPROVING_ESCALATION
            await self._ask_approval_for_escalation(query, request)
            return Reply(True, "accepted", "escalation held for a human's approval")
        return await self._ask_reader(query, request.task_id, message.message_id)

    async def _carry_out(self, actions: tuple[Action, ...]) -> Reply:
        """Do what the core decided, in order; return the reply it chose."""
        reply = Reply(True)
        for action in actions:
            match action:
                case Record():
                    self.log.record(
                        action.event,
                        actor=action.actor,
                        topic=action.topic,
                        status=action.status,
                        payload=action.payload,
                        message_id=action.message_id,
                    )
                case Commit():
                    await self.log.commit()
                case Send():
                    await self._send(action.topic, action.type, action.content)
                case Respond():
                    reply = Reply(action.ok, action.status, action.detail)
        return reply

    async def _ask_reader(self, query: _Query, task_id: str | None, message_id: str) -> Reply:
        channel, key = query.channel, query.channel.key
        # Reserve before the first await so that concurrent queries see the bits as spent.
        self.ledger.charge(key, query.bits, cat2=query.spec.category == 2)
        self.tasks.record(key, task_id, query.spec.category)
        expires_at = self.clock() + self.settings.query_ttl
        content = BcpQuery.model_validate(
            {
                "query_id": query.query_id,
                "controller": channel.controller,
                **query.spec.model_dump(exclude_none=True),
                "expires_at": _iso(expires_at),
            }
        )
        self.pending[(channel.controller, query.query_id)] = query
        query.state = QueryState.ASKING
        self._record(
            "bcp_query_accepted",
            channel,
            "accepted",
            query_id=query.query_id,
            category=query.spec.category,
            task_id=task_id,
            bits=query.bits,
            message_id=message_id,
        )
        self._record_charge(
            channel, query.bits, query_id=query.query_id, category=query.spec.category
        )
        await self.log.commit()
        if await self._send(f"agent:{channel.reader}", "bcp_query", content) == 0:
            # Nothing crossed: give the bits back, visibly in the log.
            self.ledger.refund(key, query.bits, cat2=query.spec.category == 2)
            self._record_charge(
                channel, -query.bits, query_id=query.query_id, category=query.spec.category
            )
            await self._fail_query(
                query, ReasonCode.READER_UNAVAILABLE, f"agent:{channel.reader} did not take it"
            )
            return Reply(False, ReasonCode.READER_UNAVAILABLE, "the reader is not connected")
        query.timer = self._later(self.settings.query_ttl, lambda: self._expire_query(query))
        return Reply(True, "accepted")

    def _record_charge(self, channel: Channel, bits: float, **ref: Any) -> None:
        self._record(
            "bcp_bits_charged",
            channel,
            "charged",
            bits=bits,
            budget_bits=channel.budget_bits,
            budget_left=round(self.ledger.left(channel.key, channel.budget_bits), 3),
            **ref,
        )

    async def _fail_query(self, query: _Query, reason: str, detail: str) -> None:
        channel = query.channel
        self.pending.pop((channel.controller, query.query_id), None)
        if query.timer is not None:
            query.timer.cancel()
        self._record("bcp_query_failed", channel, reason, query_id=query.query_id, detail=detail)
        await self.log.commit()
        failed = BcpQueryFailed(query_id=query.query_id, error=reason, detail=detail)
        await self._deliver(channel, "bcp_query_failed", _wire(failed))

    async def _expire_query(self, query: _Query) -> None:
        if self.pending.get((query.channel.controller, query.query_id)) is not query:
            return
        if query.state is not QueryState.ASKING:
            return  # An approval is under way; its own timeout ends it.
        self._record("bcp_expired", query.channel, "timeout", query_id=query.query_id)
        await self._fail_query(
            query, ReasonCode.TIMEOUT, "no valid answer before the query expired"
        )

    # Answers and pushes

    async def _on_response(self, message: Message) -> Reply:
        channel: Channel | None = None
        content = message.content
        ref = {
            "query_id": content.get("query_id"),
            "subscription_id": content.get("subscription_id"),
        }
        try:
            channel = channel_of(self.channels, _event(message), sender_is="reader")
            response = parse(BcpResponse, content, ReasonCode.INVALID_MESSAGE)
        except Refusal as refusal:
            await self._tell_reader(message, channel, ref, refusal.reason, refusal.detail)
            return Reply(False, refusal.reason, refusal.detail)
        if response.subscription_id is not None:
            return await self._on_push(message, channel, response)
        assert response.query_id is not None  # BcpResponse requires one of the two
        return await self._on_answer(message, channel, response.query_id, response.response)

    async def _on_answer(
        self, message: Message, channel: Channel, query_id: str, raw: Any
    ) -> Reply:
        ref = {"query_id": query_id}
        query = self.pending.get((channel.controller, query_id))
        if query is None or query.state is not QueryState.ASKING or query.channel is not channel:
            detail = "no pending query with this query_id on this channel"
            await self._tell_reader(message, channel, ref, ReasonCode.UNKNOWN_QUERY, detail)
            return Reply(False, ReasonCode.UNKNOWN_QUERY, detail)
        result = validate_response(query.spec, raw, anomaly_action=channel.anomaly_action)
        self._record_validation(channel, result, message.message_id, query_id=query_id)
        if not result.accepted:
            query.retries_left -= 1
            if query.retries_left <= 0:
                await self._tell_reader(
                    message, channel, ref, ReasonCode.RETRIES_EXHAUSTED, result.detail(), result
                )
                await self._fail_query(
                    query, ReasonCode.RETRIES_EXHAUSTED, "the reader's answers kept failing"
                )
                return Reply(False, ReasonCode.RETRIES_EXHAUSTED)
            await self._tell_reader(
                message,
                channel,
                ref,
                ReasonCode.VALIDATION_FAILED,
                result.detail(),
                result,
                retries_left=query.retries_left,
            )
            return Reply(False, ReasonCode.VALIDATION_FAILED, result.detail())
        if result.approval_required:
            query.state = QueryState.APPROVING
            await self._tell_reader(message, channel, ref, None, "valid; held for human approval")
            await self._ask_approval(channel, query.spec, result, query=query, bits=query.bits)
            return Reply(True, "held_for_approval")
        await self._tell_reader(message, channel, ref, None, "accepted")
        await self._complete_query(query, result.response or {}, _anomalies(result))
        return Reply(True, "delivered")

    async def _complete_query(
        self, query: _Query, response: NormalizedResponse, anomalies: list[dict[str, Any]]
    ) -> None:
        channel = query.channel
        self.pending.pop((channel.controller, query.query_id), None)
        if query.timer is not None:
            query.timer.cancel()
        content = self._delivery(
            channel, query.spec, response, query.bits, anomalies, query_id=query.query_id
        )
        await self._deliver(channel, "bcp_response_delivery", content)

    async def _on_push(self, message: Message, channel: Channel, response: BcpResponse) -> Reply:
        assert response.subscription_id is not None
        sid = response.subscription_id
        ref = {"subscription_id": sid}
        subscription = channel.subscription(sid)
        if subscription is None or response.controller != channel.controller:
            detail = f"no subscription {sid!r} from {response.controller!r} to this reader"
            self._record("bcp_push_refused", channel, ReasonCode.SUBSCRIPTION_NOT_FOUND, **ref)
            await self._tell_reader(
                message, channel, ref, ReasonCode.SUBSCRIPTION_NOT_FOUND, detail
            )
            return Reply(False, ReasonCode.SUBSCRIPTION_NOT_FOUND, detail)
        refusal = self._check_push(channel, subscription)
        if refusal is not None:
            self._record("bcp_push_refused", channel, refusal.reason, detail=refusal.detail, **ref)
            await self._tell_reader(message, channel, ref, refusal.reason, refusal.detail)
            return Reply(False, refusal.reason, refusal.detail)
        spec = subscription.as_spec()
        result = validate_response(spec, response.response, anomaly_action=channel.anomaly_action)
        self._record_validation(channel, result, message.message_id, **ref)
        if not result.accepted:
            self._record("bcp_push_refused", channel, ReasonCode.VALIDATION_FAILED, **ref)
            await self._tell_reader(
                message, channel, ref, ReasonCode.VALIDATION_FAILED, result.detail(), result
            )
            return Reply(False, ReasonCode.VALIDATION_FAILED, result.detail())
        bits = spec_bits(spec)
        self.ledger.charge(channel.key, bits, cat2=False)
        self.rates.record((*channel.key, sid), self.clock())
        self._record("bcp_push_received", channel, "accepted", bits=bits, **ref)
        self._record_charge(channel, bits, subscription_id=sid, category=spec.category)
        await self.log.commit()
        if result.approval_required:
            await self._tell_reader(message, channel, ref, None, "valid; held for human approval")
            await self._ask_approval(channel, spec, result, subscription=subscription, bits=bits)
            return Reply(True, "held_for_approval")
        content = self._delivery(
            channel, spec, result.response or {}, bits, _anomalies(result), subscription_id=sid
        )
        # Deliver first, so that the verdict the reader waits for says whether it was held.
        if await self._deliver(channel, "bcp_response_delivery", content):
            await self._tell_reader(message, channel, ref, None, "accepted")
            return Reply(True, "delivered")
        detail = f"valid; held until agent:{channel.controller} connects"
        await self._tell_reader(message, channel, ref, None, detail)
        return Reply(True, "held")

    def _check_push(self, channel: Channel, subscription: Subscription) -> Refusal | None:
        key = (*channel.key, subscription.id)
        if not self.rates.allows(
            key,
            self.clock(),
            min_interval_s=subscription.min_interval_s,
            max_per_hour=subscription.max_per_hour,
        ):
            return Refusal(
                ReasonCode.RATE_LIMITED,
                f"at most one push per {subscription.min_interval_s}s and "
                f"{subscription.max_per_hour} per hour",
            )
        bits = spec_bits(subscription)
        if not self.ledger.fits(channel.key, bits, channel.budget_bits):
            left = self.ledger.left(channel.key, channel.budget_bits)
            return Refusal(
                ReasonCode.BUDGET_EXHAUSTED, f"this push needs {bits:.1f} bits; {left:.1f} left"
            )
        return None

    def _delivery(
        self,
        channel: Channel,
        spec: QuerySpec,
        response: NormalizedResponse,
        bits: float,
        anomalies: list[dict[str, Any]],
        **ref: str,
    ) -> dict[str, Any]:
        content: dict[str, Any] = {
            **ref,
            "category": spec.category,
            "from_agent": channel.reader,
            "response": response,
            "bandwidth_bits": round(bits, 3),
            "taint": step_down(channel.reader_taint),
            "channel_mode": "bcp",
        }
        # Only a flag channel delivers the anomalies; on review a human approved the answer.
        if anomalies and channel.anomaly_action == "flag":
            content["anomalies"] = anomalies
        return _wire(BcpResponseDelivery.model_validate(content))

    def _record_validation(
        self, channel: Channel, result: ValidationResult, message_id: str, **ref: Any
    ) -> None:
        self._record(
            "bcp_validation",
            channel,
            "pass" if result.accepted else "fail",
            message_id=message_id,
            reasons=[r.model_dump(mode="json") for r in result.reasons],
            anomalies=_anomalies(result),
            **ref,
        )

    async def _tell_reader(
        self,
        message: Message,
        channel: Channel | None,
        ref: Mapping[str, Any],
        error: str | None,
        detail: str,
        result: ValidationResult | None = None,
        *,
        retries_left: int | None = None,
    ) -> None:
        fields: dict[str, Any] = _valid_ids(ref)
        fields.update(success=error is None, detail=detail[:1000])
        if error is not None:
            fields["error"] = error
        if result is not None and result.reasons:
            fields["reasons"] = result.reasons
        if retries_left is not None:
            fields["retries_left"] = retries_left
        content = _wire(BcpValidationResult(**fields))
        if channel is None:
            self.log.record(
                "bcp_validation",
                actor=GATEWAY_CLIENT_ID,
                topic=message.topic,
                status="fail",
                message_id=message.message_id,
                payload={**content, "channel": message.topic},
            )
        await self.log.commit()
        # correlationId ties the verdict to the bcp_response it answers; the reader SDK waits on it.
        await self._send(
            message.sender,
            "bcp_validation_result",
            content,
            correlation_id=message.message_id,
        )

    # Approvals

    async def _ask_approval_for_escalation(self, query: _Query, request: BcpQueryRequest) -> None:
        content = {
            "kind": "escalation",
            "query_id": query.query_id,
            "task_id": request.task_id,
            "from_category": self.tasks.category_of(query.channel.key, request.task_id),
            "escalation_justification": request.escalation_justification,
        }
        await self._open_approval(query.channel, "escalation", query.spec, content, query=query)

    async def _ask_approval(
        self,
        channel: Channel,
        spec: QuerySpec,
        result: ValidationResult,
        *,
        query: _Query | None = None,
        subscription: Subscription | None = None,
        bits: float,
    ) -> None:
        content: dict[str, Any] = {"kind": "response", "response": result.response}
        if query is not None:
            content["query_id"] = query.query_id
        if subscription is not None:
            content["subscription_id"] = subscription.id
        if result.anomalies:
            content["anomalies"] = _anomalies(result)
        await self._open_approval(
            channel,
            "response",
            spec,
            content,
            query=query,
            subscription=subscription,
            bits=bits,
            response=result.response,
            anomalies=_anomalies(result),
        )

    async def _open_approval(
        self,
        channel: Channel,
        kind: Literal["response", "escalation"],
        spec: QuerySpec,
        content: dict[str, Any],
        **details: Any,
    ) -> None:
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
                "expires_at": _iso(self.clock() + self.settings.approval_timeout),
                **{k: v for k, v in content.items() if v is not None},
            }
        )
        content = _wire(request)
        approval = _Approval(approval_id, kind, channel, spec, content, **details)
        self.approvals[approval_id] = approval
        self._record(
            "bcp_approval_requested",
            channel,
            "pending",
            approval_id=approval_id,
            kind=kind,
            query_id=content.get("query_id"),
            subscription_id=content.get("subscription_id"),
            request=content,
        )
        await self.log.commit()
        approval.timer = self._later(
            self.settings.approval_timeout, lambda: self._expire_approval(approval)
        )
        await self._send(APPROVAL_TOPIC, "bcp_approval_request", content)

    async def _on_decision(self, message: Message) -> Reply:
        try:
            decision = BcpApprovalDecision.model_validate(message.content)
        except ValidationError:
            return Reply(False, DecisionRefusal.INVALID_DECISION, "not a bcp_approval_decision")
        approval_id = decision.approval_id
        approval = self.approvals.get(approval_id)
        if approval is None:
            # The bus logs this reply in the decision's process_finish row (error "code: detail").
            decided = self.decided.get(approval_id)
            if decided is not None:
                detail = f"approval {approval_id} was already decided: {decided.describe()}"
                refusal = DecisionRefusal.ALREADY_DECIDED
            else:
                detail = f"no pending or recently decided approval {approval_id}"
                refusal = DecisionRefusal.UNKNOWN_APPROVAL
            logger.info("refused %s's decision on %s: %s", message.sender, approval_id, refusal)
            return Reply(False, refusal, detail)
        response = approval.response
        if decision.decision == "edit":
            if approval.kind != "response" or decision.edited_response is None:
                return Reply(
                    False, DecisionRefusal.INVALID_EDIT, "only a response can be edited, with text"
                )
            # The human's text is validated again: an edit cannot smuggle in what screening stops.
            result = validate_response(approval.spec, decision.edited_response)
            if not result.accepted:
                return Reply(False, DecisionRefusal.INVALID_EDIT, result.detail()[:500])
            response = result.response
        status = DECISION_STATUS[decision.decision]
        await self._decide(approval, status, message.sender, response, decision.reason)
        return Reply(True, status)

    async def _expire_approval(self, approval: _Approval) -> None:
        if self.approvals.get(approval.approval_id) is approval:
            await self._decide(
                approval, ApprovalStatus.EXPIRED, GATEWAY_CLIENT_ID, None, "no decision in time"
            )

    async def _decide(
        self,
        approval: _Approval,
        status: ApprovalStatus,
        decided_by: str,
        response: NormalizedResponse | None,
        reason: str | None,
    ) -> None:
        self.approvals.pop(approval.approval_id, None)
        # Before any await: a decision arriving meanwhile must find it decided, not unknown.
        note = reason if status is ApprovalStatus.EXPIRED else None
        self.decided.remember(
            approval.approval_id, Decided(status, decided_by, _iso(self.clock()), note)
        )
        if approval.timer is not None:
            approval.timer.cancel()
        channel = approval.channel
        self.log.record(
            "bcp_approval_decided",
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
        await self.log.commit()
        accepted = status.accepted
        query = approval.query
        if approval.kind == "escalation":
            assert query is not None
            if accepted:
                await self._ask_reader_after_escalation(query)
            else:
                self.used_query_ids.add((channel.controller, query.query_id))
                await self._fail_query(
                    query, ReasonCode.ESCALATION_REJECTED, f"the escalation was {status}"
                )
            return
        if query is not None:
            if accepted:
                await self._complete_query(query, response or {}, approval.anomalies)
            else:
                await self._fail_query(
                    query, ReasonCode.APPROVAL_REJECTED, f"the answer was {status}"
                )
            return
        assert approval.subscription is not None
        sid = approval.subscription.id
        if accepted:
            content = self._delivery(
                channel,
                approval.spec,
                response or {},
                approval.bits,
                approval.anomalies,
                subscription_id=sid,
            )
            await self._deliver(channel, "bcp_response_delivery", content)
        else:
            verdict = BcpValidationResult(
                subscription_id=sid,
                success=False,
                error=ReasonCode.APPROVAL_REJECTED,
                detail=f"a human {status} the push",
            )
            await self._send(f"agent:{channel.reader}", "bcp_validation_result", verdict)

    async def _ask_reader_after_escalation(self, query: _Query) -> None:
        channel = query.channel
        try:
            # The budget may have been spent while the human decided: check again.
            if not self.ledger.fits(channel.key, query.bits, channel.budget_bits):
                raise Refusal(ReasonCode.BUDGET_EXHAUSTED, "the budget ran out during approval")
        except Refusal as refusal:
            await self._fail_query(query, refusal.reason, refusal.detail)
            return
        await self._ask_reader(query, query.task_id, f"escalation-{query.query_id}")

    # Delivery to controllers, held while they are offline

    async def _deliver(self, channel: Channel, message_type: str, content: dict[str, Any]) -> bool:
        """Send to the channel's controller, or hold it while the controller is away.

        Returns whether it was delivered now.
        """
        controller = channel.controller
        if self.outbox.get(controller):
            # Keep the order: nothing overtakes what is already held.
            await self._hold(channel, message_type, content)
            return False
        if await self._send(f"agent:{controller}", message_type, content):
            if message_type == "bcp_response_delivery":
                self._record_delivered(channel, content)
                await self.log.commit()
            return True
        await self._hold(channel, message_type, content)
        return False

    def _record_delivered(self, channel: Channel, content: dict[str, Any], **extra: Any) -> None:
        self._record(
            "bcp_delivered",
            channel,
            "delivered",
            query_id=content.get("query_id"),
            subscription_id=content.get("subscription_id"),
            bits=content.get("bandwidth_bits"),
            taint=content.get("taint"),
            **extra,
        )

    async def _hold(self, channel: Channel, message_type: str, content: dict[str, Any]) -> None:
        held = Held(
            hold_id=f"hold-{uuid.uuid4().hex[:12]}",
            controller=channel.controller,
            content={"type": message_type, "content": content},
            expires_at=self.clock() + self.settings.outbox_ttl,
            reader=channel.reader,
        )
        self._record(
            "bcp_held",
            channel,
            "held",
            hold_id=held.hold_id,
            held=held.content,
            expires_at=_iso(held.expires_at),
            query_id=content.get("query_id"),
            subscription_id=content.get("subscription_id"),
        )
        await self.log.commit()
        self.keep(held)

    def keep(self, held: Held) -> None:
        """Put ``held`` in its controller's outbox and arm its expiry."""
        self.outbox.setdefault(held.controller, []).append(held)
        delay = max(0.0, held.expires_at - self.clock())
        self._held_timers[held.hold_id] = self._later(delay, lambda: self._expire_held(held))

    async def _expire_held(self, held: Held) -> None:
        items = self.outbox.get(held.controller, [])
        if held not in items:
            return
        items.remove(held)
        self._held_timers.pop(held.hold_id, None)
        channel = self.channels.get((held.controller, held.reader))
        if channel is None:
            return
        inner = held.content["content"]
        self._record(
            "bcp_expired",
            channel,
            ReasonCode.CONTROLLER_UNAVAILABLE,
            hold_id=held.hold_id,
            query_id=inner.get("query_id"),
            subscription_id=inner.get("subscription_id"),
        )
        await self.log.commit()
        if "subscription_id" in inner:
            verdict = BcpValidationResult(
                subscription_id=inner["subscription_id"],
                success=False,
                error=ReasonCode.CONTROLLER_UNAVAILABLE,
                detail=f"agent:{held.controller} stayed offline; the push expired",
            )
            await self._send(f"agent:{held.reader}", "bcp_validation_result", verdict)

    async def _flush_outbox(self, controller: str) -> None:
        items = self.outbox.get(controller, [])
        while items:
            held = items[0]
            inner = held.content["content"]
            if not await self._send(f"agent:{controller}", held.content["type"], inner):
                return
            items.pop(0)
            timer = self._held_timers.pop(held.hold_id, None)
            if timer is not None:
                timer.cancel()
            channel = self.channels.get((controller, held.reader))
            if channel is not None:
                self._record_delivered(channel, inner, hold_id=held.hold_id)
                await self.log.commit()

    # Presence

    async def _on_peer_joined(self, message: Message) -> Reply:
        client_id = str(message.content.get("clientId", ""))
        prefix, _, name = client_id.partition(":")
        if message.sender != "system:bus":
            return Reply(False, "ignored", "presence comes from the bus only")
        if prefix == "agent" and name in self.readers:
            self._spawn(self._announce_subscriptions(name))
        if prefix == "agent" and name in self.outbox:
            self._spawn(self._flush_outbox(name))
        if prefix == "human":
            for approval in list(self.approvals.values()):
                self._spawn(self._resend(approval, client_id))
        return Reply(True)

    async def _resend(self, approval: _Approval, approver: str) -> None:
        # To the approver's own address: it is subscribed to it from initialize on, whereas
        # its subscription to system:approval may come after this peer_joined.
        await self._send(approver, "bcp_approval_request", approval.content)

    async def _announce_subscriptions(self, reader: str) -> None:
        active = BcpSubscriptionsActive(
            subscriptions=tuple(
                entry
                for (_c, r), channel in sorted(self.channels.items())
                if r == reader
                for entry in channel.active_subscriptions()
            )
        )
        await self._send(f"agent:{reader}", "bcp_subscriptions_active", active)

    async def _ignore(self, message: Message) -> Reply:
        return Reply(True, "ignored")


_ID = re.compile(ID_PATTERN)
_SUBSCRIPTION_ID = re.compile(SUBSCRIPTION_ID_PATTERN)


def _event(message: Message) -> MessageReceived:
    return MessageReceived(
        message.message_id, message.sender, message.topic, message.type, message.content
    )


def _wire(model: BaseModel) -> dict[str, Any]:
    """Return the content of a frame built through its ``schemas`` model.

    Only the fields the gateway set are sent (it sets none to null), so a frame carries the keys
    it always carried; a nested model that says ``null`` on purpose, such as a reason's
    ``field``, keeps it, as ``schemas/json`` requires.
    """
    return model.model_dump(mode="json", exclude_unset=True)


def _valid_ids(ref: Mapping[str, Any]) -> dict[str, str]:
    # An id the reader got wrong is not echoed: the verdict's correlationId already ties it
    # to the message it answers, and the frame must match schemas/json/bcp_validation_result.
    patterns = {"query_id": _ID, "subscription_id": _SUBSCRIPTION_ID}
    return {
        key: value
        for key, value in ref.items()
        if isinstance(value, str) and patterns[key].match(value)
    }


def _anomalies(result: ValidationResult) -> list[dict[str, Any]]:
    return [a.model_dump(mode="json", exclude_none=True) for a in result.anomalies]


def _iso(seconds: float) -> str:
    return datetime.fromtimestamp(seconds, UTC).isoformat(timespec="seconds").replace("+00:00", "Z")
