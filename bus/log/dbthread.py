"""A thread of its own that runs functions for the event loop, in order, one at a time.

The activity log runs every SQLite statement here, so that a stalled disk stalls the log's
commits, never the event loop (see :mod:`bus.log.activity` for what a hop costs)::

    thread = DatabaseThread("activity-log", after=checkpoint_if_due)
    rows = await thread.run(connection.execute, sql, params)
    await thread.stop(connection.close)
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import queue
import threading
from collections.abc import Callable
from typing import Any, TypeVar

__all__ = ["DatabaseThread"]

logger = logging.getLogger("bus.log.activity")

_T = TypeVar("_T")


class DatabaseThread:
    """One thread that runs functions for the event loop, in order, one at a time.

    :meth:`run` costs one hop to the thread and one back (``call_soon_threadsafe``) whatever the
    function does; ``after`` runs on the thread once each result has been handed back, so its
    work delays the next function, not the caller of this one.
    """

    def __init__(self, name: str, *, after: Callable[[], None]) -> None:
        self._loop = asyncio.get_running_loop()
        self._after = after
        # (function, args, and an asyncio.Future or a done callback; None for the last job)
        self._jobs: queue.SimpleQueue[tuple[Callable[..., Any], tuple[Any, ...], Any]] = (
            queue.SimpleQueue()
        )
        self._stopped: asyncio.Future[None] = self._loop.create_future()
        # A daemon: a log that is never closed must not keep the interpreter alive.
        self._thread = threading.Thread(target=self._serve, name=name, daemon=True)
        self._thread.start()

    def run(self, function: Callable[..., _T], *args: Any) -> asyncio.Future[_T]:
        """Run ``function(*args)`` on the thread; the future gets its result or exception."""
        future: asyncio.Future[_T] = self._loop.create_future()
        self._jobs.put((function, args, future))
        return future

    def submit(
        self,
        function: Callable[..., _T],
        args: tuple[Any, ...],
        done: Callable[[_T | None, BaseException | None], None],
    ) -> None:
        """Run ``function(*args)`` on the thread, then ``done(result, None)`` or ``done(None,
        exc)`` on the event loop.

        ``done`` is the callback the thread hands back itself, so it runs in the loop iteration
        that reads the thread's wake-up: one iteration sooner than a future's callbacks or
        awaiters, which the loop schedules for the iteration after. ``done`` must not raise.
        """
        self._jobs.put((function, args, done))

    async def stop(self, last: Callable[[], None]) -> None:
        """Run ``last`` on the thread after every function queued, then end the thread."""
        self._jobs.put((last, (), None))
        await asyncio.wait({self._stopped})
        self._thread.join()  # it has returned or is about to: only its exit is left

    def _serve(self) -> None:
        while True:
            function, args, future = self._jobs.get()
            if future is None:  # stop(): the last job
                try:
                    function()
                except Exception:  # pragma: no cover - closing fails only on a failing disk
                    logger.exception("activity log: closing the database failed")
                self._hand_back(functools.partial(_settle, self._stopped), None, None)
                return
            settle = future if callable(future) else functools.partial(_settle, future)
            try:
                result = function(*args)
            except BaseException as exc:
                self._hand_back(settle, None, exc)
            else:
                self._hand_back(settle, result, None)
            try:
                self._after()
            except Exception:  # pragma: no cover - _after catches its own; this guards a bug,
                # which must not stop the thread every write waits on
                logger.exception("activity log: work between batches failed")

    def _hand_back(
        self, settle: Callable[[Any, BaseException | None], None], result: Any, exc: Any
    ) -> None:
        with contextlib.suppress(RuntimeError):  # the loop is closed: nobody is waiting
            self._loop.call_soon_threadsafe(settle, result, exc)


def _settle(future: asyncio.Future[Any], result: Any, exc: BaseException | None) -> None:
    if future.done():  # the caller was cancelled
        return
    if exc is None:
        future.set_result(result)
    else:
        future.set_exception(exc)
