"""The ``processMessage`` calls of one bus: a delivery's timeout, its outcome and its row.

:class:`Deliveries` is the per-target half of :class:`bus.fanout.Fanout`: one call under
``process_timeout`` and the link's in-flight bound, a peer that reads nothing refused fast
(``slow_consumer``), the ``process_finish`` row, and the pushes a subscription holds back
(``debounceMs``: the loop timer that flushes a window, then the push). What is delivered to
whom is decided in :mod:`bus.core.delivery`; :class:`Params` is what each call carries.

A message to many targets (:meth:`Deliveries.deliver_all`) costs one timer, not one per call,
and no task for the targets that can take their frame at once: the fan-out writes those
calls itself and each answer's future records its outcome in a callback. A target that is
behind (its in-flight slots taken, its write buffer over the low mark, a frame over
:data:`INLINE_BYTES`, its socket closing) gets a task of its own, so that it holds up no other.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
from collections.abc import Callable, Coroutine, Sequence
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

__all__ = ["INLINE_BYTES", "Deliveries", "Params"]


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
        fires, every call still waiting ends as ``timeout``, as its own timer would have. A
        :class:`~bus.transports.connection.Connection` that can take the frame without making
        the writer wait (:func:`_writes_at_once`) is called from here, its answer settling a
        future whose callback records it: no task per delivery. Any other gets its own task.
        """
        loop = asyncio.get_running_loop()
        spread = _Spread(self, message, len(routes), loop)
        expiry = self._expire_later(loop, spread)
        try:
            for index, route in enumerate(routes):
                target = route.handle
                if not isinstance(target, Connection) or not _writes_at_once(target, params):
                    spread.track(index, route, self.deliver(route, params, message, timed=False))
                    continue
                if target.inflight is not None:
                    await target.inflight.acquire()  # not locked (checked): never waits
                if spread.call(index, route, target, params.fit(target)):
                    await target.flush()  # under the buffer's high mark: never waits
            return await spread.results()
        finally:
            if expiry is not None:
                expiry.cancel()
            spread.abandon()

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
        self.finished(route, message, status, error, loop.time() - started)
        return status == "processed"

    def _expire_later(
        self, loop: asyncio.AbstractEventLoop, calls: _Spread | Sequence[asyncio.Task[Any] | None]
    ) -> asyncio.TimerHandle | None:
        """The timer that ends ``calls`` as ``timeout`` in ``process_timeout``; None without
        one. A plain loop timer: ``asyncio.timeout`` costs a context manager more per call."""
        timeout = self.limits.process_timeout
        if timeout is None:
            return None
        return loop.call_at(loop.time() + timeout, _expire, calls)

    def finished(
        self, route: Route[Link], message: Message, status: str, error: str | None, took: float
    ) -> None:
        """Record a delivery's outcome (``process_finish``), which took ``took`` seconds."""
        if self.on_delivered is not None:
            self.on_delivered(status, took)
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
    params with the envelope in them as the message's one encoding
    (:func:`bus.core._json.fragment`), encoded once for all its targets when they are small
    (:data:`INLINE_BYTES`): every frame splices them in after its own id, and no decoded copy
    (nor, for a large message, a second encoded one) is held while deliveries wait. Other
    links (webhooks, the cluster) read the params as a dict; they get one decoded on first use.
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
                # Small params are encoded once for all frames. A large message keeps only its
                # one encoding, spliced into each frame as it is written: a second copy would
                # be held as long as its deliveries wait, outside max_inflight_bytes.
                small = self.size() <= INLINE_BYTES
                self._encoded = _json.fragment(_json.dumpb(params)) if small else params
            return self._encoded
        if self._decoded is None:
            self._decoded = self._make(self.message.payload)
        return self._decoded

    def size(self) -> int:
        """About how many bytes the params take in a frame: the envelope's encoding."""
        return len(self.message.encode())

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


def _expire(calls: _Spread | Sequence[asyncio.Task[Any] | None]) -> None:
    """End the deliveries in ``calls`` still waiting: their time is up."""
    if isinstance(calls, _Spread):
        calls.expire()
        return
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


INLINE_BYTES = 16 << 10
"""The largest params :meth:`Deliveries.deliver_all` writes from its own coroutine. With the
target's write buffer under its low mark (8 KiB), such a frame leaves it under the high mark
(32 KiB), where a write never waits: a slow target cannot hold up the others."""


def _writes_at_once(target: Connection, params: Params) -> bool:
    """Whether a call to ``target`` can be written without waiting: a free in-flight slot,
    a write buffer under its low mark, a small frame, and a socket not closing (a write to it
    would wait for the close handshake, outside ``process_timeout``, and every target after
    it with it)."""
    inflight = target.inflight
    if inflight is not None and inflight.locked():
        return False
    if target.write_blocked() or target.closing():
        return False
    return params.size() <= INLINE_BYTES


class _Spread:
    """The deliveries of one message that :meth:`Deliveries.deliver_all` waits for: futures
    of calls it wrote itself, whose callbacks record them, and tasks for the others."""

    __slots__ = (
        "_calls",
        "_deliveries",
        "_done",
        "_expired",
        "_left",
        "_loop",
        "_message",
        "_outcomes",
        "_started",
        "_tasks",
    )

    def __init__(
        self, deliveries: Deliveries, message: Message, count: int, loop: asyncio.AbstractEventLoop
    ) -> None:
        self._deliveries, self._message, self._loop = deliveries, message, loop
        self._outcomes = [False] * count
        self._left = count
        self._done: asyncio.Future[None] = loop.create_future()
        self._calls: dict[int, asyncio.Future[Any]] = {}
        self._tasks: dict[int, asyncio.Task[bool]] = {}
        self._expired = False
        self._started = loop.time()

    async def results(self) -> list[bool]:
        """Whether each target processed the message, once every one has ended."""
        if self._left:
            await self._done
        return self._outcomes

    def track(self, index: int, route: Route[Link], delivery: Coroutine[Any, Any, bool]) -> None:
        """Run ``delivery`` (target ``index``'s) in a task of its own."""
        if self._expired:  # the timer fired while an earlier write waited: never started
            delivery.close()
            self._timed_out(index, route)
            return
        task = self._loop.create_task(delivery)
        self._tasks[index] = task
        task.add_done_callback(functools.partial(self._task_ended, index))

    def call(self, index: int, route: Route[Link], target: Connection, params: Any) -> bool:
        """Queue ``processMessage`` to ``target`` (its in-flight slot taken); return whether
        it was queued (else its outcome is recorded: flush nothing)."""
        if self._expired:  # the timer fired while an earlier write waited: too late to call
            self._release(target)
            self._timed_out(index, route)
            return False
        limit = self._deliveries.limits.max_write_buffer
        if limit is not None and target.write_buffer_size() > limit:
            self._release(target)
            self._end(index, route, "slow_consumer", f"more than {limit} bytes unread")
            return False
        try:
            request_id, future = target.queue_call("processMessage", params)
        except PeerGone:
            self._release(target)
            self._end(index, route, "disconnected", None)
            return False
        self._calls[index] = future
        future.add_done_callback(
            functools.partial(self._answered, index, route, target, request_id)
        )
        return True

    def expire(self) -> None:
        """``process_timeout`` is up: every call still waiting ends as ``timeout``."""
        self._expired = True
        for future in self._calls.values():
            future.cancel()
        for task in self._tasks.values():
            if not task.done():
                task.cancel(_EXPIRED)

    def abandon(self) -> None:
        """Stop every call still waiting, recording nothing (the sender's request was
        cancelled, as its tasks would have been)."""
        if self._left:
            self._expired = False
            for future in self._calls.values():
                future.cancel()
            for task in self._tasks.values():
                task.cancel()

    def _answered(
        self,
        index: int,
        route: Route[Link],
        target: Connection,
        request_id: int,
        future: asyncio.Future[Any],
    ) -> None:
        del self._calls[index]
        target.forget_call(request_id)
        self._release(target)
        if future.cancelled():
            if self._expired:
                self._timed_out(index, route)
            return  # else abandoned
        error = future.exception()
        if error is None:
            self._end(index, route, *delivery.outcome(future.result()))
        elif isinstance(error, PeerGone):
            self._end(index, route, "disconnected", None)
        else:  # a BusError: the peer answered with an error
            self._end(index, route, "error", str(error))

    def _task_ended(self, index: int, task: asyncio.Task[bool]) -> None:
        del self._tasks[index]
        if task.cancelled():
            return  # abandoned
        error = task.exception()
        if error is not None:
            self._fail(error)
            return
        self._count(index, task.result())

    def _timed_out(self, index: int, route: Route[Link]) -> None:
        timeout = self._deliveries.limits.process_timeout
        self._end(index, route, "timeout", f"no answer within {timeout}s")

    def _end(self, index: int, route: Route[Link], status: str, error: str | None) -> None:
        took = self._loop.time() - self._started
        try:
            self._deliveries.finished(route, self._message, status, error, took)
        except Exception as exc:  # the log refused the row: closed, or its backlog full
            # Raised in a future's callback it would be lost and this delivery never counted:
            # the fan-out ends with it instead, as a delivery's own task ends it.
            self._fail(exc)
            return
        self._count(index, status == "processed")

    def _fail(self, error: BaseException) -> None:
        if not self._done.done():
            self._done.set_exception(error)

    def _count(self, index: int, processed: bool) -> None:
        self._outcomes[index] = processed
        self._left -= 1
        if not self._left and not self._done.done():
            self._done.set_result(None)

    @staticmethod
    def _release(target: Connection) -> None:
        if target.inflight is not None:
            target.inflight.release()
