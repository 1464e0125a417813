"""Pydantic models of the bus methods' params and results, and of the payload envelope.

Field names on the wire are camelCase as the protocol has them; the Python attributes are
snake_case. Validate incoming params with ``Model.model_validate(params)``; the bus answers a
:class:`pydantic.ValidationError` with -32602.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import AwareDatetime, BaseModel, ConfigDict, Field

__all__ = [
    "CLIENT_ID_PATTERN",
    "Auth",
    "Capabilities",
    "ClientInfo",
    "Envelope",
    "InitializeParams",
    "InitializeResult",
    "PingResult",
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
