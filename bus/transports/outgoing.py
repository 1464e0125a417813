"""The write side of one peer connection: frames out, the bus's own calls, closing.

:class:`Outgoing` owns everything the bus sends a peer: writing the frames the session queued
(:meth:`Outgoing.flush`), the calls the bus makes to it and their answers (:meth:`Outgoing.call`,
:meth:`Outgoing.queue_call` over a :class:`bus.core.calls.PendingCalls`), how far behind the peer
is (:meth:`Outgoing.write_buffer_size`, :meth:`Outgoing.write_blocked`) and closing it whatever it
does (:meth:`Outgoing.force_close`). :class:`bus.transports.connection.Connection` inherits it
rather than holding one: a part per connection would cost every idle peer an object, and every
message one attribute more, for no behaviour of its own.
"""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING, Any

from websockets.exceptions import ConnectionClosed
from websockets.protocol import State

from ..core.calls import PeerGone, PendingCalls

if TYPE_CHECKING:
    from ..core.protocol import Session
    from .local import Socket

__all__ = ["FORCED_CLOSE_WAIT", "Outgoing"]

FORCED_CLOSE_WAIT = 1.0
"""Seconds :meth:`Outgoing.force_close` lets the close frame go out before it drops the TCP
connection; a peer that reads nothing would otherwise hold the close for ``close_timeout``."""


class Outgoing:
    """What the bus writes to one peer. The class that inherits it sets ``ws``, ``session``,
    ``_pending`` and ``_gone`` (True once the read loop has ended) and gives :attr:`name`."""

    ws: Socket
    session: Session
    _pending: PendingCalls
    _gone: bool

    @property
    def name(self) -> str:
        """Who the peer is, for logs and :class:`PeerGone`."""
        raise NotImplementedError

    @property
    def deliveries_in_flight(self) -> int:
        """``processMessage`` calls sent to this peer and not answered yet."""
        return len(self._pending)

    async def flush(self) -> None:
        """Write every frame the session has queued; a closed socket drops them quietly."""
        for frame in self.session.data_to_send():
            try:
                await self.ws.send(frame, text=True)  # UTF-8 already: written as it is
            except ConnectionClosed:
                return

    def write_buffer_size(self) -> int:
        """Bytes written to this peer that it has not read yet (0 for an in-process link)."""
        transport = getattr(self.ws, "transport", None)
        if transport is None:
            return 0
        size: int = transport.get_write_buffer_size()
        return size

    def write_blocked(self) -> bool:
        """Whether this peer is not keeping up: more bytes unread than the socket's low water
        mark. Writers wait once the buffer passes the high mark (websockets' ``write_limit``,
        32 KiB) and go on only when it falls below the low one (8 KiB), so above the low mark
        the bus is, or is about to be, waiting for this peer."""
        transport = getattr(self.ws, "transport", None)
        if transport is None:
            return False
        size: int = transport.get_write_buffer_size()
        low: int = transport.get_write_buffer_limits()[0]
        return size > low

    def closing(self) -> bool:
        """Whether the socket has begun to close: a frame written to it now may wait for the
        close handshake to end (websockets waits up to its ``close_timeout``, 10 s) rather
        than go out at once."""
        state = getattr(self.ws, "state", State.OPEN)
        transport = getattr(self.ws, "transport", None)
        closed: bool = transport is not None and transport.is_closing()
        return self._gone or state is not State.OPEN or closed

    async def force_close(self, code: int, reason: str) -> None:
        """Close with ``code``, dropping the TCP connection if the close frame cannot go out
        within :data:`FORCED_CLOSE_WAIT` seconds (a peer that reads nothing)."""
        try:
            async with asyncio.timeout(FORCED_CLOSE_WAIT):
                await self.ws.close(code, reason)
        except TimeoutError:
            transport = getattr(self.ws, "transport", None)
            if transport is not None:
                transport.abort()

    async def call(self, method: str, params: Any) -> Any:
        """Send a request to the peer and return its result.

        Put an ``asyncio.timeout()`` around the call: this waits as long as the peer takes.

        Raises:
            PeerGone: the connection closed first.
            BusError: the peer answered with an error.
        """
        request_id, future = self.queue_call(method, params)
        try:
            await self.flush()
            return await future
        finally:
            self._pending.forget(request_id)

    def queue_call(self, method: str, params: Any) -> tuple[int, asyncio.Future[Any]]:
        """Queue a request to the peer, unwritten; return its id and the future its answer
        settles. Await :meth:`flush` next, and call :meth:`forget_call` once the future is done
        or no longer awaited: :meth:`call` without a coroutine per call, for a caller that
        waits for many at once.

        Raises:
            PeerGone: the connection is closed.
        """
        if self._gone:
            raise PeerGone(self.name)
        request_id = self.session.send_request(method, params)
        return request_id, self._pending.expect(request_id)

    def forget_call(self, request_id: int) -> None:
        """Stop waiting for the answer to a :meth:`queue_call` request."""
        self._pending.forget(request_id)
