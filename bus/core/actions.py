"""What the bus's decisions return: small frozen values the shell carries out, in order.

The vocabulary is the gateway core's (:mod:`peers.gateway.events`): a :class:`Record` is
buffered into the activity log, a :class:`Commit` waits for it to be durable, :class:`Announce`
publishes a presence event, :class:`Close` closes a link (at once or after the answer),
:class:`CountRefusal` counts an anonymous client's refusal, :class:`Reply` is
the request's result (a ``schemas`` model) and :class:`Fail` its error. A decision is a list of
actions that ends in a :class:`Reply` or a :class:`Fail`; the shell (:class:`bus.server.Bus`)
``match``es on each, does the I/O, and answers with the last one::

    for action in decision:
        match action:
            case Record(): log.record(action.event, **action.fields())
            case Reply(result=result): return result
            case Fail(error=error): raise error
"""

from __future__ import annotations

from collections.abc import Hashable
from dataclasses import dataclass
from typing import Any, Generic, NamedTuple, TypeVar

from pydantic import BaseModel

from schemas.bus import PeerJoined, PeerLeft, PresenceType

from .errors import BusError
from .logevents import LogEvent

__all__ = ["Action", "Announce", "Close", "Commit", "CountRefusal", "Fail", "Record", "Reply"]

K = TypeVar("K", bound=Hashable)


class Record(NamedTuple):
    """Buffer one activity-log row (``ActivityLog.record``); durable after the next
    :class:`Commit`.

    A named tuple rather than a frozen dataclass: one is made per target of every message, and
    a tuple is built four times faster.
    """

    event: LogEvent
    actor: str | None = None
    rpc_id: str | None = None
    message_id: str | None = None
    topic: str | None = None
    status: str | None = None
    payload: Any = None
    error: str | None = None
    epoch: int | None = None
    trace_id: str | None = None

    def fields(self) -> dict[str, Any]:
        """The keyword arguments of ``ActivityLog.record`` after ``event``."""
        return {
            "actor": self.actor,
            "rpc_id": self.rpc_id,
            "message_id": self.message_id,
            "topic": self.topic,
            "status": self.status,
            "payload": self.payload,
            "error": self.error,
            "epoch": self.epoch,
            "trace_id": self.trace_id,
        }


@dataclass(frozen=True, slots=True)
class Commit:
    """Wait until every row recorded so far is durable; if that fails, do nothing after it."""


@dataclass(frozen=True, slots=True)
class Announce:
    """Publish ``content`` (``peer_joined`` or ``peer_left``) on ``system:presence``."""

    kind: PresenceType
    content: PeerJoined | PeerLeft


@dataclass(frozen=True, slots=True)
class Close(Generic[K]):
    """Close ``link`` with ``code``: at once, or once the answer being built has gone out."""

    link: K
    code: int
    reason: str
    after_answer: bool = False
    force: bool = False
    """Drop the connection soon after the close frame, whether or not the peer answers it
    (a peer that reads nothing would hold the close handshake)."""


@dataclass(frozen=True, slots=True)
class CountRefusal:
    """Count a refusal of an anonymous client into the next ``ws_refused`` row: such a client
    gets no row of its own, or anyone could fill the log (:mod:`bus.ops.refusals`)."""

    reason: str
    address: str


@dataclass(frozen=True, slots=True)
class Reply:
    """Answer the request with ``result``, a ``schemas`` model."""

    result: BaseModel


@dataclass(frozen=True, slots=True)
class Fail:
    """Answer the request with ``error`` (its ``rpc_error`` row is the shell's to write)."""

    error: BusError


Action = Record | Commit | Announce | Close[Any] | CountRefusal | Reply | Fail
"""Every action a decision of the bus returns."""
