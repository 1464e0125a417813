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
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

from pydantic import ValidationError

from ..core.errors import BusError
from ..core.logevents import LogEvent
from ..core.presence import BUS_CLIENT_ID, PRESENCE_TOPIC
from ..core.router import Route
from ..log.fetch import sender_mark
from .cluster_history import logged
from .cluster_node import Node, grants_of
from .cluster_wire import Answer, Forwarded, encode

if TYPE_CHECKING:
    from nats.aio.msg import Msg

__all__ = ["Inbound"]

logger = logging.getLogger("bus.transports.cluster")


class Inbound:
    """The receiving half of a node's cluster link.

    Args:
        bus: this node's bus.
        node: this node's name, in its answers.
        publish: sends an answer to a reply subject (the link's NATS connection).
    """

    def __init__(
        self, bus: Node, node: str, publish: Callable[[str, bytes], Awaitable[None]]
    ) -> None:
        self.bus = bus
        self.node = node
        self._publish = publish
        self._busy: set[str] = set()
        """The messageIds being delivered: one given again meanwhile is not delivered twice."""

    async def receive(self, msg: Msg) -> None:
        """Check ``msg`` (from the history stream) against this node's files, deliver it here,
        answer its sender node, and acknowledge it to JetStream once its rows are committed.

        Never raises: a refusal is a ``refused`` row, a malformed body a warning. A message
        this node could not finish (its log failed, it is closing) is not acknowledged:
        JetStream gives it again later.
        """
        try:
            forwarded = Forwarded.model_validate_json(msg.data)
        except ValidationError:
            logger.warning("a malformed message on %s was dropped", msg.subject)
            await _ack(msg)
            return
        if forwarded.node == self.node or forwarded.message_id in self._busy:
            await _ack(msg)  # its own (in its log already), or given again while in hand
            return
        self._busy.add(forwarded.message_id)
        try:
            if await self._seen(msg, forwarded):
                await _ack(msg)
                return
            delivered, targets = await self._deliver(forwarded)
        except BusError as exc:  # this node's log failed, or it is closing: nothing delivered
            logger.warning("a message from %s was not delivered here: %s", forwarded.node, exc)
            return
        finally:
            self._busy.discard(forwarded.message_id)
        if forwarded.reply:
            answer = Answer(node=self.node, delivered=delivered, targets=targets)
            with contextlib.suppress(Exception):
                await self._publish(forwarded.reply, encode(answer))
        await _ack(msg)

    async def _seen(self, msg: Msg, forwarded: Forwarded) -> bool:
        """Whether a message given again (this node was killed before acknowledging it) is in
        this node's log already."""
        try:
            again = msg.metadata.num_delivered > 1
        except Exception:  # no metadata: not from JetStream, never given twice
            again = False
        if not again:
            return False
        await self.bus.log.commit()
        return await logged(self.bus.log.path, forwarded.message_id)

    async def _deliver(self, forwarded: Forwarded) -> tuple[int, int]:
        """Deliver ``forwarded`` to this node's subscribers, or refuse it (a ``refused`` row)."""
        try:
            sender = self._route(forwarded)
        except _Refused as refusal:
            self._refused(forwarded, refusal.reason)
            await self.bus.log.commit()
            return 0, 0
        self.bus.log.record(
            LogEvent.CLUSTER_IN,
            message_id=forwarded.message_id,
            actor=forwarded.sender,
            topic=forwarded.topic,
            status=forwarded.node,
            payload={"node": forwarded.node, "epoch": forwarded.epoch},
        )
        return await self.bus.deliver_forwarded(
            forwarded.topic,
            forwarded.payload,
            forwarded.message_id,
            forwarded.type,
            sender=sender,
            epoch=forwarded.epoch,
            trace_id=forwarded.trace_id,
        )

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

    def _refused(self, forwarded: Forwarded, reason: str) -> None:
        self.bus.log.record(
            LogEvent.REFUSED,
            message_id=forwarded.message_id,
            actor=forwarded.sender,
            topic=forwarded.topic,
            status=reason,
            payload={"node": forwarded.node, "epoch": forwarded.epoch},
        )
        logger.warning("refused a message from node %s: %s", forwarded.node, reason)


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


async def _ack(msg: Msg) -> None:
    with contextlib.suppress(Exception):  # cut off: JetStream gives it again, and it is seen
        await msg.ack()
