"""The inbox of ``bcpbus mcp``: what arrived for the peer that no tool call was waiting for.

Pushes on a subscription, messages on subscribed topics, late verdicts: each becomes an
:class:`Entry` with a sequence number of its own, kept in arrival order up to a bound (the oldest
go first). The MCP resource ``bcpbus://inbox`` shows the entries; a host that takes
``notifications/resources/updated`` reads it again when told, one that does not polls
``fetch_messages``.

A ``bcp_response_delivery`` is shown as the marked data block of
:func:`peers.bcp.render_for_prompt`, not as raw values: the model reads a reader's text as data
inside a delimited block with its provenance, whichever way it gets to it. A message marked
``untrusted`` (a sealed text the gateway forwarded) is shown with ``untrusted`` and the notice
beside its content, as a delivery is. A message from
``system:bus`` (presence, ``delivery_status``) is shown as its model reads it, codes only;
one that does not read as its model is not shown at all: the bus's word is trusted, so nothing
else may pass for it.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any, Final

from pydantic import ValidationError

from peers.bcp import render_for_prompt
from peers.client import Message
from schemas.bcp import UNTRUSTED_NOTICE, BcpResponseDelivery
from schemas.bus import BUS_MESSAGE_MODELS
from schemas.common import BUS_CLIENT_ID, timestamp

__all__ = ["DEFAULT_INBOX_SIZE", "Entry", "Inbox", "present"]

DEFAULT_INBOX_SIZE: Final = 1000
"""Entries kept; beyond it the oldest is dropped (``fetch_messages`` still has them)."""


@dataclass(frozen=True, slots=True)
class Entry:
    """One message kept in the inbox."""

    seq: int
    """Its place in this inbox: 1, 2, 3... since the bridge started."""
    received_at: str
    topic: str
    payload: dict[str, Any]
    epoch: int | None = None
    """The bus's epoch of the message (None for what the bridge makes itself)."""
    skipped: int | None = None
    """On a debounced push: how many messages on its topic were not pushed before it."""

    def to_json(self) -> dict[str, Any]:
        """Return the entry as the inbox resource shows it."""
        shown: dict[str, Any] = {"seq": self.seq, "received_at": self.received_at}
        if self.epoch is not None:
            shown["epoch"] = self.epoch
        if self.skipped:
            shown["skipped"] = self.skipped
        return {**shown, **present(self.topic, self.payload)}


def present(topic: str, payload: dict[str, Any]) -> dict[str, Any]:
    """Return a message as a model should read it: a delivery as a marked data block.

    Args:
        topic: where the message was published.
        payload: its envelope (``type``, ``from``, ``content``...).
    """
    shown: dict[str, Any] = {
        "topic": topic,
        "type": payload.get("type"),
        "from": payload.get("from"),
        "message_id": payload.get("messageId"),
    }
    content = payload.get("content")
    if payload.get("from") == BUS_CLIENT_ID:
        return {**shown, **_from_bus(payload.get("type"), content)}
    if payload.get("type") != "bcp_response_delivery":
        if isinstance(content, dict) and content.get("untrusted") is True:
            # A sealed text the gateway forwarded (or any message that says it is untrusted):
            # marked where a delivery is, with this bridge's notice, not the sender's.
            return {**shown, "untrusted": True, "notice": UNTRUSTED_NOTICE, "content": content}
        return {**shown, "content": content}
    try:
        delivery = BcpResponseDelivery.model_validate(content)
    except ValidationError:
        return {**shown, "untrusted": True, "notice": "malformed delivery, not shown"}
    untrusted = delivery.untrusted or delivery.category >= 2
    shown.update(
        query_id=delivery.query_id,
        subscription_id=delivery.subscription_id,
        category=delivery.category,
        bandwidth_bits=delivery.bandwidth_bits,
        taint=delivery.taint,
        untrusted=untrusted,
    )
    if untrusted:
        shown["notice"] = UNTRUSTED_NOTICE
    shown["data"] = render_for_prompt(delivery)
    return shown


def _from_bus(message_type: Any, content: Any) -> dict[str, Any]:
    """The content of a message from the bus, as its model reads it, or withheld."""
    model = BUS_MESSAGE_MODELS.get(message_type) if isinstance(message_type, str) else None
    if model is None:
        return {"notice": "a message from the bus of a type it does not send, not shown"}
    try:
        value = model.model_validate(content)
    except ValidationError:
        return {"notice": f"a malformed {message_type}, not shown"}
    return {"content": value.model_dump(mode="json", by_alias=True, exclude_none=True)}


class Inbox:
    """Messages kept for the host, newest last, at most ``size`` of them.

    Args:
        size: how many entries to keep.
    """

    def __init__(self, size: int = DEFAULT_INBOX_SIZE) -> None:
        self._entries: deque[Entry] = deque(maxlen=size)
        self._seq = 0
        self._listeners: list[Callable[[], None]] = []

    def listen(self, listener: Callable[[], None]) -> None:
        """Call ``listener`` (no arguments, must not raise) after each new entry."""
        self._listeners.append(listener)

    def changed(self) -> None:
        """Tell the listeners that what the inbox resource shows changed."""
        for listener in self._listeners:
            listener()

    def add(self, message: Message) -> Entry:
        """Keep ``message``; return its entry."""
        self._seq += 1
        entry = Entry(
            self._seq, timestamp(), message.topic, message.payload, message.epoch, message.skipped
        )
        self._entries.append(entry)
        self.changed()
        return entry

    def since(self, seq: int = 0, limit: int | None = None) -> list[Entry]:
        """Return the entries after ``seq``, oldest first, at most ``limit``."""
        found = [entry for entry in self._entries if entry.seq > seq]
        return found if limit is None else found[:limit]

    def __iter__(self) -> Iterator[Entry]:
        return iter(list(self._entries))

    def __len__(self) -> int:
        return len(self._entries)

    @property
    def last_seq(self) -> int:
        """The sequence number of the newest entry ever added (0: none yet)."""
        return self._seq
