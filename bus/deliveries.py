"""The ``processMessage`` calls of one bus: a delivery's timeout, its outcome and its row.

:class:`Deliveries` is the per-target half of :class:`bus.fanout.Fanout`: one call under
``process_timeout`` and the link's in-flight bound, a peer that reads nothing refused fast
(``slow_consumer``), the ``process_finish`` row, and the pushes a subscription holds back
(``debounceMs``: the loop timer that flushes a window, then the push). What is delivered to
whom is decided in :mod:`bus.core.delivery`; :class:`Params` is what each call carries.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable, Sequence
from typing import Any

from .core import _json, delivery
from .core.delivery import Message
from .core.errors import BusError
from .core.logevents import LogEvent
from .core.router import Route, Router
from .core.state import PeerStates
from .log.activity import ActivityLog
from .ops.config import Limits
from .transports.connection import Connection, Link, PeerGone

__all__ = ["Deliveries", "Params"]


class Deliveries:
    """Delivers one message to one target at a time, for one bus.

    Args:
        closing: tells whether the bus is closing (a window's flush then pushes nothing).
    """

    def __init__(
        self,
        log: ActivityLog,
        limits: Limits,
        router: Router[Link],
        states: PeerStates[Link],
        *,
        closing: Callable[[], bool],
    ) -> None:
        self.log = log
        self.limits = limits
        self._router = router
        self._states = states
        self._closing = closing
        self.on_delivered: Callable[[str, float], None] | None = None
        """Told each delivery's outcome (``process_finish`` status) and how many seconds the
        ``processMessage`` call took; :mod:`bus.ops.metrics` sets it through the bus."""

    async def deliver_unheard(
        self,
        route: Route[Link],
        params: Params,
        message: Message,
        release: Callable[[], None] | None,
    ) -> None:
        """Deliver to a target the sender may not hear; its row is committed with the next."""
        try:
            await self.deliver(route, params, message)
            with contextlib.suppress(BusError):
                await self.log.commit()
        finally:
            if release is not None:
                release()

    async def deliver_all(
        self, routes: list[Route[Link]], params: Params, message: Message
    ) -> list[bool]:
        """:meth:`deliver` to every route at once; return whether each processed it, in order.

        The calls start together, so one ``process_timeout`` timer serves them all: when it
        fires, every call still waiting ends as ``timeout``, as its own timer would have.
        """
        loop = asyncio.get_running_loop()
        calls = [loop.create_task(self.deliver(r, params, message, timed=False)) for r in routes]
        expiry = self._expire_later(loop, calls)
        try:
            return await asyncio.gather(*calls)
        finally:
            if expiry is not None:
                expiry.cancel()

    async def deliver(
        self, route: Route[Link], params: Params, message: Message, *, timed: bool = True
    ) -> bool:
        """Call ``processMessage`` on ``route`` under the delivery timeout and the link's
        in-flight bound; record its ``process_finish``; return whether it was processed.

        Args:
            timed: False when the caller set the timer (:meth:`deliver_all`).
        """
        status, error = "processed", None
        limit = self.limits.max_write_buffer
        target = route.handle
        loop = asyncio.get_running_loop()
        started = loop.time()
        expiry = self._expire_later(loop, [asyncio.current_task()]) if timed else None
        try:
            if limit is not None and target.write_buffer_size() > limit:
                # A peer that does not read gets nothing more written: fail fast, hold nothing.
                raise _SlowConsumer()
            status, error = delivery.outcome(await _call(target, params))
        except asyncio.CancelledError as exc:
            if not _expired(exc):
                raise
            status, error = "timeout", f"no answer within {self.limits.process_timeout}s"
        except PeerGone:
            status, error = "disconnected", None
        except _SlowConsumer:
            status, error = "slow_consumer", f"more than {limit} bytes unread"
        except BusError as exc:
            status, error = "error", str(exc)
        finally:
            if expiry is not None:
                expiry.cancel()
        if self.on_delivered is not None:
            self.on_delivered(status, loop.time() - started)
        self._finished(route, message, status, error)
        return status == "processed"

    def _expire_later(
        self, loop: asyncio.AbstractEventLoop, calls: Sequence[asyncio.Task[Any] | None]
    ) -> asyncio.TimerHandle | None:
        """The timer that ends ``calls`` as ``timeout`` in ``process_timeout``; None without
        one. A plain loop timer: ``asyncio.timeout`` costs a context manager more per call."""
        timeout = self.limits.process_timeout
        if timeout is None:
            return None
        return loop.call_at(loop.time() + timeout, _expire, calls)

    def _finished(
        self, route: Route[Link], message: Message, status: str, error: str | None
    ) -> None:
        self.log.record(
            LogEvent.PROCESS_FINISH,
            message_id=message.message_id,
            actor=route.client_id,
            topic=message.topic,
            status=status,
            error=error,
            epoch=message.epoch,
            trace_id=message.trace_id,
        )

    # Pushes that subscriptions hold back: minRelevance and debounceMs (see bus.core.pushes)

    def set_timer(self, timer: delivery.SetTimer[Link]) -> None:
        """Arm the timer that flushes a debounce window, kept in the link's state."""
        state = self._states.open(timer.link)
        loop = asyncio.get_running_loop()
        state.timers[timer.topic] = loop.call_at(
            timer.at, self._flush_held, timer.link, timer.topic
        )

    def _flush_held(self, conn: Link, topic: str) -> None:
        """At the end of a debounce window: push the latest message held on ``topic``."""
        due = delivery.flush(self._router, self._states, conn, topic, _clock())
        if due is None or self._closing():
            return
        conn.spawn(self._push_held(*due))

    async def _push_held(self, route: Route[Link], message: Message, skipped: int) -> None:
        log = self.log
        log.record(
            LogEvent.PROCESS_START,
            message_id=message.message_id,
            actor=route.client_id,
            topic=message.topic,
            status=f"debounced, skipped {skipped}",
            epoch=message.epoch,
            trace_id=message.trace_id,
        )
        params = Params(message, skipped)
        with contextlib.suppress(BusError):  # unpushed, it stays fetchable
            await log.commit()
            await self.deliver(route, params, message)
            await log.commit()


class _SlowConsumer(Exception):
    """A delivery refused because the target has too many unread bytes."""


class Params:
    """The ``processMessage`` params of one message, made once per form a link takes.

    A :class:`~bus.transports.connection.Connection` encodes the call itself, so it gets the
    params encoded once for all its targets (:func:`bus.core._json.fragment`), the envelope in
    them as the message's one encoding: every frame splices them in after its own id, and no
    decoded copy is held while deliveries wait. Other links (webhooks, the cluster) read the
    params as a dict; they get one decoded on first use.
    """

    __slots__ = ("_decoded", "_encoded", "message", "skipped")

    def __init__(self, message: Message, skipped: int = 0) -> None:
        self.message, self.skipped = message, skipped
        self._encoded: Any = None
        self._decoded: dict[str, Any] | None = None

    def fit(self, link: Link) -> Any:
        """The params to call ``link`` with: a dict, or for a
        :class:`~bus.transports.connection.Connection` the same encoded params, which it writes
        as they are."""
        if isinstance(link, Connection):
            if self._encoded is None:
                params = self._make(_json.fragment(self.message.encode()))
                self._encoded = _json.fragment(_json.dumpb(params))
            return self._encoded
        if self._decoded is None:
            self._decoded = self._make(self.message.payload)
        return self._decoded

    def _make(self, payload: Any) -> dict[str, Any]:
        message = self.message
        params = {"topic": message.topic, "payload": payload, "epoch": message.epoch}
        if self.skipped:
            params["skipped"] = self.skipped
        return params


def _clock() -> float:
    return asyncio.get_running_loop().time()


_EXPIRED = "process_timeout"
"""The message a delivery's call is cancelled with when its timer fires."""


async def _call(target: Link, params: Params) -> Any:
    """``processMessage`` on ``target`` within its in-flight bound."""
    if target.inflight is None:
        return await target.call("processMessage", params.fit(target))
    async with target.inflight:
        return await target.call("processMessage", params.fit(target))


def _expire(calls: Sequence[asyncio.Task[Any] | None]) -> None:
    """End the deliveries in ``calls`` still waiting: their time is up."""
    for call in calls:
        if call is not None and not call.done():
            call.cancel(_EXPIRED)


def _expired(cancelled: asyncio.CancelledError) -> bool:
    """Whether ``cancelled`` is the delivery's own timer firing (the task then goes on, as
    under ``asyncio.timeout``), rather than the task being cancelled, which must propagate."""
    task = asyncio.current_task()
    if cancelled.args[:1] != (_EXPIRED,) or task is None:
        return False
    return task.uncancel() == 0
