"""Everything that connects to the bus as a client: the SDK, the BCP gateway, the approver.

The SDK's public names are re-exported here::

    from peers import Peer, Message, Reply          # the bus
    from peers import Controller, Reader, QueryFailed  # BCP on top of it
"""

from .approver import Approver
from .bcp import Controller, QueryFailed, Reader
from .client import Handler, Message, Peer, PeerClosed, Reply, backoff

__all__ = [
    "Approver",
    "Controller",
    "Handler",
    "Message",
    "Peer",
    "PeerClosed",
    "QueryFailed",
    "Reader",
    "Reply",
    "backoff",
]
