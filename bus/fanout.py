"""Carrying a message out: its epoch and rows, the commit, the ``processMessage`` calls.

:class:`Fanout` is the I/O half of delivery. What it records and to whom it delivers is
decided in :mod:`bus.core.delivery` (targets, taint, relevance, debounce, outcomes); this
module gives the epoch, writes the ``send_start`` row, commits before anything is delivered
(fail closed: -32006 and nothing delivered when the log cannot commit), calls every target
concurrently (every call under ``process_timeout``, one timer for them all:
:mod:`bus.deliveries`), and records how the message ended. The bus
(:class:`bus.server.Bus`) owns one and hands it what it accepted.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

from .core import delivery
from .core.actions import Record
from .core.delivery import Message
from .core.digest import canonical_sha256
from .core.epochs import Epochs, NoRoom
from .core.errors import BusError, ClusterUnavailable
from .core.logevents import LogEvent
from .core.policy import Grants
from .core.presence import BUS_CLIENT_ID
from .core.router import Route, Router
from .core.state import PeerStates
from .deliveries import Deliveries, Params
from .log.activity import ActivityLog
from .log.fetch import sender_mark
from .ops.config import Limits, LogContent
from .transports.connection import Link, hold_request_bytes

if TYPE_CHECKING:
    from .transports.cluster import Forwarder

__all__ = ["Fanout", "record_row"]


class Fanout:
    """Delivers accepted messages for one bus.

    Args:
        closing: tells whether the bus is closing (a window's flush then pushes nothing).
    """

    def __init__(
        self,
        log: ActivityLog,
        limits: Limits,
        router: Router[Link],
        states: PeerStates[Link],
        epochs: Epochs,
        *,
        log_content: LogContent,
        closing: Callable[[], bool],
    ) -> None:
        self.log = log
        self.limits = limits
        self._router = router
        self._states = states
        self._epochs = epochs
        self.log_content: LogContent = log_content
        self.deliveries = Deliveries(log, limits, router, states, closing=closing)
        """The ``processMessage`` calls, their rows and the held pushes."""
        self.cluster: Forwarder | None = None
        """The other bus nodes when this bus is one node of a cluster (set through
        :attr:`bus.server.Bus.cluster`): what this node accepts is delivered there too."""

    async def publish(
        self,
        topic: str,
        payload: dict[str, Any],
        message_id: str,
        message_type: str,
        *,
        sender: Route[Link] | None,
        rpc_id: str | None = None,
        trace_id: str | None = None,
    ) -> int:
        """Deliver ``payload`` to every subscriber of ``topic`` but the sender; return how many
        answered ``processed: true``.

        The message gets the next epoch. Nothing is delivered before the ``send_start`` row is
        committed, and every row is committed before this returns.

        Args:
            sender: the sending peer's route, or None for the bus itself (presence).
            trace_id: the trace id of the envelope's ``traceparent``, for the log rows.

        Raises:
            AuditUnavailable: the activity log could not commit; if it failed on the first
                commit, nothing was delivered.
        """
        message = Message(topic, payload, message_id, message_type, trace_id=trace_id)
        targets = await self.accept(message, sender=sender, rpc_id=rpc_id)
        actor = sender.client_id if sender is not None else BUS_CLIENT_ID
        hearer = sender.grants if sender is not None else None
        return await self.fan_out(targets, message, actor=actor, rpc_id=rpc_id, hearer=hearer)

    def deliver_forwarded(
        self,
        topic: str,
        payload: dict[str, Any],
        message_id: str,
        message_type: str,
        *,
        sender: Route[Link] | None,
        epoch: int,
        trace_id: str | None = None,
    ) -> Awaitable[tuple[int, int]]:
        """Accept a message another cluster node sent (at the stream's ``epoch``) now, and
        return what delivers it to this node's subscribers, with this node's rows and checks;
        awaited, it gives how many processed it, of how many were tried.
        :mod:`bus.transports.cluster` calls it (through the bus) in the stream's order, so the
        rows of every node follow that order; the deliveries may then run concurrently.

        Raises:
            AuditUnavailable: the log is closed; nothing was recorded.
        """
        message = Message(topic, payload, message_id, message_type, trace_id=trace_id)
        message.forwarded = True  # delivered here, never forwarded again
        targets = self.stamp(message, sender=sender, rpc_id=None, epoch=epoch)
        return self._carry_forwarded(targets, message, sender)

    async def _carry_forwarded(
        self, targets: list[Route[Link]], message: Message, sender: Route[Link] | None
    ) -> tuple[int, int]:
        actor = sender.client_id if sender is not None else BUS_CLIENT_ID
        if targets:
            await self._commit(message, actor)
        hearer = sender.grants if sender is not None else None
        delivered = await self.fan_out(targets, message, actor=actor, rpc_id=None, hearer=hearer)
        return delivered, len(targets)

    async def accept(
        self, message: Message, *, sender: Route[Link] | None, rpc_id: str | None
    ) -> list[Route[Link]]:
        """Give ``message`` its epoch, record it and its targets, commit the rows, and return
        the targets.

        On a cluster node the epoch is the one the cluster's stream gives it: the message is
        stored there first and accepted when this node reads it back in the stream's order
        (:meth:`bus.transports.cluster.ClusterLink.sequence`). Only the bus's own messages
        (presence) are accepted while the node is cut off, with an epoch of this node alone.

        Raises:
            ClusterUnavailable: a cluster node could not store a peer's message in the stream;
                nothing was recorded or delivered.
            AuditUnavailable: the rows could not be committed; deliver nothing. A
                ``send_aborted`` row follows, so that the message is never fetched either.
        """
        actor = sender.client_id if sender is not None else BUS_CLIENT_ID

        def stamp(epoch: int | None) -> list[Route[Link]]:
            return self.stamp(message, sender=sender, rpc_id=rpc_id, epoch=epoch)

        if self.cluster is None or message.forwarded:
            targets = stamp(None)
        elif sender is None:  # the bus's own: kept on this node alone while it is cut off
            try:
                targets = await self.cluster.sequence(message, actor, stamp)
            except ClusterUnavailable:
                targets = _local(stamp)
        else:
            targets = await self.cluster.sequence(message, actor, stamp)
        if targets:  # else fan_out commits the rows (and fetch commits before it reads)
            try:
                await self._commit(message, actor)
            except BusError:
                if self.cluster is not None:
                    self.cluster.forget(message)  # never delivered: its answers are not awaited
                raise
        return targets

    def stamp(
        self,
        message: Message,
        *,
        sender: Route[Link] | None,
        rpc_id: str | None,
        epoch: int | None = None,
    ) -> list[Route[Link]]:
        """Give ``message`` ``epoch`` (None: the next of this bus's), record its
        ``send_start`` row and its targets' rows, and return the targets; nothing waits."""
        actor = sender.client_id if sender is not None else BUS_CLIENT_ID
        grants = sender.grants if sender is not None else None
        # The epoch is given and the row recorded with no await between them, so epochs
        # follow the order of the rows, which the log commits in order.
        message.epoch = self._epochs.next() if epoch is None else epoch
        self.log.record(
            LogEvent.SEND_START,
            message_id=message.message_id,
            rpc_id=rpc_id,
            actor=actor,
            topic=message.topic,
            status=sender_mark(grants),
            payload_json=_content(message, self.log_content),
            epoch=message.epoch,
            trace_id=message.trace_id,
        )
        return self._pick(message, sender)

    async def _commit(self, message: Message, actor: str) -> None:
        """Commit ``message``'s rows before it is delivered.

        Raises:
            AuditUnavailable: they could not be; ``message`` is aborted (a ``send_aborted``
                row follows, so that it is never fetched either).
        """
        try:
            # Fail closed, for every message: nothing is delivered without its audit row, so
            # a peer that gets -32006 knows that nobody received the message and may resend it.
            await self.log.commit()
        except BusError:
            message.aborted = True
            # Its rows may still be written later: this one tells fetchMessages to skip it.
            with contextlib.suppress(BusError):
                self.log.record(
                    LogEvent.SEND_ABORTED,
                    message_id=message.message_id,
                    actor=actor,
                    topic=message.topic,
                    epoch=message.epoch,
                    trace_id=message.trace_id,
                )
            raise

    def _pick(self, message: Message, sender: Route[Link] | None) -> list[Route[Link]]:
        """The targets :func:`bus.core.delivery.targets` chose, each with its
        ``process_start`` row; the rows of those left out, and the debounce timers to arm."""
        picked = delivery.targets(self._router, self._states, message, sender=sender, clock=_clock)
        log = self.log
        for row in picked.rows:
            record_row(log, row)
        for timer in picked.timers:
            self.deliveries.set_timer(timer)
        message_id, topic, epoch, trace_id = (
            message.message_id,
            message.topic,
            message.epoch,
            message.trace_id,
        )
        for target in picked.routes:  # the common case, written without a Record each
            log.record(
                LogEvent.PROCESS_START,
                message_id=message_id,
                actor=target.client_id,
                topic=topic,
                epoch=epoch,
                trace_id=trace_id,
            )
        return picked.routes

    async def fan_out(
        self,
        targets: list[Route[Link]],
        message: Message,
        *,
        actor: str | None,
        rpc_id: str | None,
        hearer: Grants | None = None,
    ) -> int:
        """Deliver to ``targets`` concurrently, record ``send_finish``, commit; return how many
        answered ``processed: true``.

        ``hearer`` is the sender, who reads the result: a target more tainted than it is
        delivered to without being awaited or counted (:func:`bus.core.delivery.unheard`), so a
        tainted peer never chooses what an untainted sender reads back, nor when. On a cluster
        node, a message accepted here is also delivered on the other nodes, at the same time;
        their subscribers count as this node's do, in the result and the row."""
        params = Params(message)
        remote = None
        if self.cluster is not None and not message.forwarded:
            sender = actor or BUS_CLIENT_ID
            remote = asyncio.ensure_future(self.cluster.forward(message, sender))
        targets, unheard = delivery.unheard(targets, hearer)
        deliveries = self.deliveries
        for target in unheard:
            # Answered before this delivery ends, the request's bytes stay charged until then.
            release = hold_request_bytes()
            target.handle.spawn(deliveries.deliver_unheard(target, params, message, release))
        if not targets:
            delivered = 0
        elif len(targets) == 1:  # the common case, without a task and a gather
            delivered = int(await deliveries.deliver(targets[0], params, message))
        else:
            delivered = sum(await deliveries.deliver_all(targets, params, message))
        reached = len(targets)
        if remote is not None:
            elsewhere, reached_elsewhere = await remote
            delivered, reached = delivered + elsewhere, reached + reached_elsewhere
        status = f"delivered {delivered}/{reached}"
        if unheard:
            status = f"{status}, unheard {len(unheard)}"
        await self._finish(message, actor, rpc_id, status)
        return delivered

    async def _finish(
        self, message: Message, actor: str | None, rpc_id: str | None, status: str
    ) -> None:
        """Record ``message``'s ``send_finish`` row with ``status``, and commit every row."""
        self.log.record(
            LogEvent.SEND_FINISH,
            message_id=message.message_id,
            rpc_id=rpc_id,
            actor=actor,
            topic=message.topic,
            status=status,
            epoch=message.epoch,
            trace_id=message.trace_id,
        )
        await self.log.commit()


def record_row(log: ActivityLog, row: Record) -> None:
    """Write a :class:`~bus.core.actions.Record` the core decided on into ``log``."""
    log.record(
        row.event,
        message_id=row.message_id,
        rpc_id=row.rpc_id,
        actor=row.actor,
        topic=row.topic,
        status=row.status,
        payload=row.payload,
        error=row.error,
        epoch=row.epoch,
        trace_id=row.trace_id,
    )


def _local(stamp: Callable[[int | None], list[Route[Link]]]) -> list[Route[Link]]:
    """``stamp`` at an epoch of this cluster node alone.

    Raises:
        ClusterUnavailable: no epoch is left before the stream's next one.
    """
    try:
        return stamp(None)
    except NoRoom as exc:
        raise ClusterUnavailable(f"{exc}: not kept while this node is cut off") from exc


def _content(message: Message, mode: LogContent) -> str:
    """``send_start``'s payload: the envelope as JSON, or its type and SHA-256 (``digest``).

    The JSON is the message's one encoding (:meth:`~bus.core.delivery.Message.text`), which
    its deliveries reuse. The digest is over the canonical JSON (keys sorted, no spaces,
    UTF-8), so an auditor who holds the message can recompute it:
    ``bus.core.digest.canonical_sha256(envelope)``.
    """
    if mode == "full":
        return message.text()
    return json.dumps(
        {"type": message.type, "sha256": canonical_sha256(message.payload)},
        separators=(",", ":"),
        ensure_ascii=False,
    )


def _clock() -> float:
    return asyncio.get_running_loop().time()
