"""What goes into the gateway's core and what comes out of it: small frozen values.

The core (:mod:`peers.gateway.core`) takes an :data:`Event` and returns actions; the gateway's
shell (:class:`peers.gateway.gateway.Gateway`) ``match``es on each action and does the I/O, in
order: a :class:`Record` is written to the activity log, a :class:`Commit` waits for the log
to be durable, a :class:`Send` goes through the peer, :class:`Respond` is the reply to the
message that caused it, :class:`SetTimer` and :class:`CancelTimer` arm and disarm the loop's
timers (whose firing comes back as :class:`TimerFired`), :class:`Spawn` runs actions in the
background. The order is the fail-closed guarantee: a :class:`Send` that a :class:`Record`
allows comes after the :class:`Commit` that makes the row durable.

When the core needs to know whether a :class:`Send` reached anyone, it gives the send a
``token``; the shell then feeds back :class:`Sent` and carries out the actions that returns
*before* the ones still queued.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from pydantic import BaseModel

from bus.core.logevents import LogEvent

__all__ = [
    "Action",
    "CancelTimer",
    "Commit",
    "Event",
    "MessageReceived",
    "PeerJoined",
    "PeerLeft",
    "Record",
    "Respond",
    "Send",
    "Sent",
    "SetTimer",
    "Spawn",
    "TimerFired",
    "TimerKey",
]

TimerKey = tuple[str, ...]
"""What a timer is for: ``("query", controller, query_id)``, ``("approval", approval_id)``,
``("held", controller, hold_id)``, ``("release", controller, delivery_id)`` or
``("screen", screen_id)``."""


# Events


@dataclass(frozen=True)
class MessageReceived:
    """A message the bus delivered to the gateway."""

    message_id: str
    sender: str
    topic: str
    type: str
    content: dict[str, Any]


@dataclass(frozen=True)
class TimerFired:
    """A timer set by :class:`SetTimer` ran out."""

    key: TimerKey


@dataclass(frozen=True)
class Sent:
    """The outcome of a :class:`Send` that carried a ``token``: how many peers got it."""

    token: int
    delivered_to: int


@dataclass(frozen=True)
class PeerJoined:
    """The bus announced a peer on ``system:presence`` (``sender`` must be ``system:bus``)."""

    client_id: str
    sender: str
    roles: tuple[str, ...] = ()
    """The roles the bus says it holds (``sealed_to``'s ``role:<name>`` entries read them)."""


@dataclass(frozen=True)
class PeerLeft:
    """The bus announced that a peer left."""

    client_id: str
    sender: str


Event = MessageReceived | TimerFired | Sent | PeerJoined | PeerLeft
"""Every event the core takes."""


# Actions


@dataclass(frozen=True)
class Record:
    """Write an activity-log row (``ActivityLog.record``); it is durable after the next
    :class:`Commit`."""

    event: LogEvent
    actor: str
    topic: str
    status: str | None
    payload: dict[str, Any] = field(default_factory=dict)
    message_id: str | None = None


@dataclass(frozen=True)
class Commit:
    """Wait until every row recorded so far is durable; if that fails, do nothing after it."""


@dataclass(frozen=True)
class Send:
    """Publish ``content`` as ``type`` on ``topic``.

    ``content`` is a ``schemas`` model, or the content of one already dumped (a held delivery).
    With a ``token``, feed :class:`Sent` back to the core once the bus has answered.
    """

    topic: str
    type: str
    content: BaseModel | Mapping[str, Any]
    correlation_id: str | None = None
    token: int | None = None


@dataclass(frozen=True)
class Respond:
    """Reply to the message being handled (its ``processMessage`` result); the last one wins."""

    ok: bool
    status: str = "ok"
    detail: str = ""


@dataclass(frozen=True)
class SetTimer:
    """Feed :class:`TimerFired` with ``key`` back in ``delay`` seconds (replacing its timer)."""

    key: TimerKey
    delay: float


@dataclass(frozen=True)
class CancelTimer:
    """Disarm the timer for ``key``, if any."""

    key: TimerKey


@dataclass(frozen=True)
class Spawn:
    """Carry out ``actions`` in the background: the reply does not wait for them."""

    actions: tuple[Action, ...]


Action = Record | Commit | Send | Respond | SetTimer | CancelTimer | Spawn
"""Every action the core returns."""
