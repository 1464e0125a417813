"""Presence events: ``peer_joined`` and ``peer_left`` on ``system:presence``, in order.

The bus announces a join or a departure the moment it happens (synchronously, from wherever it
learns it) and one task publishes them one at a time, so subscribers such as the gateway see
them in the order they happened. The content goes through its model
(``schemas/json/peer_*.json``), so what peers in other languages validate is what is sent.
"""

from __future__ import annotations

import asyncio
import logging
import uuid
from collections.abc import Awaitable, Callable
from typing import Any

from schemas.bus import PeerJoined, PeerLeft, PresenceType
from schemas.common import BUS_CLIENT_ID, timestamp

from .errors import BusError

__all__ = ["BUS_CLIENT_ID", "PRESENCE_TOPIC", "Presence", "Publish"]

logger = logging.getLogger("bus.server")

PRESENCE_TOPIC = "system:presence"

Publish = Callable[[str, dict[str, Any], str, str], Awaitable[int]]
"""``publish(topic, payload, message_id, message_type)``, as the bus sends its own messages."""


class Presence:
    """The queue of presence events and the loop that publishes them."""

    def __init__(self) -> None:
        self._queue: asyncio.Queue[tuple[PresenceType, dict[str, Any]]] = asyncio.Queue()

    def announce(self, event: PresenceType, content: PeerJoined | PeerLeft) -> None:
        """Queue ``event``; :meth:`run` publishes it after every earlier one."""
        self._queue.put_nowait((event, content.model_dump(mode="json", by_alias=True)))

    async def run(self, publish: Publish) -> None:
        """Publish queued events one at a time, forever; cancel the task to stop."""
        while True:
            event, content = await self._queue.get()
            payload: dict[str, Any] = {
                "messageId": f"presence-{uuid.uuid4().hex}",
                "type": event,
                "from": BUS_CLIENT_ID,
                "timestamp": timestamp(),
                "content": content,
            }
            try:
                await publish(PRESENCE_TOPIC, payload, payload["messageId"], event)
            except BusError:
                logger.exception("could not announce %s of %s", event, content["clientId"])
