"""Everything that connects to the bus as a client: the SDK, the BCP gateway, the approver.

The SDK's public names are re-exported here::

    from peers import Peer, Message, Reply          # the bus
    from peers import Controller, Reader, QueryFailed  # BCP on top of it
    from peers import PeerError, PeerClosed, ConnectFailed  # what goes wrong (peers.errors)

Everything the SDK raises is a :class:`PeerError`; the bus's JSON-RPC error answers are
:class:`RequestRefused`, one subclass per code (:class:`AuthenticationFailed`,
:class:`Forbidden`, ...), each also the :class:`bus.core.errors.BusError` it was.
"""

from .approver import Approver
from .bcp import Controller, Reader
from .client import FetchPage, Handler, Message, Peer, Reply, backoff
from .errors import (
    AlreadyInitialized,
    AuditUnavailable,
    AuthenticationFailed,
    ConnectFailed,
    ContentNotKept,
    DuplicateMessage,
    EpochNotKept,
    Forbidden,
    InternalError,
    InvalidParams,
    InvalidRequest,
    InvalidURL,
    LimitExceeded,
    MalformedMessage,
    MethodNotFound,
    NotInitialized,
    ParseError,
    PeerClosed,
    PeerError,
    PeerTimeout,
    QueryFailed,
    RemoteError,
    RequestRefused,
    ShuttingDown,
    SubscriptionNotFound,
)

__all__ = [
    "AlreadyInitialized",
    "Approver",
    "AuditUnavailable",
    "AuthenticationFailed",
    "ConnectFailed",
    "ContentNotKept",
    "Controller",
    "DuplicateMessage",
    "EpochNotKept",
    "FetchPage",
    "Forbidden",
    "Handler",
    "InternalError",
    "InvalidParams",
    "InvalidRequest",
    "InvalidURL",
    "LimitExceeded",
    "MalformedMessage",
    "Message",
    "MethodNotFound",
    "NotInitialized",
    "ParseError",
    "Peer",
    "PeerClosed",
    "PeerError",
    "PeerTimeout",
    "QueryFailed",
    "Reader",
    "RemoteError",
    "Reply",
    "RequestRefused",
    "ShuttingDown",
    "SubscriptionNotFound",
    "backoff",
]
