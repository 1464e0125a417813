"""A peer's handlers: which coroutine each delivered message type goes to, and what the bus is
answered.

A handler returns None (processed), a bool, or a :class:`~peers.messages.Reply`; an exception
it raises is answered ``processed: false`` with its text, cut short, and logged.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from bus.core.protocol import Request

from .messages import Handler, Message, Reply

__all__ = ["Handlers", "delivery"]

logger = logging.getLogger("peers.client")


class Handlers:
    """The handlers of one peer, by message type; None is the fallback."""

    def __init__(self, client_id: str) -> None:
        self.client_id = client_id
        self._by_type: dict[str | None, Handler] = {}

    def on(self, message_type: str | None = None) -> Callable[[Handler], Handler]:
        """Register the decorated coroutine for deliveries of ``message_type``.

        ``None`` registers the fallback for types without a handler of their own. Deliveries of
        a type with no handler and no fallback are answered ``processed: false``.
        """

        def register(handler: Handler) -> Handler:
            self._by_type[message_type] = handler
            return handler

        return register

    def handle(self, message_type: str | None, handler: Handler) -> None:
        """Register ``handler`` for ``message_type``, like :meth:`on` without the decorator."""
        self._by_type[message_type] = handler

    async def hand(self, message: Message) -> Reply:
        """Call the handler of ``message``'s type and turn its outcome into a reply."""
        handler = self._by_type.get(message.type) or self._by_type.get(None)
        if handler is None:
            return Reply(False, "no_handler", f"no handler for {message.type}")
        try:
            outcome = await handler(message)
        except Exception as exc:
            logger.exception("%s: handler for %s failed", self.client_id, message.type)
            return Reply(False, "error", str(exc)[:200])
        if isinstance(outcome, Reply):
            return outcome
        return Reply(outcome is not False)


def delivery(request: Request) -> Message | Reply:
    """The message a ``processMessage`` request delivers, or the reply that refuses it."""
    if request.method != "processMessage" or not isinstance(request.params, dict):
        return Reply(False, "unsupported", f"this peer does not handle {request.method}")
    # The bus validated the envelope; check only what this code relies on.
    payload = request.params.get("payload")
    if not isinstance(payload, dict) or not isinstance(payload.get("type"), str):
        return Reply(False, "invalid", "malformed processMessage params")
    return Message(
        str(request.params.get("topic")),
        payload,
        _optional_int(request.params.get("epoch")),
        _optional_int(request.params.get("skipped")),
    )


def _optional_int(value: Any) -> int | None:
    return value if type(value) is int else None
