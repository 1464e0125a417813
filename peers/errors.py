"""The exceptions of the peer SDK, under one root.

Everything :class:`~peers.client.Peer`, :class:`~peers.bcp.Controller` and
:class:`~peers.bcp.Reader` raise is a :class:`PeerError`, the bus's own answers included: a
JSON-RPC error response is raised as a :class:`RequestRefused`, the subclass of its code
(:class:`AuthenticationFailed`, :class:`Forbidden`...), carrying the bus's ``code``,
``message`` and ``data``. So one ``except PeerError`` catches every failure, and
``except RequestRefused`` every refusal. The transport's exceptions (websockets, ``OSError``)
never leave the SDK: they are translated where they happen and kept as ``__cause__``.

.. code-block:: text

    PeerError
    ├── ConnectFailed      (ConnectionError)  the bus was unreachable or refused the handshake
    ├── InvalidURL         (ValueError)       the url is not a ws:// or wss:// URI
    ├── PeerClosed         (bus.core.calls.PeerGone, a ConnectionError)  not connected, or closed
    │                                         before the answer came: the bus's PeerGone too
    ├── PeerTimeout        (TimeoutError)     no answer in time
    ├── MalformedMessage   (ValueError)       the gateway sent content its schema does not allow
    ├── QueryFailed                           BCP: the gateway ended a query without a delivery
    └── RequestRefused     (bus.core.errors.BusError)  the bus answered with a JSON-RPC error
        ├── ParseError, InvalidRequest, MethodNotFound        -32700, -32600, -32601
        ├── InvalidParams                                     -32602
        │   └── Forbidden                                     -32602, the policy said no
        ├── InternalError                                     -32603
        ├── NotInitialized, AuthenticationFailed              -32001, -32002
        ├── SubscriptionNotFound, AlreadyInitialized          -32003, -32004
        ├── LimitExceeded, AuditUnavailable, ShuttingDown     -32005, -32006, -32007
        ├── DuplicateMessage                                  -32008
        ├── EpochNotKept, ContentNotKept                      -32009, -32010
        └── RemoteError                                       a code this SDK does not know

Each class also derives from the builtin that code written before this tree catches
(``except ConnectionError``, ``except TimeoutError``), so that code keeps working; and each
refusal from its class in :mod:`bus.core.errors`, so ``except BusError`` and
``except bus.core.errors.AuthenticationFailed`` still catch it. The codes, what they mean and
what to do are in docs/protocol.md.
"""

from __future__ import annotations

from bus.core import errors as bus
from bus.core.calls import PeerGone

__all__ = [
    "AlreadyInitialized",
    "AuditUnavailable",
    "AuthenticationFailed",
    "ConnectFailed",
    "ContentNotKept",
    "DuplicateMessage",
    "EpochNotKept",
    "Forbidden",
    "InternalError",
    "InvalidParams",
    "InvalidRequest",
    "InvalidURL",
    "LimitExceeded",
    "MalformedMessage",
    "MethodNotFound",
    "NotInitialized",
    "ParseError",
    "PeerClosed",
    "PeerError",
    "PeerTimeout",
    "QueryFailed",
    "RemoteError",
    "RequestRefused",
    "ShuttingDown",
    "SubscriptionNotFound",
    "refused",
]


class PeerError(Exception):
    """Base class of every exception the SDK raises."""


class ConnectFailed(PeerError, ConnectionError):
    """The connection could not be opened: refused, unreachable, or the handshake failed.

    Attributes:
        url: the bus's URL.
        status: the HTTP status the bus answered the handshake with (503 when it is full or
            shutting down), or None if it did not answer with one.
    """

    def __init__(self, url: str, detail: str, *, status: int | None = None) -> None:
        super().__init__(url, detail)
        self.url = url
        self.detail = detail
        self.status = status

    def __str__(self) -> str:
        return f"cannot connect to {self.url}: {self.detail}"


class InvalidURL(PeerError, ValueError):
    """The bus's URL is not a ``ws://`` or ``wss://`` URI.

    Attributes:
        url: the URL as given.
    """

    def __init__(self, url: str, detail: str) -> None:
        super().__init__(url, detail)
        self.url = url
        self.detail = detail

    def __str__(self) -> str:
        return f"{self.url!r} is not a bus URL: {self.detail}"


class PeerClosed(PeerError, PeerGone):
    """The connection is closed: the call could not be made or was not answered.

    Attributes:
        message: what was closed.
        code: the WebSocket close code, when the connection was closed with one (4001:
            another connection took this clientId; see ``bus.core.errors.CLOSE_CODES``).
        reason: the close reason the bus gave.
    """

    def __init__(self, message: str, *, code: int | None = None, reason: str = "") -> None:
        super().__init__(message)
        self.message = message
        self.code = code
        self.reason = reason

    def __str__(self) -> str:
        if self.code is None:
            return self.message
        return f"{self.message} (close code {self.code}{': ' if self.reason else ''}{self.reason})"


class PeerTimeout(PeerError, TimeoutError):
    """No answer in time: to a request (``request_timeout``), the opening handshake, or an
    :meth:`~peers.bcp.Controller.ask` or :meth:`~peers.bcp.Reader.answer` (``timeout``)."""


class MalformedMessage(PeerError, ValueError):
    """A BCP message whose content its schema (``schemas/json/``) does not allow.

    The ``pydantic.ValidationError`` is the ``__cause__``.

    Attributes:
        message_type: the payload ``type``.
    """

    def __init__(self, message_type: str) -> None:
        super().__init__(message_type)
        self.message_type = message_type

    def __str__(self) -> str:
        return f"malformed {self.message_type} content: its schema does not allow it"


class QueryFailed(PeerError):
    """The gateway ended a query without a delivery: refused, expired, rejected...

    Attributes:
        query_id: the query.
        reason: the reason code (``budget_exhausted``, ``timeout``, ...; see docs/bcp.md).
        detail: what a person can act on.
    """

    def __init__(self, query_id: str, reason: str, detail: str = "") -> None:
        super().__init__(query_id, reason, detail)
        self.query_id = query_id
        self.reason = reason
        self.detail = detail

    def __str__(self) -> str:
        return f"query {self.query_id} failed: {self.reason}: {self.detail}"


# The bus's answers


class RequestRefused(PeerError, bus.BusError):
    """The bus answered a request with a JSON-RPC error; the subclass names its code.

    Attributes:
        code: the JSON-RPC error code (class attribute; :class:`RemoteError` keeps an unknown
            one in ``remote_code``).
        message: the bus's text, for a person.
        data: the error's ``data`` member, or None (-32009 says which epochs are kept).
    """


class ParseError(RequestRefused, bus.ParseError):
    """-32700: the bus could not read the frame as JSON."""


class InvalidRequest(RequestRefused, bus.InvalidRequest):
    """-32600: the frame is not a JSON-RPC 2.0 request."""


class MethodNotFound(RequestRefused, bus.MethodNotFound):
    """-32601: the bus has no such method."""


class InvalidParams(RequestRefused, bus.InvalidParams):
    """-32602: params, the envelope, a topic or a pattern is malformed, or the policy denies
    the type, topic or pattern (the wire does not tell these apart; the message does)."""


class Forbidden(InvalidParams, bus.Forbidden):
    """-32602 from a policy refusal, when the refusal is known to be one (an in-process bus)."""


class InternalError(RequestRefused, bus.InternalError):
    """-32603: something failed inside the bus; its log has the details."""


class NotInitialized(RequestRefused, bus.NotInitialized):
    """-32001: a request before ``initialize``."""


class AuthenticationFailed(RequestRefused, bus.AuthenticationFailed):
    """-32002: the bus does not know the clientId or the token does not match it."""


class SubscriptionNotFound(RequestRefused, bus.SubscriptionNotFound):
    """-32003: ``unsubscribe`` of a pattern this connection is not subscribed to."""


class AlreadyInitialized(RequestRefused, bus.AlreadyInitialized):
    """-32004: a second ``initialize`` on one connection."""


class LimitExceeded(RequestRefused, bus.LimitExceeded):
    """-32005: a configured limit of the bus is reached; retry later."""


class AuditUnavailable(RequestRefused, bus.AuditUnavailable):
    """-32006: the bus's activity log could not commit: nothing was carried out; retry."""


class ShuttingDown(RequestRefused, bus.ShuttingDown):
    """-32007: the bus is closing; reconnect (a peer with ``reconnect`` does) and retry."""


class DuplicateMessage(RequestRefused, bus.DuplicateMessage):
    """-32008: a message with this ``messageId`` was already accepted: take it as done."""


class EpochNotKept(RequestRefused, bus.EpochNotKept):
    """-32009: the bus's log does not cover that epoch; ``data`` says which it keeps."""


class ContentNotKept(RequestRefused, bus.ContentNotKept):
    """-32010: the bus keeps only digests of messages: there is nothing to fetch."""


class RemoteError(RequestRefused, bus.RemoteError):
    """An error code this SDK does not know; ``remote_code`` is the code as sent."""


_BY_CLASS: dict[type[bus.BusError], type[RequestRefused]] = {
    bus.ParseError: ParseError,
    bus.InvalidRequest: InvalidRequest,
    bus.MethodNotFound: MethodNotFound,
    bus.InvalidParams: InvalidParams,
    bus.Forbidden: Forbidden,
    bus.InternalError: InternalError,
    bus.BusError: InternalError,
    bus.NotInitialized: NotInitialized,
    bus.AuthenticationFailed: AuthenticationFailed,
    bus.SubscriptionNotFound: SubscriptionNotFound,
    bus.AlreadyInitialized: AlreadyInitialized,
    bus.LimitExceeded: LimitExceeded,
    bus.AuditUnavailable: AuditUnavailable,
    bus.ShuttingDown: ShuttingDown,
    bus.DuplicateMessage: DuplicateMessage,
    bus.EpochNotKept: EpochNotKept,
    bus.ContentNotKept: ContentNotKept,
}


def refused(error: bus.BusError) -> RequestRefused:
    """Return the SDK's exception for an error answer the session parsed, with its code,
    message and data; one that already is a :class:`RequestRefused` is returned as is.

    The SDK calls it on every error response; call it yourself only to hand on a
    :class:`bus.core.errors.BusError` raised by an in-process bus as the SDK would.
    """
    if isinstance(error, RequestRefused):
        return error
    if isinstance(error, bus.RemoteError):
        return RemoteError(error.remote_code, error.message, data=error.data)
    # The nearest class the map knows: a subclass defined elsewhere (the HTTP binding's
    # BodyTooLarge) becomes its base's; BusError itself is in the map.
    cls = next(_BY_CLASS[base] for base in type(error).__mro__ if base in _BY_CLASS)
    return cls(error.message, data=error.data)
