"""One peer's WebSocket connection: the read loop and concurrent request handling.

:class:`Connection` wraps a :class:`bus.core.protocol.Session` around a websockets connection. A
request whose method never waits (``ping``, ``subscribe``...) is answered by the read loop itself,
through the :class:`QuickHandler`; every other request runs in its own task, so a peer may call
``sendMessage`` while it is still answering a ``processMessage`` the bus sent it, and neither
waits for the other. What a request means is the bus's business: the connection hands it to a
:class:`Handler`, and the errors answered to an :class:`ErrorHook` before the answer goes out.
What goes out to the peer (frames, the bus's own calls, closing) is
:class:`bus.transports.outgoing.Outgoing`'s, which :class:`Connection` inherits.

What one peer can make the bus hold is bounded here, whatever the peer does:

- requests: at most ``max_inflight_requests`` are handled at once; past that the read loop stops
  reading, so the socket's buffers fill and TCP slows the sender down (backpressure) instead of
  the bus queueing tasks without end;
- bytes: every request frame is charged to a :class:`ByteBudget` shared by the whole bus, in
  UTF-8 bytes (:func:`frame_bytes`: what the bus holds of the message it carries), until its
  last request is answered; a frame that does not fit is answered -32005 at once;
- frames: a binary frame closes the connection with 1003 (the wire is JSON text).
"""

from __future__ import annotations

import asyncio
import contextvars
import logging
from collections.abc import Awaitable, Callable, Coroutine
from typing import TYPE_CHECKING, Any, Protocol

from ..core.calls import PeerGone, PendingCalls
from ..core.errors import CLOSE_UNSUPPORTED_DATA, BusError, InternalError, LimitExceeded
from ..core.protocol import ErrorResponse, Notification, Request, Response, Session
from .intake import Intake
from .outgoing import Outgoing

if TYPE_CHECKING:
    from .local import Socket

__all__ = [
    "SLOW",
    "ByteBudget",
    "Connection",
    "ErrorHook",
    "Handler",
    "Link",
    "PeerGone",
    "QuickHandler",
    "charged_context",
    "frame_bytes",
    "hold_request_bytes",
]

logger = logging.getLogger("bus.transports.connection")


class Link(Protocol):
    """What the bus needs of a peer it delivers to: a :class:`Connection` (WebSocket or
    in-process), or a peer it reaches another way, such as a webhook
    (:mod:`bus.transports.webhooks`)."""

    inflight: asyncio.Semaphore | None
    """Bounds the ``processMessage`` calls awaiting this peer at once; None for no bound."""

    @property
    def name(self) -> str: ...

    @property
    def kind(self) -> str:
        """How the bus reaches the peer: ``websocket``, ``local``, ``webhook``, ``http``."""
        ...

    def write_buffer_size(self) -> int: ...

    async def call(self, method: str, params: Any) -> Any: ...

    def spawn(self, coro: Coroutine[Any, Any, None]) -> asyncio.Task[None]: ...

    async def close(self, code: int, reason: str) -> None: ...

    def __hash__(self) -> int: ...


Handler = Callable[["Connection", Request], Awaitable[Any]]
"""What the bus does with one request from one connection: returns the result or raises."""

INTAKE_SHARE = 4 << 20
"""Bytes of a :class:`ByteBudget` per socket that may be reading a large frame at once
(:mod:`bus.transports.intake`): frames of up to 1 MiB being read hold about a quarter of the
budget more, whatever the number of peers sending them."""

SLOW: Any = object()
"""What a :data:`QuickHandler` returns for a request it cannot answer without waiting."""

QuickHandler = Callable[["Connection", Request], Any]
"""Answers a request on the spot: returns its result, raises its :class:`BusError`, or returns
:data:`SLOW` so that the :data:`Handler` carries it out in a task. Saves a task per request."""

ErrorHook = Callable[["Connection", Request, BusError], Awaitable[None]]
"""Told of every error a request is answered with, before the answer is written (its row)."""


class ByteBudget:
    """Bytes of request frames being handled, for the whole bus, against a limit.

    Args:
        limit: the most bytes at once; None for no limit.
    """

    def __init__(self, limit: int | None) -> None:
        self.limit = limit
        self.used = 0
        self.intake = None if limit is None else Intake(limit // INTAKE_SHARE)
        """Bounds the large frames being read from sockets, before this budget sees them."""

    def take(self, size: int) -> bool:
        """Charge ``size`` bytes; return False (charging nothing) if they do not fit."""
        if self.limit is not None and self.used + size > self.limit:
            return False
        self.used += size
        return True

    def give(self, size: int) -> None:
        """Return ``size`` bytes charged by :meth:`take`."""
        self.used -= size


def frame_bytes(text: str) -> int:
    """The size of a text frame in UTF-8 bytes, as it came on the wire and as the bus holds
    the message it carries (encoded once): what :class:`ByteBudget` counts. Most frames are
    ASCII, where it is the length; any other is encoded to be measured."""
    return len(text) if text.isascii() else len(text.encode("utf-8", "surrogatepass"))


class _FrameCharge:
    """The bytes one frame holds in the budget until its last request is answered and the
    last work it left behind (:func:`hold_request_bytes`) is done."""

    __slots__ = ("budget", "requests", "size")

    def __init__(self, budget: ByteBudget, size: int, requests: int) -> None:
        self.budget, self.size, self.requests = budget, size, requests

    def done(self) -> None:
        self.requests -= 1
        if self.requests == 0:
            self.budget.give(self.size)


_charge: contextvars.ContextVar[_FrameCharge | None] = contextvars.ContextVar(
    "_charge", default=None
)
"""The charge of the request being handled, in its task (and the tasks it starts)."""


def hold_request_bytes() -> Callable[[], None] | None:
    """Keep the bytes of the request being handled charged to the bus's budget after it is
    answered, for work it leaves running that holds its message (a delivery the sender does
    not wait for); call the function returned when that work ends. None outside a request
    from a :class:`Connection`, or once its bytes went back (nothing is left to hold: taking
    the charge again would give the bytes back twice)."""
    charge = _charge.get()
    if charge is None or charge.requests <= 0:
        return None
    charge.requests += 1
    return charge.done


def charged_context(
    budget: ByteBudget, size: int
) -> tuple[contextvars.Context, Callable[[], None]]:
    """A context to run a request of ``size`` bytes, already taken from ``budget``, that came
    on no :class:`Connection` (HTTP): in it :func:`hold_request_bytes` finds them, so work the
    request leaves running keeps them charged. Call the function returned when the request is
    done; the bytes go back once that work has ended too."""
    charge = _FrameCharge(budget, size, 1)
    context = contextvars.copy_context()
    context.run(_charge.set, charge)
    return context, charge.done


class Connection(Outgoing):
    """The bus side of one peer connection: reads and answers its requests; what it writes to
    the peer, its own calls included, is :class:`Outgoing`'s.

    Args:
        ws: the accepted websockets connection, or the bus's end of a :mod:`bus.transports.local`
        link. handler: called for every request; its return value is the result, a raised
            :class:`BusError` the error answer.
        max_inflight: most ``processMessage`` calls awaiting this peer at once; None for no limit.
        max_requests: most requests from this peer handled at once; past it the read loop
            waits. None for no limit.
        budget: the bus-wide bytes in flight; None for no limit.
        on_protocol_error: told of every error the session answered on its own (parse errors,
            invalid requests, frames over the byte budget), so that the bus can log them.
        on_frame_refused: told why, before the connection closes itself over a frame it does
            not take (``binary``).
    """

    def __init__(
        self,
        ws: Socket,
        handler: Handler,
        *,
        quick: QuickHandler | None = None,
        on_error: ErrorHook | None = None,
        max_inflight: int | None = None,
        max_requests: int | None = None,
        budget: ByteBudget | None = None,
        on_protocol_error: Callable[[Connection, BusError], None] | None = None,
        on_frame_refused: Callable[[Connection, str], None] | None = None,
    ) -> None:
        self.ws = ws
        self.session = Session()
        self._handler = handler
        self._quick = quick
        self._on_error = on_error
        self._on_protocol_error = on_protocol_error
        self._on_frame_refused = on_frame_refused
        self.client_id: str | None = None
        """The clientId this connection authenticated as (:meth:`authenticated`); None before.
        What it may do and what it subscribes to are the bus's business (:mod:`bus.core.router`)."""
        # The three Events are made when first waited on and let go once they have served:
        # each holds a deque of about 0.7 KiB, most of an idle peer's share of the bus.
        self._initialized: asyncio.Event | None = None
        self.inflight = asyncio.Semaphore(max_inflight) if max_inflight else None
        self._close_after: tuple[int, str] | None = None
        self._pending = PendingCalls()
        self._tasks: set[asyncio.Task[None]] = set()
        self._gone = False
        self._ended = False
        self._closed: asyncio.Event | None = None
        self._max_requests = max_requests
        self._budget = budget
        self._requests = 0
        self._request_done: asyncio.Event | None = None
        self._request_tasks: set[asyncio.Task[None]] = set()
        self._abandon_with: BusError | None = None
        intake = budget.intake if budget is not None else None
        self._reader = intake.watch(ws, anonymous=True) if intake is not None else None

    @property
    def kind(self) -> str:
        """``local`` for an in-process link (:mod:`bus.transports.local`), else ``websocket``."""
        return str(getattr(self.ws, "kind", "websocket"))

    @property
    def initialized(self) -> asyncio.Event:
        """Set once the peer authenticated (:meth:`authenticated`): ``await
        conn.initialized.wait()``. Made on first use and let go once set, so that an idle peer
        holds no Event."""
        event = self._initialized
        if event is None:
            event = asyncio.Event()
            if self.client_id is not None:
                event.set()
            else:
                self._initialized = event
        return event

    @property
    def name(self) -> str:
        """The clientId once known, else the remote address, for logs."""
        return self.client_id or f"{self.ws.remote_address}"

    # Reading

    async def run(self) -> None:
        """Read frames until the peer goes; then fail the calls still waiting for an answer."""
        try:
            async for text in self.ws:
                if isinstance(text, bytes):
                    # The wire is UTF-8 JSON in text frames; decoding binary frames as well
                    # would accept encodings (UTF-16) that no other peer could read back.
                    if self._on_frame_refused is not None:
                        self._on_frame_refused(self, "binary")
                    await self.ws.close(CLOSE_UNSUPPORTED_DATA, "binary frames are not supported")
                    return
                self.session.receive_text(text)
                size = frame_bytes(text)
                del text  # parsed: hold no copy of it while its requests are handled
                if self._reader is not None:
                    self._reader.taken(size)
                self._dispatch(size)
                if self._on_protocol_error is not None:
                    for error in self.session.errors_sent():
                        self._on_protocol_error(self, error)
                await self.flush()
                if self._max_requests is not None and self._requests >= self._max_requests:
                    await self._backpressure(self._max_requests)
        finally:
            self._gone = True
            if self._reader is not None:
                self._reader.close()
            self._pending.fail_all(PeerGone(self.name))
            self._ended = True
            if self._closed is not None:
                self._closed.set()

    async def _backpressure(self, most: int) -> None:
        """Read nothing more until fewer than ``most`` requests are being handled. The intake's
        read deadline for this socket stops meanwhile: the bus is the one not reading."""
        reader = self._reader
        if reader is not None:
            reader.bus_waits(True)
        try:
            while self._requests >= most:
                await self._request_answered()
        finally:
            if reader is not None:
                reader.bus_waits(False)

    async def wait_closed(self) -> None:
        """Return once the read loop has ended: the peer is gone or was disconnected."""
        if self._ended:
            return
        if self._closed is None:
            self._closed = asyncio.Event()
        await self._closed.wait()

    async def _request_answered(self) -> None:
        """Wait until the next request of this peer is answered."""
        if self._request_done is None:
            self._request_done = asyncio.Event()
        self._request_done.clear()
        await self._request_done.wait()

    def _dispatch(self, size: int) -> None:
        events = self.session.events_received()
        requests = [event for event in events if isinstance(event, Request)]
        charge = None
        if requests and self._budget is not None:
            if not self._budget.take(size):
                for request in requests:
                    self.session.refuse(
                        request,
                        LimitExceeded(
                            "Limit exceeded: the bus is handling too many bytes of requests "
                            "(max_inflight_bytes); retry later"
                        ),
                    )
                requests = []
            else:
                charge = _FrameCharge(self._budget, size, len(requests))
        for event in events:
            match event:
                case Request():
                    if requests:
                        self._start(event, charge)
                case Response() | ErrorResponse():
                    self._pending.settle(event)
                case Notification(method=method):
                    # JSON-RPC 2.0 §4.1: a notification is never answered, even with an error.
                    logger.debug("%s: ignored notification %s", self.name, method)

    def _start(self, request: Request, charge: _FrameCharge | None) -> None:
        """Answer ``request`` now if the quick handler can; else carry it out in a task."""
        failed: BusError | None = None
        if self._quick is not None:
            try:
                result = self._quick(self, request)
            except BusError as exc:
                failed = exc  # its row is committed before the answer: that waits, in a task
            except Exception:
                logger.exception("%s: internal error in %s", self.name, request.method)
                failed = InternalError()  # no details: they may be security-sensitive
            if failed is None and result is not SLOW:
                self.session.respond(request, result)
                if charge is not None:
                    charge.done()
                return
        self._requests += 1
        task = self.spawn(self._answer(request, charge, failed))
        self._request_tasks.add(task)
        task.add_done_callback(self._request_tasks.discard)

    async def _answer(
        self, request: Request, charge: _FrameCharge | None, failed: BusError | None = None
    ) -> None:
        _charge.set(charge)  # this task's own context: hold_request_bytes() finds it
        try:
            try:
                if failed is not None:
                    raise failed
                result = await self._handler(self, request)
            except asyncio.CancelledError:
                if self._abandon_with is None:
                    raise
                # abandon_requests(): the bus is closing; the peer still gets an answer.
                self.session.respond_error(request, self._abandon_with)
            except BusError as exc:
                self.session.respond_error(request, await self._error_told(request, exc))
            except Exception:
                # Don't include exception details, which may be security-sensitive.
                logger.exception("%s: internal error in %s", self.name, request.method)
                self.session.respond_error(request, InternalError())
            else:
                self.session.respond(request, result)
            await self.flush()
        finally:
            self._requests -= 1
            if self._request_done is not None:
                self._request_done.set()
            if charge is not None:
                charge.done()
        if self._close_after is not None:
            await self.ws.close(*self._close_after)

    async def _error_told(self, request: Request, error: BusError) -> BusError:
        """Tell the :data:`ErrorHook` of ``error`` (its row); return what to answer: ``error``,
        or the one of :meth:`abandon_requests` if the bus stopped waiting for the row."""
        if self._on_error is None:
            return error
        try:
            await self._on_error(self, request, error)
        except asyncio.CancelledError:
            if self._abandon_with is None:
                raise
            return self._abandon_with  # the bus is closing: the peer still gets an answer
        return error

    def authenticated(self, client_id: str) -> None:
        """Record that the peer proved it is ``client_id``; wakes :attr:`initialized`."""
        self.client_id = client_id
        if self._initialized is not None:
            self._initialized.set()  # its waiters are woken; the Event itself is not needed
            self._initialized = None
        if self._reader is not None:
            self._reader.trust()  # it may read large frames now

    def close_after_answer(self, code: int, reason: str) -> None:
        """Close with ``code`` once the request being handled has its answer written."""
        self._close_after = (code, reason)

    @property
    def closing_after_answer(self) -> bool:
        """Whether :meth:`close_after_answer` was called."""
        return self._close_after is not None

    @property
    def requests_in_flight(self) -> int:
        """Requests from this peer being handled now."""
        return self._requests

    def abandon_requests(self, error: BusError) -> None:
        """Stop handling this peer's requests in flight and answer each with ``error``."""
        self._abandon_with = error
        for task in self._request_tasks:
            task.cancel()

    async def wait_requests_answered(self) -> None:
        """Return once no request of this peer is being handled."""
        while self._requests:
            await self._request_answered()

    # Tasks

    def spawn(self, coro: Coroutine[Any, Any, None]) -> asyncio.Task[None]:
        """Run ``coro`` as a task this connection owns and awaits when it closes."""
        task = asyncio.get_running_loop().create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task

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
