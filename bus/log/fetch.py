"""What a peer may read back from the log: the decisions behind ``fetchMessages``. Pure.

A peer may fetch, from the messages the bus accepted, those it could receive now if it
subscribed to the pattern it asks for:

- the policy lets it subscribe to that pattern (else the whole fetch is refused, -32602);
- the topic matches the pattern, and is not a ``bcp:`` topic unless the peer is the
  declassifier (the policy already forbids such patterns; this is checked per message too);
- the taint rule allows the flow from the sender, as the sender's taint was when the bus
  accepted the message (kept in ``send_start``'s ``status``), to the peer as it is now (and a
  reader's raw text, :data:`bus.core.policy.RAW_TEXT_TYPES`, reaches only peers tainted ``high``);
- it did not send the message itself (the bus never pushes a peer its own messages);
- a message from ``system:bus`` reads as its model (:data:`schemas.bus.BUS_MESSAGE_MODELS`):
  one logged before a model dropped a free-text field (``delivery_status``' ``error``, which
  could hold a webhook's words) is withheld, never replayed to a less tainted peer.

:class:`Page` applies these to rows in epoch order until the page is full::

    page = Page(grants, pattern, since=0, limit=100)
    for row in rows:
        if page.add(row):
            break                      # full
    result = page.result(more=True)
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from pydantic import ValidationError

from schemas.bus import BUS_MESSAGE_MODELS
from schemas.common import TAINT_LEVELS, TaintLevel

from ..core.errors import ContentNotKept, EpochNotKept
from ..core.policy import Grants, flows
from ..core.presence import BUS_CLIENT_ID
from ..core.topics import matches
from .history import StoredMessage

__all__ = [
    "FetchFilter",
    "FetchResult",
    "Fetched",
    "Page",
    "check_since",
    "log_time",
    "sender_mark",
]

_DECLASSIFIER = "declassifier"
_MARKS: dict[str, TaintLevel] = {f"taint:{level}": level for level in TAINT_LEVELS}


def sender_mark(grants: Grants | None) -> str:
    """What ``send_start`` keeps of its sender for the taint rule (None: the bus itself)."""
    if grants is None:
        return "taint:none"
    return _DECLASSIFIER if grants.declassifier else f"taint:{grants.taint}"


def _may_flow(mark: str | None, reader: Grants, message_type: Any) -> bool:
    """The taint rule from a sender known by its mark; an unknown mark is refused."""
    kind = message_type if isinstance(message_type, str) else None
    if mark == _DECLASSIFIER:
        return flows("none", True, reader, kind)
    level = _MARKS.get(mark or "")
    return level is not None and flows(level, False, reader, kind)


def log_time(moment: datetime) -> str:
    """``moment`` in the activity log's form (UTC, microseconds, ``Z``), which sorts as text:
    the form :class:`FetchFilter`'s ``after`` and ``before`` take."""
    return moment.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def check_since(since: int, oldest: int | None, latest: int) -> None:
    """Refuse a ``sinceEpoch`` the log cannot answer for.

    0 always means "from the oldest kept". Otherwise ``since`` must be within what the log
    holds: not before the oldest message kept minus one (messages between would be lost), not
    after the latest epoch given (it came from another log).

    Raises:
        EpochNotKept: with ``oldestEpoch`` and ``latestEpoch`` in ``data``.
    """
    if since == 0:
        return
    if since > latest:
        problem = f"sinceEpoch {since} is later than this bus's latest epoch {latest}"
    elif oldest is not None and since < oldest - 1:
        problem = (
            f"sinceEpoch {since} is older than the oldest message this bus keeps (epoch "
            f"{oldest}): messages after it may be lost"
        )
    else:
        return
    raise EpochNotKept(
        f"{problem}; fetch from {0 if oldest is None else oldest - 1} to read what is kept",
        data={"oldestEpoch": oldest, "latestEpoch": latest},
    )


@dataclass(frozen=True, slots=True)
class Fetched:
    """One message a peer may read: as it was pushed, with when the bus accepted it."""

    epoch: int
    topic: str
    payload: dict[str, Any]
    """The envelope exactly as it was sent (validated then; :class:`schemas.bus.Envelope`)."""
    ts: str
    """When the bus accepted it, in the activity log's form."""


@dataclass(frozen=True, slots=True)
class FetchResult:
    """A page of messages, oldest first (:class:`schemas.bus.FetchMessagesResult` on the wire).

    Pass :attr:`next_epoch` as the next ``since``; while :attr:`more` is true there may be more.
    """

    messages: list[Fetched]
    next_epoch: int
    more: bool

    def to_wire(self) -> dict[str, Any]:
        """The ``fetchMessages`` result: ``{messages: [{epoch, topic, payload}], nextEpoch,
        more}``, built directly (a thousand envelopes through pydantic cost 15 ms)."""
        return {
            "messages": [
                {"epoch": m.epoch, "topic": m.topic, "payload": m.payload} for m in self.messages
            ],
            "nextEpoch": self.next_epoch,
            "more": self.more,
        }


@dataclass(frozen=True, slots=True)
class FetchFilter:
    """Narrower reads, for callers that filter on more than the topic (the HTTP binding).

    Each field that is not None must match: the envelope's ``type``, ``correlationId`` and
    ``from``, and the time the bus accepted the message, ``after <= ts < before`` in the
    activity log's form (``2026-05-09T07:35:25.123456Z``, which sorts as text).
    """

    type: str | None = None
    correlation_id: str | None = None
    sender: str | None = None
    after: str | None = None
    before: str | None = None

    def admits(self, row: StoredMessage, envelope: dict[str, Any]) -> bool:
        """Whether ``row``, with its decoded ``envelope``, passes every field set."""
        return (
            (self.sender is None or row.sender == self.sender)
            and (self.after is None or row.ts >= self.after)
            and (self.before is None or row.ts < self.before)
            and (self.type is None or envelope.get("type") == self.type)
            and (
                self.correlation_id is None or envelope.get("correlationId") == self.correlation_id
            )
        )


class Page:
    """One ``fetchMessages`` answer being filled, from rows in epoch order.

    Args:
        reader: the grants of the peer that fetches, as they are now.
        pattern: the topic pattern it asked for (already allowed by the policy).
        since: its ``sinceEpoch``.
        limit: the most messages to return.
        only: further conditions, or None.
    """

    def __init__(
        self,
        reader: Grants,
        pattern: str,
        *,
        since: int,
        limit: int,
        only: FetchFilter | None = None,
    ) -> None:
        self.reader = reader
        self.pattern = pattern
        self.limit = limit
        self.only = only
        self.messages: list[Fetched] = []
        self.cursor = since
        """The epoch of the last row looked at: where the next page starts."""
        self.withheld = 0
        """Messages on matching topics the taint rule kept from this peer."""

    @property
    def full(self) -> bool:
        return len(self.messages) >= self.limit

    def add(self, row: StoredMessage) -> bool:
        """Look at ``row`` (the next in epoch order); return whether the page is now full.

        Raises:
            ContentNotKept: the row this peer may read kept only a digest of its envelope.
        """
        self.cursor = row.epoch
        envelope = self._readable(row)
        if envelope is not None:
            self.messages.append(Fetched(row.epoch, row.topic, envelope, row.ts))
        return self.full

    def _readable(self, row: StoredMessage) -> dict[str, Any] | None:
        reader = self.reader
        if row.sender == reader.client_id or not matches(self.pattern, row.topic):
            return None
        if row.topic.startswith("bcp:") and not reader.declassifier:
            return None
        envelope = _envelope(row)
        if not _may_flow(row.mark, reader, envelope.get("type")):
            self.withheld += 1
            return None
        if envelope.get("from") == BUS_CLIENT_ID and not _as_modelled(envelope):
            self.withheld += 1
            return None
        if self.only is not None and not self.only.admits(row, envelope):
            return None
        return envelope

    def result(self, *, more: bool, upto: int) -> FetchResult:
        """The answer: the messages, ``nextEpoch`` and ``more``.

        Args:
            more: whether rows after :attr:`cursor` were left unread.
            upto: the latest epoch the read covered; when nothing is left, ``nextEpoch`` is
                that, so a poller skips what it may not read only once.
        """
        next_epoch = self.cursor if more else max(self.cursor, upto)
        return FetchResult(self.messages, next_epoch, more)


def _as_modelled(envelope: dict[str, Any]) -> bool:
    """Whether a message from the bus reads as its type's model, and nothing more."""
    message_type = envelope.get("type")
    model = BUS_MESSAGE_MODELS.get(message_type) if isinstance(message_type, str) else None
    if model is None:
        return False
    try:
        model.model_validate(envelope.get("content"))
    except ValidationError:
        return False
    return True


def _envelope(row: StoredMessage) -> dict[str, Any]:
    """The envelope ``row`` kept.

    Raises:
        ContentNotKept: it kept only the type and digest (``log_content: digest``).
    """
    try:
        envelope = json.loads(row.payload_json or "null")
    except ValueError:
        envelope = None
    if not isinstance(envelope, dict) or "content" not in envelope:
        raise ContentNotKept(
            f"the message at epoch {row.epoch} was logged as a digest only (log_content: "
            "digest), so its content cannot be fetched",
            data={"epoch": row.epoch},
        )
    return envelope
