"""Requests this side sent and is waiting to hear back about, matched to answers by id.

Both ends of a connection use it: the bus for its ``processMessage`` calls, the peer SDK for
everything it asks the bus. The session (:mod:`bus.core.protocol`) numbers the requests and parses
the answers; this holds one future per request in between.
"""

from __future__ import annotations

import asyncio
from typing import Any

from .protocol import ErrorResponse, RequestId, Response

__all__ = ["PeerGone", "PendingCalls"]


class PeerGone(ConnectionError):
    """The other side disconnected before it answered a call this side made.

    The bus raises it for its ``processMessage`` calls; the SDK's ``peers.PeerClosed`` is a
    subclass, so ``except PeerGone`` catches a lost connection on either side.
    """


class PendingCalls:
    """One future per outstanding request id.

    Call :meth:`expect` right after ``session.send_request()``, await the future, and call
    :meth:`forget` in a ``finally``. Feed every :class:`Response` / :class:`ErrorResponse` event
    to :meth:`settle`; when the connection ends, :meth:`fail_all`.
    """

    def __init__(self) -> None:
        self._futures: dict[RequestId, asyncio.Future[Any]] = {}

    def __len__(self) -> int:
        return len(self._futures)

    def expect(self, request_id: RequestId) -> asyncio.Future[Any]:
        """Return the future the answer to ``request_id`` will settle."""
        future: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        self._futures[request_id] = future
        return future

    def forget(self, request_id: RequestId) -> None:
        """Stop waiting for ``request_id`` (answered, timed out or abandoned)."""
        self._futures.pop(request_id, None)

    def settle(self, event: Response | ErrorResponse) -> None:
        """Resolve the matching future with the result, or fail it with the error.

        An answer nobody waits for (late, or to an unknown id) is dropped.
        """
        future = self._futures.get(event.id)
        if future is None or future.done():
            return
        if isinstance(event, Response):
            future.set_result(event.result)
        else:
            future.set_exception(event.error)

    def fail_all(self, error: BaseException) -> None:
        """Fail every outstanding call with ``error``: the connection is gone."""
        for future in self._futures.values():
            if not future.done():
                future.set_exception(error)
        self._futures.clear()
