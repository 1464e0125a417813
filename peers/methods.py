"""The bus's methods as typed calls: what a :class:`~peers.client.Peer` can ask the bus.

:class:`BusMethods` turns each JSON-RPC method into a coroutine with Python arguments and a
``schemas`` model for its answer, over one ``request()`` that the connection provides. The
subscriptions made are kept so that the connection can restore them after a reconnect.
"""

from __future__ import annotations

import secrets
from datetime import UTC, datetime
from typing import Any

from schemas.bus import (
    FetchMessagesResult,
    ListSubscriptionsResult,
    PingResult,
    SendMessageResult,
    SubscriptionInfo,
)

from .messages import FetchPage, Message

__all__ = ["BusMethods"]


class BusMethods:
    """``subscribe``, ``unsubscribe``, ``listSubscriptions``, ``sendMessage``,
    ``fetchMessages`` and ``ping``, typed; a subclass provides :meth:`request`."""

    client_id: str
    _subscriptions: dict[str, dict[str, Any]]
    """pattern -> its subscribe params, restored after a reconnect"""

    async def request(self, method: str, params: Any = None, *, _ready: bool = False) -> Any:
        """Call a bus method and return its result (the connection implements it)."""
        raise NotImplementedError

    async def subscribe(
        self, pattern: str, *, debounce_ms: int = 0, min_relevance: float = 0.0
    ) -> None:
        """Subscribe to a topic pattern; it is restored, with its options, after a reconnect.

        Args:
            debounce_ms: after a push on a topic, hold further messages on it for this long,
                then push the latest (:attr:`Message.skipped` says how many were not).
            min_relevance: do not push messages whose ``relevance`` is below this.
        """
        params: dict[str, Any] = {"topic": pattern}
        if debounce_ms:
            params["debounceMs"] = debounce_ms
        if min_relevance:
            params["minRelevance"] = min_relevance
        await self.request("subscribe", params)
        self._subscriptions[pattern] = params

    async def unsubscribe(self, pattern: str) -> None:
        """Drop a pattern. Raises :class:`~peers.errors.SubscriptionNotFound` if not
        subscribed."""
        await self.request("unsubscribe", {"topic": pattern})
        self._subscriptions.pop(pattern, None)

    async def list_subscriptions(self) -> list[SubscriptionInfo]:
        """This connection's subscriptions, sorted by pattern, with their options (0: off);
        its own clientId is among them if the bus subscribed it there."""
        result = ListSubscriptionsResult.model_validate(await self.request("listSubscriptions"))
        return result.subscriptions

    async def send(
        self,
        topic: str,
        message_type: str,
        content: dict[str, Any],
        *,
        correlation_id: str | None = None,
        message_id: str | None = None,
    ) -> SendMessageResult:
        """Publish a message; return the bus's answer: ``delivered_to`` counts the peers that
        processed it, ``epoch`` is its place in the bus's order.

        The envelope (``messageId``, ``from``, ``timestamp``) is filled in for you.
        """
        payload: dict[str, Any] = {
            # 128 random bits as 32 hex digits, like uuid4().hex at a quarter of its cost.
            "messageId": message_id or secrets.token_hex(16),
            "type": message_type,
            "from": self.client_id,
            "timestamp": datetime.now(UTC).isoformat(),
            "content": content,
        }
        if correlation_id is not None:
            payload["correlationId"] = correlation_id
        result = await self.request("sendMessage", {"topic": topic, "payload": payload})
        return SendMessageResult.model_validate(result)

    async def fetch(self, pattern: str, since_epoch: int = 0, limit: int = 100) -> FetchPage:
        """Read back the messages after ``since_epoch`` on topics matching ``pattern`` that this
        peer may receive, oldest first (``fetchMessages``).

        Raises:
            EpochNotKept: the bus's log does not cover ``since_epoch``; its ``data`` says what
                it keeps.
            ContentNotKept: the bus keeps only digests of messages.
            Forbidden: the policy does not let this peer read ``pattern``.
        """
        params = {"topic": pattern, "sinceEpoch": since_epoch, "limit": limit}
        raw = await self.request("fetchMessages", params)
        # Checked against the model, but handed on as sent: a handler sees the same payload
        # whether the message was pushed or fetched.
        result = FetchMessagesResult.model_validate(raw)
        messages = [
            Message(item["topic"], item["payload"], item["epoch"]) for item in raw["messages"]
        ]
        return FetchPage(messages, result.next_epoch, result.more)

    async def ping(self) -> PingResult:
        """Ask the bus for a sign of life; ``server_time`` is the bus's clock."""
        return PingResult.model_validate(await self.request("ping"))
