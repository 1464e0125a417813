"""The reading side of a :class:`~peers.client.Peer`: the bus's frames in, answers out.

:class:`Receiver` reads the WebSocket through the sans-I/O :class:`~bus.core.protocol.Session`:
responses settle the pending calls, requests (deliveries) go to the handlers, each in its own
task, once the catch-up after a reconnect has handed over what was missed. When the connection
ends it records why, as the :class:`~peers.errors.PeerClosed` that calls fail with.
"""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine
from typing import Any

from websockets.asyncio.client import ClientConnection
from websockets.exceptions import ConnectionClosed
from websockets.protocol import State

from bus.core.calls import PendingCalls
from bus.core.protocol import ErrorResponse, Notification, Request, Response, Session
from bus.transports.local import Socket

from .catchup import CatchUp
from .errors import PeerClosed, refused
from .handlers import Handlers, delivery
from .messages import Reply

__all__ = ["Receiver"]


class Receiver:
    """Reads one connection at a time and answers its deliveries; :class:`~peers.client.Peer`
    sets the attributes below and starts :meth:`_read` on each new socket."""

    client_id: str
    _ws: Socket | None
    _session: Session
    _pending: PendingCalls
    _handlers: Handlers
    _catch: CatchUp
    _tasks: set[asyncio.Task[None]]
    _closed: PeerClosed
    """What calls fail with while there is no connection: set when one ends."""

    async def _read(self, ws: Socket) -> None:
        """Read ``ws`` until it closes; then record why in :attr:`_closed` and fail the calls."""
        cause: ConnectionClosed | None = None
        try:
            async for text in ws:
                self._session.receive_text(text)
                for event in self._session.events_received():
                    self._dispatch(event)
                await self._flush(ws)
        except ConnectionClosed as exc:  # closed with an error code: 4001, 4004, 1006...
            cause = exc
        finally:
            self._closed = _closed(f"{self.client_id}: connection closed", ws, cause)
            # Fail the calls waiting for an answer now: during initialize no runner watches
            # this task, and a waiting call would otherwise sit out its whole timeout.
            self._fail_pending()

    def _dispatch(self, event: Request | Notification | Response | ErrorResponse) -> None:
        match event:
            case Response():
                self._pending.settle(event)
            case ErrorResponse():
                # The SDK's own class for the code: its users catch one root, PeerError.
                self._pending.settle(ErrorResponse(event.id, refused(event.error)))
            case Request():
                self._spawn(self._process(event))
            case Notification():
                pass

    def _spawn(self, coro: Coroutine[Any, Any, None]) -> None:
        task = asyncio.create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _process(self, request: Request) -> None:
        if not self._catch.delivering.is_set():
            await self._catch.delivering.wait()
        reply = await self._answer(request)
        self._session.respond(request, reply.to_result())
        if self._ws is not None:
            await self._flush(self._ws)

    async def _answer(self, request: Request) -> Reply:
        message = delivery(request)
        if isinstance(message, Reply):
            return message
        if self._catch.repeat(message.epoch):
            return Reply(True, "duplicate", "already handed over by the catch-up")
        self._catch.saw(message.epoch)
        return await self._handlers.hand(message)

    async def _flush(self, ws: Socket) -> None:
        for frame in self._session.data_to_send():
            try:
                await ws.send(frame, text=True)  # UTF-8 already: written as it is
            except ConnectionClosed:
                return

    def _fail_pending(self) -> None:
        self._pending.fail_all(self._closed)


def _closed(message: str, ws: Socket, cause: ConnectionClosed | None) -> PeerClosed:
    """The PeerClosed that calls on the closed ``ws`` fail with, chained to ``cause``."""
    # A clean close (1000, 1001) ends the iteration without raising; websockets still has the
    # exception it would have raised, which names both close frames.
    if cause is None and isinstance(ws, ClientConnection) and ws.state is State.CLOSED:
        cause = ws.protocol.close_exc
    closed = PeerClosed(message, code=ws.close_code, reason=getattr(ws, "close_reason", None) or "")
    closed.__cause__ = cause
    return closed
