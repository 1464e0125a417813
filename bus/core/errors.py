"""The exception tree of bcpbus, one class per JSON-RPC error code.

Every error a peer can see is a :class:`BusError`; its ``code`` class attribute is the JSON-RPC
error code sent on the wire, and its ``message`` is the text a person reads. The session layer
(:mod:`bus.core.protocol`) turns a raised :class:`BusError` into an error response, so handlers only
raise.

.. code-block:: text

    BusError (-32603, also used for anything unexpected: details go to the log only)  HTTP
    ├── ParseError              -32700  the frame is not JSON                            400
    ├── InvalidRequest          -32600  JSON, but not a JSON-RPC 2.0 request             400
    ├── MethodNotFound          -32601                                                   404
    ├── InvalidParams           -32602  params, payload envelope, topic or pattern bad   400
    │   └── Forbidden           -32602  the policy denies this type/topic/pattern        403
    ├── InternalError           -32603  a fixed text; never carries internals            500
    ├── NotInitialized          -32001  a request before ``initialize``                  409
    ├── AuthenticationFailed    -32002  unknown clientId or wrong token                  401
    ├── SubscriptionNotFound    -32003  ``unsubscribe`` of a pattern not subscribed       404
    ├── AlreadyInitialized      -32004  a second ``initialize`` on one connection         409
    ├── LimitExceeded           -32005  a configured limit (subscriptions, in-flight)    429
    ├── AuditUnavailable        -32006  the activity log could not commit: fail closed   503
    ├── ShuttingDown            -32007  the bus is closing and takes no new work         503
    ├── DuplicateMessage        -32008  this sender already sent this messageId          409
    ├── EpochNotKept            -32009  ``fetchMessages`` from an epoch not kept          410
    ├── ContentNotKept          -32010  ``fetchMessages`` from a digest-only log          410
    ├── ClusterUnavailable      -32011  a cluster node cut off from NATS takes no sends  503
    └── RemoteError             (any)   an error response a peer sent us, see ``from_error``  500

The last column is ``http_status``: what the HTTP binding (:mod:`bus.transports.http`) answers
the error with, so that an HTTP client that reads only the status learns the same thing.

WebSocket close codes the bus uses are listed in :data:`CLOSE_CODES`.
"""

from __future__ import annotations

from typing import Any, ClassVar

__all__ = [
    "CLOSE_CODES",
    "CLOSE_AUTH_FAILED",
    "CLOSE_SLOW_CONSUMER",
    "CLOSE_TRY_AGAIN_LATER",
    "CLOSE_UNSUPPORTED_DATA",
    "CLOSE_INITIALIZE_TIMEOUT",
    "CLOSE_REPLACED",
    "CLOSE_REVOKED",
    "CLOSE_EVICTED",
    "CLOSE_FRAME_TIMEOUT",
    "CLOSE_GOING_AWAY",
    "CLOSE_POLICY_VIOLATION",
    "AlreadyInitialized",
    "AuditUnavailable",
    "AuthenticationFailed",
    "BusError",
    "ClusterUnavailable",
    "ContentNotKept",
    "DuplicateMessage",
    "EpochNotKept",
    "Forbidden",
    "InternalError",
    "InvalidParams",
    "InvalidRequest",
    "LimitExceeded",
    "MethodNotFound",
    "NotInitialized",
    "ParseError",
    "RemoteError",
    "ShuttingDown",
    "SubscriptionNotFound",
]


class BusError(Exception):
    """Base class: an error with a JSON-RPC code and a message a person understands.

    Args:
        message: what went wrong, in words the peer's developer can act on. Defaults to the
            class's ``default_message``.
        data: optional JSON-serializable details for the error's ``data`` member.
    """

    code: ClassVar[int] = -32603
    default_message: ClassVar[str] = "Internal error"
    http_status: ClassVar[int] = 500
    """The HTTP status that says what the code says, for the HTTP binding's answers."""

    def __init__(self, message: str | None = None, *, data: Any = None) -> None:
        self.message = message if message is not None else self.default_message
        self.data = data
        super().__init__(self.message)

    def __str__(self) -> str:
        return f"{self.message} ({self.code})"

    def to_error(self) -> dict[str, Any]:
        """Return the JSON-RPC ``error`` object for this exception."""
        error: dict[str, Any] = {"code": self.code, "message": self.message}
        if self.data is not None:
            error["data"] = self.data
        return error

    @staticmethod
    def from_error(error: Any) -> BusError:
        """Build the matching exception from a JSON-RPC ``error`` object received on the wire.

        Known codes give their own class; anything else (or a malformed object) gives a
        :class:`RemoteError` that keeps the code it was sent.
        """
        if not isinstance(error, dict):
            return RemoteError(-32603, "malformed error object")
        code = error.get("code")
        message = error.get("message")
        text = message if isinstance(message, str) else "error"
        data = error.get("data")
        cls = _BY_CODE.get(code) if isinstance(code, int) else None
        if cls is None:
            return RemoteError(code if isinstance(code, int) else -32603, text, data=data)
        return cls(text, data=data)


class ParseError(BusError):
    """The frame is not valid JSON (JSON-RPC 2.0 §5.1)."""

    code = -32700
    default_message = "Parse error: the frame is not valid JSON"
    http_status = 400


class InvalidRequest(BusError):
    """The JSON is not a valid JSON-RPC 2.0 request object."""

    code = -32600
    default_message = "Invalid request"
    http_status = 400


class MethodNotFound(BusError):
    """The method does not exist on this side of the connection."""

    code = -32601
    default_message = "Method not found"
    http_status = 404


class InvalidParams(BusError):
    """Params, the payload envelope, a topic or a pattern is malformed."""

    code = -32602
    default_message = "Invalid params"
    http_status = 400


class Forbidden(InvalidParams):
    """The authorization policy denies this message type, topic or pattern to the sender.

    The protocol reports this as -32602 ("unauthorized type for sender role"); the subclass
    lets the server log it as a refusal rather than a malformed request.
    """

    default_message = "Not allowed for the sender's role"
    http_status = 403


class InternalError(BusError):
    """Something failed inside the bus. The text is fixed; the details are in the log."""

    code = -32603
    default_message = "Internal error"
    http_status = 500


class NotInitialized(BusError):
    """A request arrived before ``initialize``."""

    code = -32001
    default_message = "Not initialized: call initialize first"
    http_status = 409


class AuthenticationFailed(BusError):
    """The clientId is unknown or the token does not match it."""

    code = -32002
    default_message = "Authentication failed: unknown clientId or wrong token"
    http_status = 401


class SubscriptionNotFound(BusError):
    """``unsubscribe`` named a pattern this connection is not subscribed to."""

    code = -32003
    default_message = "Subscription not found"
    http_status = 404


class AlreadyInitialized(BusError):
    """``initialize`` was called twice on one connection."""

    code = -32004
    default_message = "Already initialized"
    http_status = 409


class LimitExceeded(BusError):
    """A configured limit (subscriptions, peers, bytes in flight) is reached; retry later."""

    code = -32005
    default_message = "Limit exceeded"
    http_status = 429


class AuditUnavailable(BusError):
    """The activity log could not commit this request's rows after retrying; nothing was sent."""

    code = -32006
    default_message = "Activity log unavailable: the request was not carried out"
    http_status = 503


class ShuttingDown(BusError):
    """The bus is closing and accepts no new work."""

    code = -32007
    default_message = "The bus is shutting down"
    http_status = 503


class DuplicateMessage(BusError):
    """The sender already sent a message with this ``messageId`` within the dedup window.

    The first one was accepted (and delivered); a publisher that retries after a lost answer
    can take this error as "already done".
    """

    code = -32008
    default_message = "Duplicate messageId: a message with this id was already accepted"
    http_status = 409


class EpochNotKept(BusError):
    """``fetchMessages`` asked for messages after an epoch the activity log does not cover.

    Either ``sinceEpoch`` is older than the oldest message kept (the log was started, replaced
    or migrated after it), so messages after it may be lost, or it is later than the latest
    epoch (it came from another log). ``data`` holds ``oldestEpoch`` (null for an empty log)
    and ``latestEpoch``: fetch again from ``oldestEpoch - 1`` (or 0) to read what is kept.
    """

    code = -32009
    default_message = "sinceEpoch is outside the epochs this bus's log keeps"
    http_status = 410  # the messages after that epoch are gone from the log (or never were in it)


class ContentNotKept(BusError):
    """``fetchMessages`` reached messages the log kept only as digests (``--log-content
    digest``): there is no content to give back. ``data.epoch`` is the first such message."""

    code = -32010
    default_message = "This bus keeps only digests of messages, not their content: nothing to fetch"
    http_status = 410  # their content was never kept (log_content: digest)


class ClusterUnavailable(BusError):
    """This bus is one node of a cluster and has lost its link to the others (NATS): it cannot
    deliver to their subscribers, so it accepts no message rather than deliver it to part of
    the bus. Nothing was delivered: retry later, or on another node."""

    code = -32011
    default_message = (
        "Cluster unavailable: this bus node is cut off from the other nodes; nothing was "
        "delivered, retry later or on another node"
    )
    http_status = 503  # the same request may succeed later or on another node


class RemoteError(BusError):
    """An error response with a code this library does not know.

    Args:
        code: the code as received.
        message: the message as received.
    """

    def __init__(self, code: int, message: str, *, data: Any = None) -> None:
        self.remote_code = code
        super().__init__(message, data=data)

    def to_error(self) -> dict[str, Any]:
        error = super().to_error()
        error["code"] = self.remote_code
        return error

    def __str__(self) -> str:
        return f"{self.message} ({self.remote_code})"


_BY_CODE: dict[int, type[BusError]] = {
    cls.code: cls
    for cls in (
        ParseError,
        InvalidRequest,
        MethodNotFound,
        InvalidParams,
        InternalError,
        NotInitialized,
        AuthenticationFailed,
        SubscriptionNotFound,
        AlreadyInitialized,
        LimitExceeded,
        AuditUnavailable,
        ShuttingDown,
        DuplicateMessage,
        EpochNotKept,
        ContentNotKept,
        ClusterUnavailable,
    )
}

# WebSocket close codes (RFC 6455 §7.4.2: 4000-4999 are for applications).
CLOSE_GOING_AWAY = 1001
CLOSE_UNSUPPORTED_DATA = 1003
CLOSE_POLICY_VIOLATION = 1008
CLOSE_TRY_AGAIN_LATER = 1013
CLOSE_REPLACED = 4001
CLOSE_INITIALIZE_TIMEOUT = 4002
CLOSE_AUTH_FAILED = 4003
CLOSE_SLOW_CONSUMER = 4004
CLOSE_REVOKED = 4005
CLOSE_EVICTED = 4006
CLOSE_FRAME_TIMEOUT = 4007

CLOSE_CODES: dict[int, str] = {
    1001: "the bus is shutting down",
    CLOSE_UNSUPPORTED_DATA: "a binary frame: the bus speaks JSON in text frames only",
    CLOSE_POLICY_VIOLATION: "too many errors before a successful initialize",
    1009: "frame larger than the configured max_frame_bytes",
    CLOSE_TRY_AGAIN_LATER: "the bus already has max_connections authenticated peers",
    CLOSE_REPLACED: "replaced: another connection authenticated as the same clientId",
    CLOSE_INITIALIZE_TIMEOUT: "no successful initialize within initialize_timeout",
    CLOSE_AUTH_FAILED: "authentication failed",
    CLOSE_SLOW_CONSUMER: "slow consumer: the bus could not write to the peer for "
    "slow_consumer_timeout seconds",
    CLOSE_REVOKED: "revoked: a reload removed or rotated this clientId's token, or the policy "
    "no longer admits its roles; reconnect with a valid token",
    CLOSE_EVICTED: "evicted: the oldest of max_anonymous_per_address sockets from one address "
    "that had not initialized, closed to let a newer one in",
    CLOSE_FRAME_TIMEOUT: "frame read timeout: a frame of 64 KiB or more was not read whole "
    "within frame_read_timeout seconds",
}
