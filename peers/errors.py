"""The exceptions of the peer SDK, under one root.

Everything :class:`~peers.client.Peer`, :class:`~peers.bcp.Controller` and
:class:`~peers.bcp.Reader` raise is a :class:`PeerError`, except the bus's own answers: a
JSON-RPC error response is raised as the matching :class:`bus.core.errors.BusError` subclass
(``AuthenticationFailed``, ``Forbidden``...), as it always was. The transport's exceptions
(websockets, ``OSError``) never leave the SDK: they are translated where they happen and kept
as ``__cause__``.

.. code-block:: text

    PeerError
    ├── ConnectFailed      (ConnectionError)  the bus was unreachable or refused the handshake
    ├── InvalidURL         (ValueError)       the url is not a ws:// or wss:// URI
    ├── PeerClosed         (bus.core.calls.PeerGone, a ConnectionError)  not connected, or closed
    │                                         before the answer came: the bus's PeerGone too
    ├── PeerTimeout        (TimeoutError)     no answer in time
    ├── MalformedMessage   (ValueError)       the gateway sent content its schema does not allow
    └── QueryFailed                           BCP: the gateway ended a query without a delivery
    bus.core.errors.BusError                  the bus answered with a JSON-RPC error

Each class also derives from the builtin that code written before this tree catches
(``except ConnectionError``, ``except TimeoutError``), so that code keeps working.
"""

from __future__ import annotations

from bus.core.calls import PeerGone

__all__ = [
    "ConnectFailed",
    "InvalidURL",
    "MalformedMessage",
    "PeerClosed",
    "PeerError",
    "PeerTimeout",
    "QueryFailed",
]


class PeerError(Exception):
    """Base class of every exception the SDK raises, other than the bus's error answers."""


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
