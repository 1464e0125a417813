"""Everything that connects to the bus as a client: the SDK, the BCP gateway, the approver.

The SDK's public names are re-exported here::

    from peers import Peer, Message, Reply          # the bus
    from peers import Controller, Reader, QueryFailed  # BCP on top of it
    from peers import PeerError, PeerClosed, ConnectFailed  # what goes wrong (peers.errors)

Everything the SDK raises is a :class:`PeerError`, except the bus's JSON-RPC error answers,
which are :class:`bus.core.errors.BusError` subclasses.
"""

from .approver import Approver
from .bcp import Controller, Reader
from .client import FetchPage, Handler, Message, Peer, Reply, backoff
from .errors import (
    ConnectFailed,
    InvalidURL,
    MalformedMessage,
    PeerClosed,
    PeerError,
    PeerTimeout,
    QueryFailed,
)

__all__ = [
    "Approver",
    "ConnectFailed",
    "Controller",
    "FetchPage",
    "Handler",
    "InvalidURL",
    "MalformedMessage",
    "Message",
    "Peer",
    "PeerClosed",
    "PeerError",
    "PeerTimeout",
    "QueryFailed",
    "Reader",
    "Reply",
    "backoff",
]
