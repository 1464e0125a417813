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

__all__ = [
    "CLIENT_ID_PATTERN",
    "PRESENCE_MODELS",
    "ROLE_NAME_PATTERN",
    "Auth",
    "Capabilities",
    "ClientInfo",
    "DELIVERY_STATUS_TYPE",
    "DeliveryStatus",
    "Envelope",
    "InitializeParams",
    "InitializeResult",
    "LeaveReason",
    "ListPeersResult",
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
]

CLIENT_ID_PATTERN = r"^[a-z][a-z0-9_-]{0,31}:[A-Za-z0-9_-][A-Za-z0-9._-]{0,95}$"
"""``prefix:name``: lowercase prefix, then a name of letters, digits, ``.``, ``_``, ``-`` that
does not start with ``.`` (Telegram group chats are ``tg:-100123``)."""

ROLE_NAME_PATTERN = r"^[a-z][a-z0-9_-]{0,63}$"
"""A role name in the authorization policy (``controller``, ``gateway``, ``tg-peer``)."""

_TYPE_PATTERN = r"^[a-z][a-z0-9_]{0,63}$"
_TRACEPARENT_PATTERN = r"^[0-9a-f]{2}-[0-9a-f]{32}-[0-9a-f]{16}-[0-9a-f]{2}$"


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
    server_id: str = Field(alias="serverId")
    server_info: ServerInfo = Field(alias="serverInfo")
    capabilities: Capabilities


class SubscribeParams(_Wire):
    """``subscribe`` / ``unsubscribe``: ``topic`` is a pattern (``*`` segments allowed)."""

    topic: str = Field(min_length=1, max_length=256)


class SubscribeResult(_Wire):
    success: Literal[True] = True


class Envelope(_Wire):
    """The payload of every ``sendMessage`` and ``processMessage``."""

    message_id: str = Field(alias="messageId", min_length=1, max_length=128)
    type: str = Field(pattern=_TYPE_PATTERN)
    from_: str = Field(alias="from", pattern=CLIENT_ID_PATTERN)
    timestamp: AwareDatetime
    content: dict[str, Any]
    correlation_id: str | None = Field(default=None, alias="correlationId", max_length=128)
    traceparent: str | None = Field(default=None, pattern=_TRACEPARENT_PATTERN)


class SendMessageParams(_Wire):
    """``sendMessage``: ``topic`` is the only routing field; it may not contain ``*``."""

    topic: str = Field(min_length=1, max_length=256)
    payload: Envelope


class SendMessageResult(_Wire):
    """``deliveredTo`` counts the peers that answered ``processed: true``."""

    accepted: bool
    message_id: str = Field(alias="messageId")
    delivered_to: int = Field(alias="deliveredTo")


class ProcessMessageParams(_Wire):
    """``processMessage``: what the bus sends each matching subscriber."""

    topic: str
    payload: Envelope


class ProcessMessageResult(_Wire):
    """A peer's answer to ``processMessage``."""

    processed: bool
    status: str = Field(default="ok", max_length=64)
    message: str = Field(default="", max_length=1000)


class PingResult(_Wire):
    pong: Literal[True] = True
    server_time: AwareDatetime = Field(alias="serverTime")


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


class DeliveryStatus(_Presence):
    """``delivery_status`` (bus -> the sender's own clientId): a message the bus accepted could
    not be delivered to a webhook peer after every retry.

    ``reason`` is the last attempt's outcome: ``timeout``, ``connect_error``, ``http_<status>``
    (a status the webhook answered that is not a JSON-RPC answer), ``malformed_response``,
    ``cancelled`` (``process_timeout`` or a shutdown ended the delivery between attempts).
    The message is in the log under ``messageId`` with a ``delivery_failed`` row.
    """

    message_id: str = Field(alias="messageId", min_length=1, max_length=128)
    topic: str = Field(min_length=1, max_length=256)
    target: str = Field(pattern=CLIENT_ID_PATTERN)
    status: Literal["failed"] = "failed"
    reason: str = Field(max_length=64)
    attempts: int = Field(ge=1)
    error: str = Field(default="", max_length=500)
    """What the last attempt got, for a person: the status line, the timeout, the exception."""


PRESENCE_MODELS: dict[str, type[BaseModel]] = {
    "peer_joined": PeerJoined,
    "peer_left": PeerLeft,
}
"""The content model of each presence ``type``: ``PRESENCE_MODELS[type].model_validate(c)``."""
