"""Messages other nodes accepted, as this node receives them from NATS.

A node never delivers what it would have refused itself: :class:`Inbound` checks each message
again against this node's credentials, policy and agent definitions (the sender's credential,
``may_send``, its taint mark) before :meth:`Node.deliver_forwarded`, and writes a ``refused``
row naming the sending node when they disagree.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any

from ..core.errors import BusError
from ..core.logevents import LogEvent
from ..core.presence import BUS_CLIENT_ID, PRESENCE_TOPIC
from ..core.router import Route
from ..log.fetch import sender_mark
from .cluster_node import Node, grants_of
from .cluster_wire import Answer, Forwarded, encode

__all__ = ["Inbound"]

logger = logging.getLogger("bus.transports.cluster")


class Inbound:
    """The receiving half of a node's cluster link.

    Args:
        bus: this node's bus.
        node: this node's name, in its answers.
        publish: sends an answer to a reply subject (the link's NATS connection).
        spawn: runs a delivery in a task of the link's.
    """

    def __init__(
        self,
        bus: Node,
        node: str,
        publish: Callable[[str, bytes], Awaitable[None]],
        spawn: Callable[[Coroutine[Any, Any, None]], object],
    ) -> None:
        self.bus = bus
        self.node = node
        self._publish = publish
        self._spawn = spawn

    def take(self, forwarded: Forwarded, seq: int, epoch: int) -> None:
        """Accept ``forwarded`` (the stream's message ``seq``) here at ``epoch``, now, after
        checking it against this node's files; deliver it and answer its sender node in a
        task. Call it in the stream's order: nothing here waits.

        Never raises: a refusal is a ``refused`` row, a log that failed a warning (what it
        missed is not recorded here; the stream keeps it).
        """
        try:
            sender = self._route(forwarded)
        except _Refused as refusal:
            self._refused(forwarded, seq, refusal.reason)
            return
        try:
            self.bus.log.record(
                LogEvent.CLUSTER_IN,
                message_id=forwarded.message_id,
                actor=forwarded.sender,
                topic=forwarded.topic,
                status=forwarded.node,
                payload={"node": forwarded.node, "seq": seq},
            )
            delivering = self.bus.deliver_forwarded(
                forwarded.topic,
                forwarded.payload,
                forwarded.message_id,
                forwarded.type,
                sender=sender,
                epoch=epoch,
                trace_id=forwarded.trace_id,
            )
        except BusError as exc:  # this node's log is closed: nothing delivered
            logger.warning("a message from %s was not accepted here: %s", forwarded.node, exc)
            return
        self._spawn(self._finish(forwarded, delivering))

    async def _finish(self, forwarded: Forwarded, delivering: Awaitable[tuple[int, int]]) -> None:
        """Deliver, then answer the sending node with how many processed it."""
        try:
            delivered, targets = await delivering
        except BusError as exc:  # this node's log failed, or it is closing
            logger.warning("a message from %s was not delivered here: %s", forwarded.node, exc)
            delivered, targets = 0, 0
        if forwarded.reply:
            answer = Answer(node=self.node, delivered=delivered, targets=targets)
            with contextlib.suppress(Exception):
                await self._publish(forwarded.reply, encode(answer))

    def _route(self, forwarded: Forwarded) -> Route[Any] | None:
        """The route ``forwarded``'s sender acts through here (None for the bus itself).

        Raises:
            _Refused: this node's own policy, credentials or agent definitions refuse it.
        """
        sender, topic = forwarded.sender, forwarded.topic
        if sender == BUS_CLIENT_ID:
            if topic != PRESENCE_TOPIC:
                raise _Refused("cluster_bus_topic")
            return None
        grants = grants_of(self.bus, sender)
        if grants is None:
            raise _Refused("cluster_unknown_sender")
        if not grants.may_send(forwarded.type, topic):
            raise _Refused("type_denied")
        if sender_mark(grants) != forwarded.mark:
            # The nodes disagree on the sender's taint: their agent definitions differ.
            raise _Refused("cluster_taint_differs")
        return Route(_Remote(sender, forwarded.node), sender, grants)

    def _refused(self, forwarded: Forwarded, seq: int, reason: str) -> None:
        with contextlib.suppress(BusError):
            self._refused_row(forwarded, seq, reason)
        logger.warning("refused a message from node %s: %s", forwarded.node, reason)
        if forwarded.reply:  # the sending node need not wait for this one
            answer = encode(Answer(node=self.node, delivered=0, targets=0))
            self._spawn(self._answer(forwarded.reply, answer))

    async def _answer(self, reply: str, answer: bytes) -> None:
        with contextlib.suppress(Exception):
            await self._publish(reply, answer)

    def _refused_row(self, forwarded: Forwarded, seq: int, reason: str) -> None:
        self.bus.log.record(
            LogEvent.REFUSED,
            message_id=forwarded.message_id,
            actor=forwarded.sender,
            topic=forwarded.topic,
            status=reason,
            payload={"node": forwarded.node, "seq": seq},
        )


class _Refused(Exception):
    """This node's own files refuse a forwarded message; ``reason`` is the row's status."""

    def __init__(self, reason: str) -> None:
        self.reason = reason


class _Remote:
    """The link of a sender connected to another node: the bus never delivers to it."""

    inflight: asyncio.Semaphore | None = None

    def __init__(self, client_id: str, node: str) -> None:
        self.name = f"{client_id}@{node}"

    def write_buffer_size(self) -> int:
        return 0

    async def call(self, method: str, params: Any) -> Any:
        raise BusError(f"{self.name} is on another node")

    def spawn(self, coro: Any) -> asyncio.Task[None]:
        return asyncio.get_running_loop().create_task(coro)

    async def close(self, code: int, reason: str) -> None:
        return None
