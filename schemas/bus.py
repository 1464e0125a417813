"""Pydantic models of the bus methods' params and results, the payload envelope, and presence.

Field names on the wire are camelCase as the protocol has them; the Python attributes are
snake_case. Validate incoming params with ``Model.model_validate(params)``; the bus answers a
:class:`pydantic.ValidationError` with -32602.

The bus itself publishes ``peer_joined`` and ``peer_left`` on ``system:presence``; their content
models are :class:`PeerJoined` and :class:`PeerLeft`, looked up by type in
:data:`PRESENCE_MODELS`.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import AwareDatetime, BaseModel, ConfigDict, Field, field_validator

from .common import TRACEPARENT_FORBIDDEN, TRACEPARENT_PATTERN, traceparent_problem

__all__ = [
    "CLIENT_ID_PATTERN",
    "PRESENCE_MODELS",
    "ROLE_NAME_PATTERN",
    "Auth",
    "Capabilities",
    "ClientInfo",
    "BUS_MESSAGE_MODELS",
    "DELIVERY_STATUS_TYPE",
    "DeliveryFailure",
    "DeliveryStatus",
    "Envelope",
    "Epoch",
    "FetchMessagesParams",
    "FetchMessagesResult",
    "FetchedMessage",
    "InitializeParams",
    "InitializeResult",
    "LeaveReason",
    "ListPeersResult",
    "ListSubscriptionsResult",
    "MAX_DEBOUNCE_MS",
    "PeerJoined",
    "PeerInfo",
    "PeerInflight",
    "PeerLeft",
    "PingResult",
    "PresenceType",
    "ProcessMessageParams",
    "ProcessMessageResult",
    "SendMessageParams",
    "SendMessageResult",
    "ServerInfo",
    "SubscribeParams",
    "SubscribeResult",
    "SubscriptionInfo",
    "Traceparent",
    "UnsubscribeParams",
]

CLIENT_ID_PATTERN = r"^[a-z][a-z0-9_-]{0,31}:[A-Za-z0-9_-][A-Za-z0-9._-]{0,95}$"
"""``prefix:name``: lowercase prefix, then a name of letters, digits, ``.``, ``_``, ``-`` that
does not start with ``.`` (Telegram group chats are ``tg:-100123``)."""

ROLE_NAME_PATTERN = r"^[a-z][a-z0-9_-]{0,63}$"
"""A role name in the authorization policy (``controller``, ``gateway``, ``tg-peer``)."""

_TYPE_PATTERN = r"^[a-z][a-z0-9_]{0,63}$"

Traceparent = Annotated[
    str,
    Field(
        pattern=TRACEPARENT_PATTERN, json_schema_extra={"not": {"pattern": TRACEPARENT_FORBIDDEN}}
    ),
]
"""A W3C ``traceparent``; :func:`schemas.common.traceparent_problem` says what is wrong with one."""

MAX_DEBOUNCE_MS = 86_400_000
"""The longest ``debounceMs`` a subscription may ask for: one day."""

Epoch = Annotated[int, Field(ge=0, le=(1 << 63) - 1)]
"""A message's epoch: a 64-bit integer the bus gives each message it accepts, increasing."""


class _Wire(BaseModel):
    model_config = ConfigDict(extra="forbid", populate_by_name=True)


class ClientInfo(_Wire):
    """What the peer says it is; informational only."""

    name: str = Field(max_length=100)
    version: str = Field(default="", max_length=50)


class Auth(_Wire):
    """The credential proving the clientId."""

    token: str = Field(min_length=1, max_length=512)


class InitializeParams(_Wire):
    """``initialize``: the first request on every connection."""

    client_id: str = Field(alias="clientId", pattern=CLIENT_ID_PATTERN)
    client_info: ClientInfo | None = Field(default=None, alias="clientInfo")
    auth: Auth | None = None
    protocol_version: str | None = Field(default=None, alias="protocolVersion", max_length=50)


class ServerInfo(_Wire):
    name: str
    version: str


class Capabilities(_Wire):
    """What the bus offers this peer; ``topics`` are the patterns it may subscribe to."""

    subscribe: bool = True
    publish: bool = True
    process_message: bool = Field(default=True, alias="processMessage")
    topics: list[str] = Field(default_factory=list)


class InitializeResult(_Wire):
    """``epoch`` is the latest epoch the bus had given when it answered (0 for none yet): a
    peer that fetches from it later misses nothing that was sent after it connected."""

    server_id: str = Field(alias="serverId")
    server_info: ServerInfo = Field(alias="serverInfo")
    capabilities: Capabilities
    epoch: Epoch


class SubscribeParams(_Wire):
    """``subscribe``: ``topic`` is a pattern (``*`` segments allowed).

    ``debounceMs``: after a push on a topic, further messages on that topic within this many
    milliseconds are not pushed; when the window ends the latest of them is, with ``skipped``.
    ``minRelevance``: messages whose envelope ``relevance`` is below it are not pushed. Every
    message stays fetchable by epoch. 0 (the default) turns either off.
    """

    topic: str = Field(min_length=1, max_length=256)
    debounce_ms: int = Field(default=0, alias="debounceMs", ge=0, le=MAX_DEBOUNCE_MS)
    min_relevance: float = Field(default=0.0, alias="minRelevance", ge=0, le=1)


class UnsubscribeParams(_Wire):
    """``unsubscribe``: ``topic`` is the pattern exactly as it was subscribed."""

    topic: str = Field(min_length=1, max_length=256)


class SubscribeResult(_Wire):
    success: Literal[True] = True


class SubscriptionInfo(_Wire):
    """One subscription of this connection, with its options (0: off)."""

    topic: str
    debounce_ms: int = Field(alias="debounceMs", ge=0, le=MAX_DEBOUNCE_MS)
    min_relevance: float = Field(alias="minRelevance", ge=0, le=1)


class ListSubscriptionsResult(_Wire):
    """``listSubscriptions``: this connection's subscriptions, sorted by pattern."""

    subscriptions: list[SubscriptionInfo]


class Envelope(_Wire):
    """The payload of every ``sendMessage`` and ``processMessage``."""

    message_id: str = Field(alias="messageId", min_length=1, max_length=128)
    type: str = Field(pattern=_TYPE_PATTERN)
    from_: str = Field(alias="from", pattern=CLIENT_ID_PATTERN)
    timestamp: AwareDatetime
    content: dict[str, Any]
    correlation_id: str | None = Field(default=None, alias="correlationId", max_length=128)
    traceparent: Traceparent | None = None
    """W3C Trace Context ``traceparent`` (version 00 form, lowercase hex); the bus stores its
    trace id with the message's log rows."""
    relevance: float | None = Field(default=None, ge=0, le=1, strict=True)
    """How relevant the sender rates this message, 0 to 1; subscriptions with a
    ``minRelevance`` above it are not pushed it. A message without one is pushed to all."""

    @field_validator("traceparent")
    @classmethod
    def _check_traceparent(cls, value: str | None) -> str | None:
        # The pattern gives the form; W3C also forbids version ff and all-zero ids.
        problem = None if value is None else traceparent_problem(value)
        if problem is not None:
            raise ValueError(problem)
        return value


class SendMessageParams(_Wire):
    """``sendMessage``: ``topic`` is the only routing field; it may not contain ``*``."""

    topic: str = Field(min_length=1, max_length=256)
    payload: Envelope


class SendMessageResult(_Wire):
    """``deliveredTo`` counts the peers that answered ``processed: true``; ``epoch`` is the
    message's place in the bus's order."""

    accepted: bool
    message_id: str = Field(alias="messageId")
    delivered_to: int = Field(alias="deliveredTo")
    epoch: Epoch

    @staticmethod
    def frame(message_id: str, delivered_to: int, epoch: int) -> dict[str, Any]:
        """This result's wire form, for the bus's hot path: what
        ``SendMessageResult(...).model_dump(by_alias=True)`` gives, 30 times cheaper (a test
        holds the two equal)."""
        return {
            "accepted": True,
            "messageId": message_id,
            "deliveredTo": delivered_to,
            "epoch": epoch,
        }


class ProcessMessageParams(_Wire):
    """``processMessage``: what the bus sends each matching subscriber.

    ``skipped`` is there on a push that ends a ``debounceMs`` window: how many earlier messages
    on this topic were not pushed in it (fetch them by epoch if you need them).
    """

    topic: str
    payload: Envelope
    epoch: Epoch
    skipped: int | None = Field(default=None, ge=1)


class ProcessMessageResult(_Wire):
    """A peer's answer to ``processMessage``."""

    processed: bool
    status: str = Field(default="ok", max_length=64)
    message: str = Field(default="", max_length=1000)


class PingResult(_Wire):
    pong: Literal[True] = True
    server_time: AwareDatetime = Field(alias="serverTime")

    @staticmethod
    def frame(server_time: str) -> dict[str, Any]:
        """This result's wire form with ``server_time`` as the wire writes times
        (:func:`schemas.common.timestamp`); a test holds it equal to the model's."""
        return {"pong": True, "serverTime": server_time}


class FetchMessagesParams(_Wire):
    """``fetchMessages``: the messages after ``sinceEpoch`` on topics matching ``topic``.

    ``sinceEpoch`` 0 means from the oldest message kept. ``limit`` is capped by the bus's
    ``max_fetch_messages``.
    """

    topic: str = Field(min_length=1, max_length=256)
    since_epoch: Epoch = Field(alias="sinceEpoch")
    limit: int = Field(default=100, ge=1)


class FetchedMessage(_Wire):
    """One message read back from the log, as it was pushed: topic, envelope, epoch."""

    epoch: Epoch
    topic: str
    payload: Envelope


class FetchMessagesResult(_Wire):
    """A page of messages, oldest first. Pass ``nextEpoch`` as the next ``sinceEpoch``; while
    ``more`` is true there may be more (a page can hold fewer than ``limit`` and still have
    more: the bus reads a bounded number of log rows per call)."""

    messages: list[FetchedMessage]
    next_epoch: Epoch = Field(alias="nextEpoch")
    more: bool


class PeerInflight(_Wire):
    """What one peer has in progress: its requests being handled, deliveries awaiting it."""

    requests: int = Field(ge=0)
    deliveries: int = Field(ge=0)


class PeerInfo(_Wire):
    """One connected peer, as ``listPeers`` reports it."""

    client_id: str = Field(alias="clientId", pattern=CLIENT_ID_PATTERN)
    roles: list[Annotated[str, Field(pattern=ROLE_NAME_PATTERN)]]
    taint: str
    since: AwareDatetime
    """When it completed ``initialize``."""
    address: str
    """Where it connects from (``in-process`` for a peer in the bus's own process)."""
    subscriptions: list[str]
    inflight: PeerInflight


class ListPeersResult(_Wire):
    """``listPeers`` (operators only): every authenticated peer, sorted by clientId."""

    peers: list[PeerInfo]


# Presence: what the bus publishes on system:presence, from system:bus.

PresenceType = Literal["peer_joined", "peer_left"]
"""The ``type`` of every presence payload."""

LeaveReason = Literal["disconnected", "replaced", "revoked"]
"""Why a peer left: its socket closed, a newer connection for its clientId took over, or a
reload revoked its token or its roles (close code 4005)."""


class _Presence(_Wire):
    # Events as the bus sent them: nothing coerced, nothing changed after the fact.
    model_config = ConfigDict(strict=True, frozen=True)


class PeerJoined(_Presence):
    """``peer_joined`` (bus -> ``system:presence``): a peer completed ``initialize``.

    ``roles`` are the roles it holds, sorted, each once.
    """

    client_id: str = Field(alias="clientId", pattern=CLIENT_ID_PATTERN)
    roles: list[Annotated[str, Field(pattern=ROLE_NAME_PATTERN)]] = Field(
        json_schema_extra={"uniqueItems": True}
    )

    @field_validator("roles")
    @classmethod
    def _check_sorted(cls, roles: list[str]) -> list[str]:
        # A schema can say "each once" but not "sorted": the model checks both.
        if roles != sorted(set(roles)):
            raise ValueError("roles are sorted, each once")
        return roles


class PeerLeft(_Presence):
    """``peer_left`` (bus -> ``system:presence``): a peer's connection is gone.

    ``reason`` is ``disconnected`` (its socket closed), ``replaced`` (a newer connection for
    the same clientId took over; a ``peer_joined`` for that connection follows) or ``revoked``
    (a reload removed or rotated its token, or the policy no longer admits its roles).
    """

    client_id: str = Field(alias="clientId", pattern=CLIENT_ID_PATTERN)
    reason: LeaveReason


# Delivery status: what the bus sends a sender when it could not deliver to a webhook peer.

DELIVERY_STATUS_TYPE = "delivery_status"
"""The ``type`` of the bus's message about a delivery that failed for good."""


DeliveryFailure = Literal[
    "timeout", "refused", "http_error", "bad_answer", "too_large", "cancelled"
]
"""Why a webhook delivery failed, as a code: no answer in time, no connection (refused,
unreachable, a TLS failure, an address the bus may not call), a status that is not 2xx, a 2xx
body that is not a JSON-RPC response to the request, an answer past the size cap, or the
delivery's ``process_timeout`` or a shutdown ending it between attempts."""


class DeliveryStatus(_Presence):
    """``delivery_status`` (bus -> the sender's own clientId): a message the bus accepted could
    not be delivered to a webhook peer after every retry.

    It carries codes only, never text the webhook wrote (its reason phrase, its body): the
    message is from ``system:bus``, which is untainted, and the webhook peer may be a tainted
    reader. What the webhook answered is in the ``delivery_failed`` row of the log, under
    ``messageId``.
    """

    message_id: str = Field(alias="messageId", min_length=1, max_length=128)
    topic: str = Field(min_length=1, max_length=256)
    target: str = Field(pattern=CLIENT_ID_PATTERN)
    status: Literal["failed"] = "failed"
    reason: DeliveryFailure
    attempts: int = Field(ge=1)
    http_status: int | None = Field(default=None, alias="httpStatus", ge=100, le=599)
    """The last answer's HTTP status when ``reason`` is ``http_error`` and the target is no
    more tainted than the sender; None otherwise (a status number is a choice the webhook
    makes, so it goes only where the taint rule lets the webhook's own messages go)."""


PRESENCE_MODELS: dict[str, type[BaseModel]] = {
    "peer_joined": PeerJoined,
    "peer_left": PeerLeft,
}
"""The content model of each presence ``type``: ``PRESENCE_MODELS[type].model_validate(c)``."""

BUS_MESSAGE_MODELS: dict[str, type[BaseModel]] = {
    **PRESENCE_MODELS,
    DELIVERY_STATUS_TYPE: DeliveryStatus,
}
"""The content model of every message ``system:bus`` sends, by ``type``. Its messages are
untainted, so readers (``fetchMessages``, the MCP inbox) pass one on only as its model reads it:
add a new one here, or it is withheld."""
