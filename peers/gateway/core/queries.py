"""The gateway's decisions, sans I/O: a query request in, an admission or a refusal out.

Nothing here awaits or touches a socket or the log. :meth:`GatewayCore.receive_query_request`
runs every check on a controller's ``bcp_query_request`` against the :class:`GatewayState`
and returns either :class:`Admitted` (the shell charges it and asks the reader) or
:class:`Refused`, whose actions the shell carries out in order (see :mod:`.events`).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel, ValidationError

from schemas.agents import Channel
from schemas.bcp import ID_PATTERN, BcpQueryFailed, BcpQueryRequest, QuerySpec, ReasonCode

from .bits import spec_bits
from .events import Action, Commit, MessageReceived, Record, Respond, Send
from .state import ChannelKey, GatewayState

__all__ = [
    "GATEWAY_CLIENT_ID",
    "Admitted",
    "GatewayCore",
    "Refusal",
    "Refused",
    "channel_of",
    "parse",
]

GATEWAY_CLIENT_ID = "system:gateway"

_ID_RE = re.compile(ID_PATTERN)

_ESCALATION_TEXT = {
    "escalation_requires_justification": "a higher category than earlier queries of this task "
    "needs escalation_justification",
    "escalation_limit_reached": "this task has used its max_escalations_per_task",
}


class Refusal(Exception):
    """A BCP refusal: ``reason`` is a :class:`ReasonCode`, ``detail`` says what to fix."""

    def __init__(self, reason: str, detail: str) -> None:
        super().__init__(detail)
        self.reason = reason
        self.detail = detail


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


class GatewayCore:
    """The gateway's decisions over its channels and :class:`GatewayState`.

    Args:
        channels: the channels from the agent definitions, by ``(controller, reader)``.
        state: what the gateway starts from (see :func:`peers.gateway.restore.load_state`).
    """

    def __init__(self, channels: Mapping[ChannelKey, Channel], state: GatewayState) -> None:
        self.channels = channels
        self.state = state

    def receive_query_request(self, event: MessageReceived) -> Admitted | Refused:
        """Check a ``bcp_query_request``; reserve nothing.

        Returns :class:`Admitted`, which the caller must charge before anything else runs, or
        :class:`Refused`, whose actions it must carry out in order.
        """
        channel: Channel | None = None
        query_id = str(event.content.get("query_id", ""))[:128] or None
        try:
            channel = channel_of(self.channels, event, sender_is="controller")
            request = parse(BcpQueryRequest, event.content)
            query_id = request.query_id
            return self._admit(channel, request)
        except Refusal as refusal:
            return Refused(_refuse_query(event, query_id, refusal))

    def _admit(self, channel: Channel, request: BcpQueryRequest) -> Admitted:
        state, key = self.state, channel.key
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
        if not state.ledger.fits(key, bits, channel.budget_bits):
            left = state.ledger.left(key, channel.budget_bits)
            raise Refusal(
                ReasonCode.BUDGET_EXHAUSTED,
                f"this query needs {bits:.1f} bits; {left:.1f} of {channel.budget_bits:.1f} "
                "are left",
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


def _refuse_query(
    event: MessageReceived, query_id: str | None, refusal: Refusal
) -> tuple[Action, ...]:
    row = Record(
        "bcp_query_refused",
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
        actions.append(Send(f"agent:{event.sender.partition(':')[2]}", "bcp_query_failed", failed))
    actions.append(Respond(False, refusal.reason, refusal.detail))
    return tuple(actions)


def channel_of(
    channels: Mapping[ChannelKey, Channel], event: MessageReceived, *, sender_is: str
) -> Channel:
    """Return the channel ``event`` was sent on, checking its sender; raise :class:`Refusal`."""
    parts = event.topic.split(":")
    if len(parts) != 3 or parts[0] != "bcp":
        raise Refusal(ReasonCode.UNKNOWN_CHANNEL, f"{event.topic!r} is not bcp:<c>:<r>")
    channel = channels.get((parts[1], parts[2]))
    if channel is None:
        raise Refusal(ReasonCode.UNKNOWN_CHANNEL, f"no channel {event.topic!r} is defined")
    expected = channel.controller if sender_is == "controller" else channel.reader
    if event.sender != f"agent:{expected}":
        reason = (
            ReasonCode.NOT_CHANNEL_CONTROLLER
            if sender_is == "controller"
            else ReasonCode.NOT_CHANNEL_READER
        )
        raise Refusal(reason, f"{event.sender} is not the {sender_is} of {channel.topic}")
    return channel


def parse(
    model: type[BaseModel], content: dict[str, Any], reason: str = ReasonCode.INVALID_SPEC
) -> Any:
    """Validate ``content`` as ``model``; raise :class:`Refusal` naming the first error."""
    try:
        return model.model_validate(content)
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(part) for part in first["loc"]) or "content"
        raise Refusal(reason, f"{where}: {first['msg']}"[:500]) from None
