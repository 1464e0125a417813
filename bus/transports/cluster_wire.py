"""What cluster nodes say to each other on NATS: the subjects and the JSON bodies.

See :mod:`bus.transports.cluster` for what each is for. Every body is a frozen pydantic model
dumped with its aliases; a body that does not validate is dropped by the receiving node.
"""

from __future__ import annotations

import base64
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from schemas.bus import PeerInfo

__all__ = [
    "EPOCHS_BUCKET",
    "HEARTBEAT",
    "HELLO_SUBJECT",
    "HISTORY_AGE",
    "HISTORY_STREAM",
    "NODE_TTL",
    "PEERS_SUBJECT",
    "PRESENCE_BUCKET",
    "RELOAD_SUBJECT",
    "SUBJECT_PREFIX",
    "Answer",
    "Forwarded",
    "Hello",
    "PeerList",
    "Reload",
    "Wire",
    "encode",
    "presence_key",
    "subject_for",
]

SUBJECT_PREFIX = "bcpbus.msg"
HELLO_SUBJECT = "bcpbus.node.hello"
PEERS_SUBJECT = "bcpbus.node.peers"
RELOAD_SUBJECT = "bcpbus.node.reload"
PRESENCE_BUCKET = "bcpbus-presence"
EPOCHS_BUCKET = "bcpbus-epochs"
"""The key-value bucket where the nodes agree on each stream's base epoch."""
HISTORY_STREAM = "BCPBUS_HISTORY"
"""The JetStream stream of every ``bcpbus.msg.>`` message: one order for the cluster, kept on
disk, which every node accepts messages in (its sequence gives the epochs), and from which a
node that was away (stopped, killed, cut off) gets what it missed."""
HISTORY_AGE = 7 * 24 * 3600.0
"""Seconds the stream keeps a message: how long a node may be away and still catch up."""
HEARTBEAT = 1.0
"""Seconds between two hellos of a node."""
NODE_TTL = 3.5 * HEARTBEAT
"""A node not heard from for this long is gone: senders stop waiting for its answers."""


class Wire(BaseModel):
    """A body on NATS: frozen, with its wire names, no unknown key."""

    model_config = ConfigDict(frozen=True, populate_by_name=True, extra="forbid")


class Forwarded(Wire):
    """A message one node accepted, as the other nodes receive it."""

    node: str
    topic: str
    payload: dict[str, Any]
    message_id: str = Field(alias="messageId")
    type: str
    trace_id: str | None = Field(default=None, alias="traceId")
    sender: str
    """The sender's clientId; ``system:bus`` for the bus's own messages (presence)."""
    mark: str
    """The sender's taint as the accepting node saw it (``send_start``'s status)."""
    reply: str = ""
    """Where the sending node gathers the :class:`Answer` of each node (a JetStream delivery's
    own reply subject is its ack); its last token tells the sending node, reading its own
    message back from the stream, which of its sends it is. Empty: nobody waits."""


class Answer(Wire):
    """One node's outcome of a :class:`Forwarded`: how many of its subscribers processed it."""

    node: str
    delivered: int
    targets: int


class PeerList(Wire):
    """One node's answer to a cluster-wide ``listPeers``."""

    node: str
    peers: list[PeerInfo]


class Reload(Wire):
    """A node asking the others to read their peers file, policy and agents again (SIGHUP)."""

    node: str


class Hello(Wire):
    """A node saying it is alive (or, with ``bye``, that it is leaving)."""

    node: str
    bye: bool = False


def subject_for(topic: str) -> str:
    """The NATS subject of a bus topic: ``bcp:main:r`` -> ``bcpbus.msg.bcp.main.r``."""
    return ".".join([SUBJECT_PREFIX, *(s.replace(".", "%2E") for s in topic.split(":"))])


def presence_key(client_id: str) -> str:
    """The key-value key of a clientId (keys allow no ``:``): base64url, no padding."""
    return base64.urlsafe_b64encode(client_id.encode()).decode().rstrip("=")


def encode(model: Wire) -> bytes:
    """``model`` as the bytes a NATS message carries."""
    return model.model_dump_json(by_alias=True).encode()
