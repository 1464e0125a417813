"""One peer's WebSocket connection: the read loop, concurrent request handling, outgoing calls.

:class:`Connection` wraps a :class:`bus.protocol.Session` around a websockets connection. Each
incoming request runs in its own task, so a peer may call ``sendMessage`` while it is still
answering a ``processMessage`` the bus sent it, and neither waits for the other. What a request
means is the bus's business: the connection hands it to a :class:`Handler`.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Coroutine
from typing import TYPE_CHECKING, Any

from websockets.exceptions import ConnectionClosed

from .calls import PendingCalls
from .errors import BusError, InternalError
from .protocol import ErrorResponse, Notification, Request, Response, Session

if TYPE_CHECKING:
    from .local import Socket
    from .policy import Grants

__all__ = ["Connection", "Handler", "PeerGone"]

logger = logging.getLogger("bus.connection")


class PeerGone(ConnectionError):
    """The peer disconnected before it answered a call the bus made."""


Handler = Callable[["Connection", Request], Awaitable[Any]]
"""What the bus does with one request from one connection: returns the result or raises."""


class Connection:
    """The bus side of one peer connection.

    Args:
        ws: the accepted websockets connection, or the bus's end of a :mod:`bus.local` link.
        handler: called for every request; its return value is the result, a raised
            :class:`BusError` the error answer.
        max_inflight: most ``processMessage`` calls awaiting this peer at once; None for no limit.
        on_protocol_error: told of every error the session answered on its own (parse errors,
            invalid requests), so that the bus can log them.
    """

    def __init__(
        self,
        ws: Socket,
        handler: Handler,
        *,
        max_inflight: int | None = None,
        on_protocol_error: Callable[[Connection, BusError], None] | None = None,
    ) -> None:
        self.ws = ws
        self.session = Session()
        self._handler = handler
        self._on_protocol_error = on_protocol_error
        self.client_id: str | None = None
        """Set by a successful ``initialize``; None before."""
        self.grants: Grants | None = None
        """What the policy lets this peer do; set with ``client_id``."""
        self.subscriptions: set[str] = set()
        self.replaced = False
        """True once another connection took over this clientId."""
        self.initialized = asyncio.Event()
        self.inflight = asyncio.Semaphore(max_inflight) if max_inflight else None
        self.close_after_answer: tuple[int, str] | None = None
        self.anonymous_errors = 0
        """Error answers sent before a successful ``initialize``."""
        self._pending = PendingCalls()
        self._tasks: set[asyncio.Task[None]] = set()
        self._gone = False

    @property
    def name(self) -> str:
        """The clientId once known, else the remote address, for logs."""
        return self.client_id or f"{self.ws.remote_address}"

    # Reading

    async def run(self) -> None:
        """Read frames until the peer goes; then fail the calls still waiting for an answer."""
        try:
            async for text in self.ws:
                self.session.receive_text(text)
                if self._on_protocol_error is not None:
                    for error in self.session.errors_sent():
                        self._on_protocol_error(self, error)
                self._dispatch()
                await self.flush()
        finally:
            self._gone = True
            self._pending.fail_all(PeerGone(self.name))

    def _dispatch(self) -> None:
        for event in self.session.events_received():
            match event:
                case Request():
                    self.spawn(self._answer(event))
                case Response() | ErrorResponse():
                    self._pending.settle(event)
                case Notification(method=method):
                    # JSON-RPC 2.0 §4.1: a notification is never answered, even with an error.
                    logger.debug("%s: ignored notification %s", self.name, method)

    async def _answer(self, request: Request) -> None:
        try:
            result = await self._handler(self, request)
        except BusError as exc:
            self.session.respond_error(request, exc)
        except Exception:
            # Don't include exception details, which may be security-sensitive.
            logger.exception("%s: internal error in %s", self.name, request.method)
            self.session.respond_error(request, InternalError())
        else:
            self.session.respond(request, result)
        await self.flush()
        if self.close_after_answer is not None:
            code, reason = self.close_after_answer
            await self.ws.close(code, reason)

    # Writing

    async def flush(self) -> None:
        """Write every frame the session has queued; a closed socket drops them quietly."""
        for text in self.session.data_to_send():
            try:
                await self.ws.send(text)
            except ConnectionClosed:
                return

    async def call(self, method: str, params: Any) -> Any:
        """Send a request to the peer and return its result.

        Put an ``asyncio.timeout()`` around the call: this waits as long as the peer takes.

        Raises:
            PeerGone: the connection closed first.
            BusError: the peer answered with an error.
        """
        if self._gone:
            raise PeerGone(self.name)
        request_id = self.session.send_request(method, params)
        future = self._pending.expect(request_id)
        try:
            await self.flush()
            return await future
        finally:
            self._pending.forget(request_id)

    # Tasks

    def spawn(self, coro: Coroutine[Any, Any, None]) -> None:
        """Run ``coro`` as a task this connection owns and awaits when it closes."""
        task = asyncio.get_running_loop().create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def drain_tasks(self, grace: float = 5.0) -> None:
        """Wait for the request tasks still running, then cancel what is left."""
        if not self._tasks:
            return
        tasks = set(self._tasks)
        _done, pending = await asyncio.wait(tasks, timeout=grace)
        for task in pending:
            task.cancel()
        if pending:
            await asyncio.wait(pending)

    async def close(self, code: int, reason: str) -> None:
        """Close the socket with ``code``; the read loop then ends."""
        await self.ws.close(code, reason)
