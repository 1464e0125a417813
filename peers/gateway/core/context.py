"""What every part of the gateway's core shares: the runtime state, refusals, and row builders.

:class:`Context` holds the channels, the restored :class:`~peers.gateway.state.GatewayState`,
the queries and approvals in flight, the outbox, and the continuations of sends whose outcome
matters (see :class:`~peers.gateway.events.Sent`). The parts of the core
(:mod:`.outbox`, :mod:`.queries`, :mod:`.approvals`, :mod:`.answers`, :mod:`.pushes`) each take it.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol

from pydantic import BaseModel, ValidationError

from bus.core.digest import LogContent, canonical_sha256
from bus.core.logevents import LogEvent
from schemas.agents import Channel, Subscription
from schemas.bcp import (
    DeliveryBits,
    NormalizedResponse,
    QuerySpec,
    ReasonCode,
)
from schemas.common import APPROVAL_TOPIC, GATEWAY_CLIENT_ID, agent_id

from .. import timing
from ..events import Action, Commit, MessageReceived, Record, Send, Sent
from ..state import ChannelKey, GatewayState, Held, QueryState
from ..validation import ValidationResult
from .frames import anomalies, validation_result, wire

__all__ = [
    "APPROVAL_TOPIC",
    "GATEWAY_CLIENT_ID",
    "Approval",
    "Context",
    "Leaving",
    "Query",
    "Refusal",
    "Release",
    "Settings",
    "channel_of",
    "parse",
    "raw_answer",
]


class Settings(Protocol):
    """The timeouts and limits the core reads (``GatewaySettings`` has them)."""

    @property
    def query_ttl(self) -> float: ...
    @property
    def max_retries(self) -> int: ...
    @property
    def approval_timeout(self) -> float: ...
    @property
    def outbox_ttl(self) -> float: ...
    @property
    def screener_timeout(self) -> float: ...


class Refusal(Exception):
    """A BCP refusal: ``reason`` is a :class:`ReasonCode`, ``detail`` says what to fix."""

    def __init__(self, reason: str, detail: str) -> None:
        super().__init__(detail)
        self.reason = reason
        self.detail = detail


@dataclass
class Query:
    """A query the gateway accepted and has not finished."""

    channel: Channel
    query_id: str
    spec: QuerySpec
    bits: float
    retries_left: int
    """The answers still allowed: the first one plus ``max_retries``, counting down."""
    task_id: str | None
    state: QueryState = QueryState.ASKING
    charged: float = 0.0
    """The bits charged to it so far: its reserve once the reader is asked, then its outcome's."""
    cap: float = 0.0
    """The most its delivered value may carry (see :func:`.outcomes.reserve`)."""
    asked_at: float | None = None
    """When the reader was asked: the anchor of its release grid (see :mod:`..timing`)."""

    @property
    def timer(self) -> tuple[str, ...]:
        """The key of its expiry timer."""
        return ("query", self.channel.controller, self.query_id)


Leaving = Callable[[], tuple[bool, list[Action]]]
"""What runs the moment a delivery leaves for its controller: whether it still goes, and the
actions that come first (a query's settlement, a push's charge or its refusal). The ledger
changes then, on the grid, and not when the reader answered: the budget left decides
admission, which a controller can probe."""


@dataclass
class Release:
    """A delivery held until its grid point (see :mod:`..timing`)."""

    at: float
    channel: Channel
    message_type: str
    content: dict[str, Any]
    then: Callable[[bool], list[Action]] | None
    leaving: Leaving | None = None
    """What runs the moment it leaves, before it is sent (see :data:`Leaving`)."""


@dataclass
class Approval:
    """An approval request waiting for a human."""

    approval_id: str
    kind: Literal["response", "escalation"]
    channel: Channel
    spec: QuerySpec
    content: dict[str, Any]
    """The ``bcp_approval_request`` as sent (and sent again to an approver who joins)."""
    query: Query | None = None
    subscription: Subscription | None = None
    bits: float = 0.0
    """What the answer or push carries (its value's charge)."""
    split: DeliveryBits | None = None
    """A push's charge, value, outcome and timing, for its delivery once approved."""
    response: NormalizedResponse | None = None
    anomalies: list[dict[str, Any]] = field(default_factory=list)


Then = Callable[[int], list[Action]]
"""What to do once a send's outcome is known, given how many peers got it."""


class Context:
    """The core's shared state; every part of the core reads and changes this one value."""

    def __init__(
        self,
        channels: Mapping[ChannelKey, Channel],
        state: GatewayState,
        settings: Settings,
        clock: Callable[[], float],
        log_content: LogContent = "full",
    ) -> None:
        self.channels = channels
        self.log_content: LogContent = log_content
        """What the rows keep of questions, answers and values: ``full``, or their SHA-256."""
        self.state = state
        self.settings = settings
        self.clock = clock
        self.pending: dict[tuple[str, str], Query] = {}
        """Queries in flight, by ``(controller, query_id)``."""
        self.approvals: dict[str, Approval] = {}
        """Approvals waiting for a human, by ``approval_id``."""
        self.outbox: dict[str, list[Held]] = {}
        """Deliveries held for offline controllers, oldest first."""
        self.releases: dict[str, list[Release]] = {}
        """Deliveries waiting for their grid point, by controller, earliest first."""
        self.started = clock()
        """When this core started: the grid anchor of a subscription's first push."""
        self._then: dict[int, Then] = {}
        self._tokens = itertools.count(1)

    def last_slot(self, channel: Channel, category: int) -> int:
        """Return the last slot a query on ``channel`` can end in: every wait it may take.

        Its time to live; then, for Cat-2 and Cat-3, its screeners' time if the channel has
        any, and a human's if the answer may need one (Cat-3, a ``review`` channel, or
        ``screener_failure: review``).
        """
        s = self.settings
        window = s.query_ttl
        if category >= 2 and channel.screeners:
            window += s.screener_timeout
        reviewed = "review" in (channel.anomaly_action, channel.screener_failure)
        if category == 3 or (category == 2 and reviewed):
            window += s.approval_timeout
        return timing.max_slot(window, channel.delivery_quantum)

    def send_then(
        self, topic: str, message_type: str, content: BaseModel | Mapping[str, Any], then: Then
    ) -> Send:
        """Return a :class:`Send` whose outcome runs ``then`` (see :meth:`sent`)."""
        return Send(topic, message_type, content, token=self.continue_with(then))

    def continue_with(self, then: Then) -> int:
        """Return a new token for a send whose outcome runs ``then``."""
        token = next(self._tokens)
        self._then[token] = then
        return token

    def sent(self, event: Sent) -> list[Action]:
        """Return what follows a send with a token; nothing for an unknown token."""
        then = self._then.pop(event.token, None)
        return then(event.delivered_to) if then is not None else []

    def record(
        self, event: LogEvent, channel: Channel, status: str | None = None, **payload: Any
    ) -> Record:
        """Return the gateway's row about ``channel``; ``message_id`` goes in its column too."""
        return Record(
            event,
            actor=GATEWAY_CLIENT_ID,
            topic=channel.topic,
            status=status,
            payload={"channel": channel.topic, **payload},
            message_id=payload.get("message_id"),
        )

    def content(self, value: Any) -> Any:
        """``value`` as a row keeps it: itself, or ``{"sha256": ...}`` of its canonical JSON
        when the log keeps digests (``serve --log-content digest``)."""
        if self.log_content == "full" or value is None:
            return value
        return {"sha256": canonical_sha256(value)}

    def charged(self, channel: Channel, bits: float, **ref: Any) -> Record:
        """Return the ``bcp_bits_charged`` row for a charge (or a refund) just made."""
        return self.record(
            LogEvent.BCP_BITS_CHARGED,
            channel,
            "charged",
            bits=bits,
            budget_bits=channel.budget_bits,
            budget_left=round(self.state.ledger.left(channel.key, channel.budget_bits), 3),
            **ref,
        )

    def delivered(self, channel: Channel, content: Mapping[str, Any], **extra: Any) -> Record:
        """Return the ``bcp_delivered`` row for a delivery the controller got."""
        return self.record(
            LogEvent.BCP_DELIVERED,
            channel,
            "delivered",
            query_id=content.get("query_id"),
            subscription_id=content.get("subscription_id"),
            bits=content.get("bandwidth_bits"),
            split=content.get("bits"),
            taint=content.get("taint"),
            response=self.content(content.get("response")),
            **extra,
        )

    def validation(
        self, channel: Channel, result: ValidationResult, message_id: str, raw: Any, **ref: Any
    ) -> Record:
        """Return the ``bcp_validation`` row for a reader's answer or push, ``raw`` as it came."""
        return self.record(
            LogEvent.BCP_VALIDATION,
            channel,
            "pass" if result.accepted else "fail",
            message_id=message_id,
            raw=self.content(raw),
            reasons=[r.model_dump(mode="json") for r in result.reasons],
            anomalies=anomalies(result),
            **ref,
        )

    def tell_reader(
        self,
        event: MessageReceived,
        channel: Channel | None,
        ref: Mapping[str, Any],
        error: str | None,
        detail: str,
        result: ValidationResult | None = None,
        *,
        retries_left: int | None = None,
        then: Callable[[], list[Action]] | None = None,
    ) -> list[Action]:
        """Return the verdict on a reader's ``bcp_response``, after a commit of every row.

        ``then`` runs once the verdict is sent, and its actions follow it.
        """
        verdict = validation_result(ref, error, detail, result, retries_left)
        actions: list[Action] = []
        if channel is None:
            payload = {**wire(verdict), "channel": event.topic}
            actions.append(
                Record(
                    LogEvent.BCP_VALIDATION,
                    GATEWAY_CLIENT_ID,
                    event.topic,
                    "fail",
                    payload,
                    event.message_id,
                )
            )
        # correlationId ties the verdict to the bcp_response it answers; the reader SDK waits on it.
        token = None if then is None else self.continue_with(_after(then))
        send = Send(event.sender, "bcp_validation_result", verdict, event.message_id, token)
        return [*actions, Commit(), send]


def _after(then: Callable[[], list[Action]]) -> Then:
    return lambda _delivered_to: then()


def raw_answer(event: MessageReceived) -> Any:
    """The reader's answer in a ``bcp_response`` exactly as it came, for the log."""
    return event.content.get("response")


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
    if event.sender != agent_id(expected):
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
