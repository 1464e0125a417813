"""The HTTP binding's wire: request and response bodies, and the OpenAPI document built from them.

``POST /v1/messages`` takes a :class:`PostMessage` and answers :class:`Accepted` (202) or, with
``?wait=true``, the ``sendMessage`` result; every error answers :class:`ErrorBody`, the JSON-RPC
error object the WebSocket answer would carry. ``GET /.well-known/bcpbus`` answers
:class:`Discovery`. :data:`ROUTES` lists every route once, with its bodies and statuses: the
bus routes requests by it, and :func:`openapi_document`, the OpenAPI 3.1 document of all of it,
is built from it; the bus serves that at ``/openapi.json``.

Webhook POSTs (bus -> a webhook peer) are the JSON-RPC ``processMessage`` request of
``jsonrpc.request.json`` with the headers :data:`SIGNATURE_HEADER` and
:data:`TIMESTAMP_HEADER`; :func:`signature` is how both sides compute the signature.
"""

from __future__ import annotations

import hashlib
import hmac
from dataclasses import dataclass
from typing import Any, Final, Literal

from pydantic import AwareDatetime, BaseModel, ConfigDict, Field, field_validator
from pydantic.json_schema import models_json_schema

from .bus import (
    _TYPE_PATTERN,
    CLIENT_ID_PATTERN,
    Epoch,
    FetchedMessage,
    ListSubscriptionsResult,
    SendMessageResult,
    SubscribeResult,
    Traceparent,
)
from .common import TRACEPARENT_FORBIDDEN, TRACEPARENT_PATTERN, traceparent_problem
from .jsonrpc import ErrorObject

__all__ = [
    "SIGNATURE_HEADER",
    "TIMESTAMP_HEADER",
    "Accepted",
    "Discovery",
    "Endpoints",
    "ERROR_STATUSES",
    "ErrorBody",
    "MessagesPage",
    "MessagesQuery",
    "Operation",
    "PostMessage",
    "ROUTES",
    "SubscriptionBody",
    "WebhookSigning",
    "check_traceparent",
    "openapi_document",
    "signature",
]

SIGNATURE_HEADER: Final = "X-Bcpbus-Signature"
"""``sha256=<hex HMAC-SHA256 of "<timestamp>.<body>" under the peer's webhook secret>``."""
TIMESTAMP_HEADER: Final = "X-Bcpbus-Timestamp"
"""Unix seconds when the bus signed the POST; part of what is signed, so it cannot be changed."""


def signature(secret: str, timestamp: str, body: bytes) -> str:
    """The ``X-Bcpbus-Signature`` value of a webhook POST: ``sha256=`` and 64 hex digits.

    The HMAC covers the timestamp header and the body, joined by ``.``: a signature over the
    body alone would let whoever saw one POST replay it later under a fresh timestamp. A
    receiver recomputes it and compares with :func:`hmac.compare_digest`, and refuses a
    timestamp more than five minutes from its clock.
    """
    mac = hmac.new(secret.encode(), timestamp.encode() + b"." + body, hashlib.sha256)
    return "sha256=" + mac.hexdigest()


def check_traceparent(value: str) -> str:
    """Return ``value`` if it is a W3C Trace Context ``traceparent`` this bus accepts.

    Beyond the pattern (version, 32 and 16 lowercase hex digits, flags): version ``ff`` is
    invalid, and so are an all-zero trace id or parent id (W3C Trace Context §3.2.2). The rules
    are :func:`schemas.common.traceparent_problem`'s, as for the envelope's field.

    Raises:
        ValueError: it is not; the message says which part.
    """
    problem = traceparent_problem(value)
    if problem is not None:
        raise ValueError(problem)
    return value


class _Wire(BaseModel):
    model_config = ConfigDict(extra="forbid", populate_by_name=True)


class PostMessage(_Wire):
    """``POST /v1/messages``: a message to publish as the peer whose token authorized it.

    The bus builds the envelope: ``from`` is that peer, ``timestamp`` is now, ``messageId`` is
    the one given (a retry with the same id is refused with 409 inside ``dedup_window``) or a
    new one. A ``traceparent`` header fills ``traceparent`` when the body has none.
    """

    topic: str = Field(min_length=1, max_length=256)
    type: str = Field(pattern=_TYPE_PATTERN)
    content: dict[str, Any]
    message_id: str | None = Field(default=None, alias="messageId", min_length=1, max_length=128)
    correlation_id: str | None = Field(default=None, alias="correlationId", max_length=128)
    traceparent: Traceparent | None = None

    @field_validator("traceparent")
    @classmethod
    def _check_traceparent(cls, value: str | None) -> str | None:
        return None if value is None else check_traceparent(value)


class Accepted(_Wire):
    """202: the message is accepted (authorized, logged) and is being delivered; ``epoch`` is
    its place in the bus's order, as in the ``sendMessage`` result."""

    message_id: str = Field(alias="messageId")
    epoch: Epoch


class MessagesQuery(_Wire):
    """``GET /v1/messages``'s query: what ``fetchMessages`` takes, and narrower filters.

    ``since`` is the epoch after which to read (0: from the oldest kept); ``from`` the sender's
    clientId; ``until`` a time: only messages the bus accepted before it.
    """

    topic: str = Field(min_length=1, max_length=256)
    since: Epoch = 0
    limit: int = Field(default=100, ge=1)
    type: str | None = Field(default=None, pattern=_TYPE_PATTERN)
    correlation_id: str | None = Field(
        default=None, alias="correlationId", min_length=1, max_length=128
    )
    from_: str | None = Field(default=None, alias="from", pattern=CLIENT_ID_PATTERN)
    until: AwareDatetime | None = None


class MessagesPage(_Wire):
    """``GET /v1/messages``: a page of messages, oldest first, as ``fetchMessages`` answers it,
    and ``next``, the path and query of the next page (null when ``more`` is false)."""

    messages: list[FetchedMessage]
    next_epoch: Epoch = Field(alias="nextEpoch")
    more: bool
    next: str | None


class ErrorBody(_Wire):
    """Every error answer: the JSON-RPC error object, with the same code and message."""

    error: ErrorObject


class SubscriptionBody(_Wire):
    """``POST /v1/subscriptions``: a pattern to subscribe the peer's webhook to."""

    topic: str = Field(min_length=1, max_length=256)


class Endpoints(_Wire):
    """Where each part of the bus is; paths are relative to ``http``."""

    websocket: str
    http: str
    messages: str = "/v1/messages"
    subscriptions: str = "/v1/subscriptions"
    metrics: str = "/metrics"
    openapi: str = "/openapi.json"
    health: str = "/healthz"


class WebhookSigning(_Wire):
    """How webhook POSTs are signed (see :func:`signature`)."""

    signature_header: str = Field(default=SIGNATURE_HEADER, alias="signatureHeader")
    timestamp_header: str = Field(default=TIMESTAMP_HEADER, alias="timestampHeader")
    algorithm: str = "HMAC-SHA256 over <timestamp>.<body>"


class Discovery(_Wire):
    """``GET /.well-known/bcpbus``: what this bus is and offers, without authentication."""

    name: str = "bcpbus"
    version: str
    server_id: str = Field(alias="serverId")
    endpoints: Endpoints
    methods: list[str]
    capabilities: dict[str, bool]
    limits: dict[str, float | int | None]
    webhooks: WebhookSigning = Field(default_factory=WebhookSigning)


_BODIES: Final = (
    PostMessage,
    Accepted,
    SendMessageResult,
    MessagesPage,
    ListSubscriptionsResult,
    ErrorBody,
    SubscriptionBody,
    SubscribeResult,
    Discovery,
)

ERROR_STATUSES: Final = {
    "400": "Malformed body, envelope, topic or parameter (-32700, -32600, -32602)",
    "401": "No token, or a token no peer has (-32002)",
    "403": "The policy does not let this peer do it (-32602)",
    "404": "Not subscribed to that pattern (-32003)",
    "409": "This messageId was already accepted from this peer (-32008); or the peer has no "
    "webhook to subscribe (-32001)",
    "410": "sinceEpoch is outside what the log keeps (-32009; data: oldestEpoch, "
    "latestEpoch), or the log keeps only digests of messages (-32010)",
    "413": "The body is larger than max_frame_bytes (-32600)",
    "429": "A limit is reached; retry later (-32005)",
    "503": "The activity log is unavailable or the bus is shutting down (-32006, -32007)",
}
"""What each error status of the HTTP binding means, with its JSON-RPC codes; each error class
of :mod:`bus.core.errors` names its status as ``http_status``."""


def _ref(model: type[BaseModel]) -> dict[str, str]:
    return {"$ref": f"#/components/schemas/{model.__name__}"}


def _json(model: type[BaseModel], description: str) -> dict[str, Any]:
    return {"description": description, "content": {"application/json": {"schema": _ref(model)}}}


def _errors(*codes: str) -> dict[str, Any]:
    return {code: _json(ErrorBody, ERROR_STATUSES[code]) for code in codes}


def _text(description: str) -> dict[str, Any]:
    return {"description": description, "content": {"text/plain": {"schema": {"type": "string"}}}}


def _query_parameters() -> list[dict[str, Any]]:
    """The query parameters of ``GET /v1/messages``, from :class:`MessagesQuery`."""
    schema = MessagesQuery.model_json_schema(by_alias=True)
    required = set(schema.get("required", ()))
    parameters = []
    for name, field in schema["properties"].items():
        field = {key: value for key, value in field.items() if key != "title"}
        choices = field.pop("anyOf", None)
        if choices:  # optional: the query has the value, or not the parameter at all
            field.update(choices[0])
            field.pop("default", None)
        parameters.append(
            {"name": name, "in": "query", "required": name in required, "schema": field}
        )
    return parameters


@dataclass(frozen=True, slots=True)
class Operation:
    """One route of the HTTP binding, written once: the bus serves it
    (:class:`bus.transports.http.HttpBinding` maps :attr:`operation_id` to its handler) and
    :func:`openapi_document` describes it.

    ``answers`` are ``(status, body model, description)``, the model None for ``text/plain``;
    ``errors`` are statuses answered with :class:`ErrorBody` (:data:`ERROR_STATUSES` says when).
    """

    method: Literal["GET", "POST", "DELETE"]
    path: str
    operation_id: str
    summary: str
    answers: tuple[tuple[str, type[BaseModel] | None, str], ...]
    errors: tuple[str, ...] = ()
    secured: bool = False
    """Authenticated with the peer's token (``Authorization: Bearer``)."""
    body: type[BaseModel] | None = None
    parameters: tuple[dict[str, Any], ...] = ()
    documented: bool = True
    """False for ``/openapi.json`` itself, which the document does not list."""

    def openapi(self) -> dict[str, Any]:
        """This operation as an OpenAPI 3.1 operation object."""
        operation: dict[str, Any] = {"operationId": self.operation_id, "summary": self.summary}
        if self.secured:
            operation["security"] = [{"bearer": []}]
        if self.parameters:
            operation["parameters"] = list(self.parameters)
        if self.body is not None:
            content = {"application/json": {"schema": _ref(self.body)}}
            operation["requestBody"] = {"required": True, "content": content}
        responses = {
            status: _text(text) if model is None else _json(model, text)
            for status, model, text in self.answers
        }
        operation["responses"] = {**responses, **_errors(*self.errors)}
        return operation


_WAIT: Final = {
    "name": "wait",
    "in": "query",
    "required": False,
    "description": "true: answer once delivered, with the sendMessage result (200); otherwise "
    "202 as soon as the message is accepted",
    "schema": {"type": "boolean", "default": False},
}
_TRACEPARENT: Final = {
    "name": "traceparent",
    "in": "header",
    "required": False,
    "description": "W3C trace context; kept on the envelope",
    "schema": {
        "type": "string",
        "pattern": TRACEPARENT_PATTERN,
        "not": {"pattern": TRACEPARENT_FORBIDDEN},
    },
}
_TOPIC: Final = {
    "name": "topic",
    "in": "query",
    "required": True,
    "schema": {"type": "string", "minLength": 1, "maxLength": 256},
}

ROUTES: Final = (
    Operation(
        "POST",
        "/v1/messages",
        "postMessage",
        "Publish a message as the token's peer",
        answers=(
            ("202", Accepted, "Accepted; delivery goes on"),
            ("200", SendMessageResult, "Delivered (wait=true)"),
        ),
        errors=("400", "401", "403", "409", "413", "429", "503"),
        secured=True,
        body=PostMessage,
        parameters=(_WAIT, _TRACEPARENT),
    ),
    Operation(
        "GET",
        "/v1/messages",
        "getMessages",
        "Page through the messages after an epoch that the token's peer may receive now "
        "(fetchMessages), oldest first",
        answers=(("200", MessagesPage, "A page; follow next while more is true"),),
        errors=("400", "401", "403", "410", "503"),
        secured=True,
        parameters=tuple(_query_parameters()),
    ),
    Operation(
        "GET",
        "/v1/subscriptions",
        "listSubscriptions",
        "The token's webhook peer's subscriptions, with their options",
        answers=(("200", ListSubscriptionsResult, "Its subscriptions"),),
        errors=("401", "409", "503"),
        secured=True,
    ),
    Operation(
        "POST",
        "/v1/subscriptions",
        "subscribe",
        "Subscribe the token's webhook peer to a pattern (until the bus restarts; the peers "
        "file holds the lasting ones)",
        answers=(("200", SubscribeResult, "Subscribed"),),
        errors=("400", "401", "403", "409", "413", "429", "503"),
        secured=True,
        body=SubscriptionBody,
    ),
    Operation(
        "DELETE",
        "/v1/subscriptions",
        "unsubscribe",
        "Unsubscribe the token's webhook peer from a pattern",
        answers=(("200", SubscribeResult, "Unsubscribed"),),
        errors=("400", "401", "404", "409", "503"),
        secured=True,
        parameters=(_TOPIC,),
    ),
    Operation(
        "GET",
        "/.well-known/bcpbus",
        "discover",
        "Version, endpoints, methods, capabilities and limits",
        answers=(("200", Discovery, "This bus"),),
    ),
    Operation(
        "GET",
        "/metrics",
        "metrics",
        "Prometheus metrics (text format 0.0.4)",
        answers=(("200", None, "The metrics"),),
    ),
    Operation(
        "GET",
        "/healthz",
        "health",
        "200 while the bus serves",
        answers=(("200", None, "ok"), ("503", None, "shutting down")),
    ),
    Operation(
        "GET",
        "/openapi.json",
        "openapi",
        "This document",
        answers=(("200", None, "The OpenAPI 3.1 document"),),
        documented=False,
    ),
)
"""Every route of the HTTP binding, in the order it matches them."""


def _paths() -> dict[str, Any]:
    paths: dict[str, Any] = {}
    for operation in ROUTES:
        if operation.documented:
            paths.setdefault(operation.path, {})[operation.method.lower()] = operation.openapi()
    return paths


def openapi_document(server_url: str | None = None) -> dict[str, Any]:
    """The OpenAPI 3.1 document of the HTTP binding.

    Args:
        server_url: the ``servers`` entry (the bus serves its own URL); None leaves it out.
    """
    _, schemas = models_json_schema(
        [(model, "validation") for model in _BODIES],
        by_alias=True,
        ref_template="#/components/schemas/{model}",
    )
    document: dict[str, Any] = {
        "openapi": "3.1.0",
        "info": {
            "title": "bcpbus HTTP binding",
            "version": "1",
            "description": "Publish, subscribe webhook peers, discover and monitor a bcpbus "
            "over HTTP. Authentication: the token `bcpbus peers add` printed, as "
            "`Authorization: Bearer`. Errors carry the JSON-RPC error object of the "
            "WebSocket protocol (docs/http.md).",
        },
        "paths": _paths(),
        "components": {
            "schemas": schemas["$defs"],
            "securitySchemes": {"bearer": {"type": "http", "scheme": "bearer"}},
        },
    }
    if server_url is not None:
        document["servers"] = [{"url": server_url}]
    return document
