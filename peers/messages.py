"""What a peer receives and answers: a delivered :class:`Message`, a page of fetched ones, the
:class:`Reply` a handler may give, and the :data:`Handler` type.

Plain frozen values, shared by the SDK's connection (:mod:`peers.client`) and its catch-up
(:mod:`peers.catchup`); import them from :mod:`peers` or :mod:`peers.client`.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

__all__ = ["FetchPage", "Handler", "Message", "Reply"]


@dataclass(frozen=True, slots=True)
class Message:
    """One delivery from the bus, pushed or fetched."""

    topic: str
    payload: dict[str, Any]
    epoch: int | None = None
    """The message's place in the bus's order (None from a bus older than epochs)."""
    skipped: int | None = None
    """On a push that ends a ``debounceMs`` window: how many messages on this topic were not
    pushed in it (fetch them by epoch if you need them)."""

    @property
    def type(self) -> str:
        return str(self.payload["type"])

    @property
    def sender(self) -> str:
        """The payload's ``from``: the authenticated clientId of the peer that sent it."""
        return str(self.payload["from"])

    @property
    def message_id(self) -> str:
        return str(self.payload["messageId"])

    @property
    def content(self) -> dict[str, Any]:
        content: dict[str, Any] = self.payload["content"]
        return content


@dataclass(frozen=True, slots=True)
class FetchPage:
    """One ``fetchMessages`` answer: messages oldest first, where to go on, whether to."""

    messages: list[Message]
    next_epoch: int
    """Pass it as ``since_epoch`` to read on."""
    more: bool
    """Whether there may be more after :attr:`next_epoch`."""


@dataclass(frozen=True, slots=True)
class Reply:
    """What a handler answers ``processMessage`` with when a bool is not enough."""

    processed: bool = True
    status: str = "ok"
    message: str = ""

    def to_result(self) -> dict[str, Any]:
        return {"processed": self.processed, "status": self.status, "message": self.message}


Handler = Callable[[Message], Awaitable[Reply | bool | None]]
