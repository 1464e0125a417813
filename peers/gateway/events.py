"""What goes into the gateway's core and what comes out of it: small frozen values.

The core (:mod:`peers.gateway.core`) takes an event and returns actions; the gateway's shell
(:class:`peers.gateway.gateway.Gateway`) ``match``es on each action and does the I/O, in
order: a :class:`Record` is written to the activity log, a :class:`Commit` waits for the log
to be durable, a :class:`Send` goes through the peer, :class:`Respond` is the reply to the
message that caused it. The order is the fail-closed guarantee: a :class:`Send` that a
:class:`Record` allows comes after the :class:`Commit` that makes the row durable.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from pydantic import BaseModel

__all__ = ["Action", "Commit", "MessageReceived", "Record", "Respond", "Send"]


@dataclass(frozen=True)
class MessageReceived:
    """A message the bus delivered to the gateway."""

    message_id: str
    sender: str
    topic: str
    type: str
    content: dict[str, Any]


@dataclass(frozen=True)
class Record:
    """Write an activity-log row (``ActivityLog.record``); it is durable after the next
    :class:`Commit`."""

    event: str
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
    """Publish ``content`` (a ``schemas`` model) as ``type`` on ``topic``."""

    topic: str
    type: str
    content: BaseModel


@dataclass(frozen=True)
class Respond:
    """Reply to the message being handled (its ``processMessage`` result)."""

    ok: bool
    status: str = "ok"
    detail: str = ""


Action = Record | Commit | Send | Respond
"""Every action the core returns."""
