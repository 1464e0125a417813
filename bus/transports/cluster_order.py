"""The cluster's one order: every node accepts every message in the stream's order.

:class:`Order` stores this node's messages in the stream (:meth:`Order.store`) and reads the
stream back in order, its own messages included: each message is given the epoch of its stream
sequence (:meth:`bus.core.epochs.Epochs.at`) and accepted there and then, with no wait between
two messages, so the rows of every node's log follow the stream and a message has the same
epoch on every node. A node's own message is accepted by the send waiting for it (its ``stamp``,
which has the sender's link); another node's by :meth:`.cluster_inbound.Inbound.take`. When
JetStream's answer to the publish comes while this node has read every message before it, the
send accepts its message at once (it is next in the stream's order anyway) and the reading
skips it: a node sending alone does not wait for its own message to come back.

A message is stored with its sender and messageId as its ``Nats-Msg-Id``, and the stream
remembers those ids for the bus's ``dedup_window``: a resend of a message JetStream stored
already (its first send got -32011 as its answer was late or lost) is not stored again, and
this node answers it as a single bus answers a repeated messageId (-32008, "it was accepted")
once it has read the first one, so no node accepts it twice.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from collections.abc import Callable
from typing import TYPE_CHECKING

from pydantic import ValidationError

from ..core.errors import BusError, ClusterUnavailable, DuplicateMessage
from ..core.logevents import LogEvent
from .cluster_history import (
    PUBLISH_TIMEOUT,
    agree_base,
    open_stream,
    read_history,
    stream_lost,
)
from .cluster_node import Node, T
from .cluster_wire import Forwarded, encode, subject_for

if TYPE_CHECKING:
    from nats.aio.msg import Msg
    from nats.js.client import JetStreamContext

__all__ = ["Order", "StreamAhead"]

logger = logging.getLogger("bus.transports.cluster")


class StreamAhead(Exception):
    """A stream made again under a base at or below this node's last epoch: its epochs would
    go back. The node stops accepting (sends get -32011) rather than give them."""


class Order:
    """One node's place in the cluster's stream.

    Args:
        bus: this node's bus (its epochs follow the stream once :meth:`open` returns).
        node: this node's name: its own messages are told apart by it.
        take: accepts another node's message at ``(forwarded, seq, epoch)``; must not wait.
    """

    def __init__(self, bus: Node, node: str, take: Callable[[Forwarded, int, int], None]) -> None:
        self.bus = bus
        self.node = node
        self._take = take
        self._sub: JetStreamContext.PushSubscription | None = None
        self._created: object = None
        """The stream's creation time: another one means the stream was made again."""
        self._first = 1
        """The first sequence this node reads (a node new to the stream starts at its end)."""
        self._own: dict[str, Callable[[int], None]] = {}
        self.reading = False
        """Whether this node reads the stream: it may send only then."""
        self._progress: asyncio.Event | None = None
        """Set at the next message read, when a resend waits for its first send's."""

    async def open(self, js: JetStreamContext) -> None:
        """Agree on the stream's base, then read it from this node's place.

        Raises:
            nats.js.errors.Error: JetStream refused the stream, the bucket or the consumer.
        """
        stream = await open_stream(js, self.bus.limits.dedup_window)
        epochs = self.bus.epochs
        epochs.follow(await agree_base(js, stream, epochs.last))
        self._created = stream.created
        read = epochs.read()
        self._first = read + 1 if read else stream.state.last_seq + 1
        await self._read(js, self._first)

    async def heal(self, js: JetStreamContext) -> bool:
        """After a reconnect, read on from this node's place; if the stream was made again
        (the NATS server lost its store), agree on its new base and read it from the start.
        Return whether it was made again.

        Raises:
            StreamAhead: the new base is not above this node's epochs.
            nats.js.errors.Error: JetStream is not back yet (try again).
        """
        epochs = self.bus.epochs
        lost = await stream_lost(js, self._created)
        if lost:
            stream = await open_stream(js, self.bus.limits.dedup_window)
            base = await agree_base(js, stream, epochs.last)
            if base <= epochs.last:
                self.reading = False
                raise StreamAhead(f"the new stream's base {base} is not above {epochs.last}")
            epochs.follow(base)
            self._created, self._first = stream.created, 1
        await self._read(js, max(epochs.read() + 1, self._first))
        return lost

    async def _read(self, js: JetStreamContext, start: int) -> None:
        if self._sub is not None:
            with contextlib.suppress(Exception):
                await self._sub.unsubscribe()
        self._sub = await read_history(js, start, self._on_message)
        self.reading = True

    async def store(
        self, js: JetStreamContext, forwarded: Forwarded, token: str, stamp: Callable[[int], T]
    ) -> T:
        """Publish ``forwarded`` to the stream and return ``stamp(epoch)``'s result once this
        node reads it back (``token`` is its reply subject's last part).

        Raises:
            ClusterUnavailable: it could not be stored, or this node did not read it back in
                :data:`PUBLISH_TIMEOUT` seconds (then it may still be delivered, as another
                node's message is, without its sender's answer).
        """
        done: asyncio.Future[T] = asyncio.get_running_loop().create_future()

        def stamped(epoch: int) -> None:
            try:
                done.set_result(stamp(epoch))
            except Exception as exc:  # the log failed: the sender is told
                done.set_exception(exc)

        self._own[token] = stamped
        try:
            async with asyncio.timeout(PUBLISH_TIMEOUT):
                ack = await js.publish(
                    subject_for(forwarded.topic), encode(forwarded), headers=self._id(forwarded)
                )
                if ack.duplicate:
                    self._own.pop(token, None)
                    await self._read_past(ack.seq)
                    raise self._repeated(forwarded, ack.seq)
                self._caught_up(token, ack.seq)
                return await done
        except BusError:
            raise  # the log failed as this node accepted it (-32006), or a resend (-32008)
        except Exception as exc:  # the link lost mid-publish, or the reading stalled
            logger.warning("storing %s failed: %r", forwarded.message_id, exc)
            raise ClusterUnavailable() from exc
        finally:
            self._own.pop(token, None)

    def _id(self, forwarded: Forwarded) -> dict[str, str] | None:
        """The ``Nats-Msg-Id`` header JetStream de-duplicates on: the sender and the
        messageId (another sender may use the same id), when the bus refuses duplicates."""
        if self.bus.limits.dedup_window is None:
            return None
        return {"Nats-Msg-Id": json.dumps([forwarded.sender, forwarded.message_id])}

    async def _read_past(self, seq: int) -> None:
        """Return once this node has read the stream's message ``seq`` (accepted it, or
        refused it with a row): a resend's answer never comes before its first send's rows."""
        epochs = self.bus.epochs
        while epochs.read() < seq:
            if self._progress is None:
                self._progress = asyncio.Event()
            await self._progress.wait()

    def _repeated(self, forwarded: Forwarded, seq: int) -> DuplicateMessage:
        """The answer to a resend JetStream had stored already at ``seq``, with its row."""
        with contextlib.suppress(BusError):
            self.bus.log.record(
                LogEvent.REFUSED,
                message_id=forwarded.message_id,
                actor=forwarded.sender,
                topic=forwarded.topic,
                status="duplicate",
                payload={"node": self.node, "seq": seq},
            )
        return DuplicateMessage(
            f"Duplicate messageId: {forwarded.sender} already sent {forwarded.message_id!r}; "
            "the cluster's stream holds it, it was accepted then, do not send it again",
            data={"messageId": forwarded.message_id},
        )

    def _caught_up(self, token: str, seq: int) -> None:
        """Accept this node's message stored at ``seq`` now, without waiting to read it back,
        when this node has read every message before it: the order is the stream's all the
        same, and the reading skips it (read already)."""
        epochs = self.bus.epochs
        if self.reading and seq == epochs.read() + 1:
            stamped = self._own.pop(token, None)
            if stamped is not None:
                stamped(epochs.at(seq))

    async def _on_message(self, msg: Msg) -> None:
        """Accept the stream's next message, at its sequence's epoch; NATS calls this one
        message at a time, in order, and nothing here waits."""
        try:
            seq = msg.metadata.sequence.stream
        except Exception:  # no metadata: not from the stream
            return
        if seq <= self.bus.epochs.read():
            return  # read already (a consumer made again starts where it was asked)
        try:
            self._accept(msg, seq)
        finally:
            if self._progress is not None:  # a resend waits for its first send's rows
                self._progress.set()
                self._progress = None

    def _accept(self, msg: Msg, seq: int) -> None:
        epoch = self.bus.epochs.at(seq)
        try:
            forwarded = Forwarded.model_validate_json(msg.data)
        except ValidationError:
            logger.warning("a malformed message on %s was dropped (seq %d)", msg.subject, seq)
            return
        stamped = None
        if forwarded.node == self.node:
            stamped = self._own.pop(forwarded.reply.rsplit(".", 1)[-1], None)
        if stamped is not None:
            stamped(epoch)
        else:  # another node's, or one of this node's whose send gave up waiting
            self._take(forwarded, seq, epoch)

    async def close(self) -> None:
        self.reading = False
        if self._sub is not None:
            with contextlib.suppress(Exception):
                await self._sub.unsubscribe()
