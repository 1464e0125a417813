"""The WebSocket side of the bus: the listening socket, one :class:`Connection` per peer, and
what the bus bounds for sockets alone.

:class:`WebSocketDoor` accepts sockets (and in-process links, :mod:`bus.transports.local`),
turns each into a :class:`Connection`, and feeds its requests to the bus through
:class:`SocketBus`: ``initialize`` joins the peer, any other method goes to the bus's method
table. What only sockets have is decided here with :mod:`bus.core.watch` and
:mod:`bus.core.strangers`: sockets that never initialize (admitted and counted per address by
:class:`~bus.transports.lobby.Lobby`, closed after ``initialize_timeout``, their errors counted
instead of logged), frames too large, and slow consumers (closed with 4004). The bus
(:class:`bus.server.Bus`) owns one door and closes it first when it shuts down::

    door = WebSocketDoor(bus)
    await door.start("127.0.0.1", 0, ssl=None)
    ...
    door.stop_accepting(); await door.wait_requests_answered(grace); await door.close()
"""

from __future__ import annotations

import asyncio
import logging
import ssl as _ssl
from collections.abc import Awaitable, Callable, Coroutine
from http import HTTPStatus
from typing import Any, Protocol

from websockets.asyncio.server import Server, ServerConnection, serve
from websockets.exceptions import ConnectionClosed
from websockets.http11 import Request as HTTPRequest, Response as HTTPResponse
from websockets.protocol import State

from ..core import joins, strangers
from ..core.actions import Action, Record
from ..core.errors import (
    CLOSE_FRAME_TIMEOUT,
    CLOSE_GOING_AWAY,
    CLOSE_INITIALIZE_TIMEOUT,
    CLOSE_TRY_AGAIN_LATER,
    AlreadyInitialized,
    BusError,
    NotInitialized,
    ShuttingDown,
)
from ..core.logevents import LogEvent
from ..core.protocol import Request
from ..core.requests import LinkFacts
from ..core.router import Route
from ..core.state import PeerStates
from ..core.watch import SlowConsumers, disconnect_slow
from ..ops.config import Limits
from ..ops.credentials import Credentials
from ..ops.refusals import Refusals
from . import keepalive
from .connection import SLOW, ByteBudget, Connection, Link
from .lobby import Lobby, address_of, bearer_of
from .local import LocalSocket, local_pair

__all__ = [
    "Method",
    "QuickMethod",
    "SocketBus",
    "WebSocketDoor",
    "address_of",
    "bearer_of",
    "link_facts",
]

logger = logging.getLogger("bus.transports.websocket")

Method = Callable[[Route[Link], Request], Awaitable[Any]]
"""One JSON-RPC method of an initialized peer, as the bus carries it out."""

QuickMethod = Callable[[Route[Link], Request], Any]
"""A method that never waits (``ping``, ``subscribe``...): returns its result or raises."""


class SocketBus(Protocol):
    """The bus as its WebSocket door sees it (:class:`bus.server.Bus` implements it)."""

    limits: Limits
    credentials: Credentials
    refusals: Refusals

    @property
    def closing(self) -> bool: ...

    @property
    def states(self) -> PeerStates[Link]: ...

    @property
    def byte_budget(self) -> ByteBudget: ...

    def route_of(self, link: Link) -> Route[Link] | None: ...

    def method(self, name: str) -> Method:
        """The method called ``name``; raises MethodNotFound."""
        ...

    def quick_method(self, name: str) -> QuickMethod | None:
        """The method called ``name`` if it never waits, else None."""
        ...

    async def join(
        self, link: Link, request: Request, *, address: str, remote: str, bearer: str | None
    ) -> tuple[str, Any]:
        """Carry out ``initialize`` for ``link``: its clientId and the result, or raise."""
        ...

    def leave(self, link: Link, reason: str) -> None: ...

    def carry(self, actions: list[Action]) -> Any: ...

    async def record_error(self, actor: str, request: Request, exc: BusError) -> None: ...


class WebSocketDoor:
    """Where peers come in over WebSocket (or in process) and stay until they leave.

    Args:
        bus: what the door hands requests, joins and leaves to.
    """

    def __init__(self, bus: SocketBus) -> None:
        self._bus = bus
        limits = bus.limits
        self.connections: set[Connection] = set()
        """Every open connection, initialized or not."""
        self.lobby = Lobby(bus)
        """The sockets that have not initialized: the anonymous caps, decided at handshakes."""
        timeout = limits.slow_consumer_timeout
        self._slow: SlowConsumers[Connection] | None = (
            None if timeout is None else SlowConsumers(timeout)
        )
        intake = bus.byte_budget.intake
        if intake is not None:
            intake.read_timeout = limits.frame_read_timeout
            intake.refused = self._intake_refused
        self._opening: set[Any] = set()
        """Sockets accepted whose handshake has not ended: :meth:`close` drops them."""
        self._server: Server | None = None
        self._scheme = "ws"
        self._sweeper: asyncio.Task[None] | None = None
        self._keepalive: asyncio.Task[None] | None = None
        self._local_links: set[asyncio.Task[None]] = set()

    async def start(self, host: str, port: int, *, ssl: _ssl.SSLContext | None) -> None:
        """Listen on ``host:port`` (0 picks a free port); with ``ssl``, serve ``wss://``."""
        limits = self._bus.limits
        self._scheme = "wss" if ssl is not None else "ws"
        self._server = await serve(
            self._handle_connection,
            host,
            port,
            process_request=self._process_request,
            process_response=self._process_response,
            create_connection=_tracked(self._opening),
            max_size=limits.max_frame_bytes,
            open_timeout=limits.handshake_timeout,
            compression=None,
            ssl=ssl,
            ping_interval=None,  # one keepalive for the door, not a task a socket
        )
        if self._slow is not None:
            self._sweeper = asyncio.create_task(self._sweep_slow_consumers())
        pinging = keepalive.keep_alive(self.connections, keepalive.PING_INTERVAL)
        self._keepalive = asyncio.create_task(pinging)

    @property
    def url(self) -> str:
        """``ws://host:port`` of the listening socket (``wss://`` with TLS)."""
        if self._server is None:
            raise RuntimeError("the bus is not started")
        host, port = next(iter(self._server.sockets)).getsockname()[:2]
        return f"{self._scheme}://{host}:{port}"

    @property
    def address(self) -> tuple[str, int]:
        """The host and port the bus listens on."""
        if self._server is None:
            raise RuntimeError("the bus is not started")
        host, port = next(iter(self._server.sockets)).getsockname()[:2]
        return str(host), int(port)

    async def connect_local(self) -> LocalSocket:
        """Open an in-process link to the bus and return the peer's end.

        Pass this method (the bus's ``connect_local``) as ``Peer(...,
        connector=bus.connect_local)``: the peer then initializes, is authorized and logged as
        over a WebSocket, without a socket (see :mod:`bus.transports.local`). The bus closes
        the link with 1001 when it shuts down.

        Raises:
            ShuttingDown: the bus is closing.
        """
        if self._bus.closing:
            raise ShuttingDown()
        bus_end, peer_end = local_pair()
        link = asyncio.get_running_loop().create_task(self._handle_connection(bus_end))
        self._local_links.add(link)
        link.add_done_callback(self._local_links.discard)
        return peer_end

    # Shutting down, in the order the bus calls these

    def stop_accepting(self) -> None:
        """Accept no new socket; keep reading the open ones (their requests need answers)."""
        if self._server is not None:
            self._server.close(close_connections=False)

    async def wait_requests_answered(self, grace: float | None) -> None:
        """Wait up to ``grace`` seconds for every request in flight to be answered; then answer
        what is left -32007 and wait for those answers to go out."""
        busy = [conn for conn in self.connections if conn.requests_in_flight]
        if not busy:
            return
        _, pending = await asyncio.wait(
            [asyncio.ensure_future(conn.wait_requests_answered()) for conn in busy],
            timeout=grace,
        )
        for waiter in pending:
            waiter.cancel()
        if not pending:
            return
        await asyncio.wait(pending)
        logger.warning("closing with requests unanswered after %ss: answering -32007", grace)
        late = ShuttingDown(
            "The bus shut down before this request was answered; it may have been carried out"
        )
        for conn in busy:
            conn.abandon_requests(late)
        await asyncio.wait([asyncio.ensure_future(conn.wait_requests_answered()) for conn in busy])

    async def close(self) -> None:
        """Drop the sockets still in their handshake, close every connection (1001) and wait
        for their handlers and the listener."""
        self._drop_handshakes()
        for conn in list(self.connections):
            conn.spawn(conn.close(CLOSE_GOING_AWAY, "bus shutting down"))
        if self._server is not None:
            await self._server.wait_closed()
        if self._local_links:
            await asyncio.wait(set(self._local_links))
        for task in (self._sweeper, self._keepalive):
            if task is not None:
                task.cancel()
                try:
                    await task
                except asyncio.CancelledError:
                    pass

    def _drop_handshakes(self) -> None:
        # Their handshake would otherwise run on to handshake_timeout, and the listener's close
        # wait for it (or, past the loop's end, leave their transports to the collector).
        for ws in list(self._opening):
            if ws.protocol.state is State.CONNECTING:
                ws.transport.abort()

    # One socket

    def _process_request(self, ws: ServerConnection, request: HTTPRequest) -> HTTPResponse | None:
        if request.path == "/healthz":
            return ws.respond(HTTPStatus.OK, "ok\n")
        bus = self._bus
        if bus.closing:
            return ws.respond(HTTPStatus.SERVICE_UNAVAILABLE, "shutting down\n")
        if self.lobby.admit(ws):
            # The handshake can still fail after this (the peer leaves, the bus starts closing):
            # then no handler runs, and the place admit() counted goes back once it is gone.
            ws.connection_lost_waiter.add_done_callback(lambda _: self.lobby.unclaimed(ws))
            return None
        return ws.respond(
            HTTPStatus.SERVICE_UNAVAILABLE, "too many connections that have not initialized\n"
        )

    def _process_response(
        self, ws: ServerConnection, request: HTTPRequest, response: HTTPResponse
    ) -> None:
        if response.status_code != HTTPStatus.SWITCHING_PROTOCOLS:
            self.lobby.unclaimed(ws)  # refused after admission (an invalid upgrade): no handler

    async def _handle_connection(self, ws: ServerConnection | LocalSocket) -> None:
        bus, limits = self._bus, self._bus.limits
        conn = Connection(
            ws,
            self._handle_request,
            quick=self._quick_request,
            on_error=self._request_failed,
            max_inflight=limits.max_inflight_deliveries,
            max_requests=limits.max_inflight_requests,
            budget=bus.byte_budget,
            on_protocol_error=self._protocol_error,
            on_frame_refused=self._frame_refused,
        )
        self.connections.add(conn)
        bus.states.open(conn)
        address = address_of(ws)
        self.lobby.entered(conn, ws)
        _let_go_of_handshake(ws)
        watchdog = self._watch_initialize(conn)
        try:
            await conn.run()
        except ConnectionClosed as exc:
            if exc.sent is not None and exc.sent.code == 1009:
                limit = f"limit {limits.max_frame_bytes}"
                event = LogEvent.FRAME_TOO_LARGE
                bus.carry(strangers.frame_refused(event, conn.client_id, address, error=limit))
        finally:
            if watchdog is not None:
                watchdog.cancel()
            self.lobby.left(conn, address)
            self.connections.discard(conn)
            if self._slow is not None:
                self._slow.forget(conn)
            bus.leave(conn, str(conn.ws.close_code))
            await conn.drain_tasks()

    def _watch_initialize(self, conn: Connection) -> asyncio.TimerHandle | None:
        """Close ``conn`` if it has not initialized within ``initialize_timeout``: a timer
        rather than a task, so that a peer that initialized keeps nothing of it."""
        timeout = self._bus.limits.initialize_timeout
        if timeout is None:
            return None
        return asyncio.get_running_loop().call_later(timeout, self._initialize_expired, conn)

    def _initialize_expired(self, conn: Connection) -> None:
        if conn.client_id is not None:
            return
        self._bus.refusals.count("initialize_timeout", address_of(conn.ws))
        conn.spawn(conn.close(CLOSE_INITIALIZE_TIMEOUT, "initialize timeout"))

    # Its requests

    def _quick_request(self, conn: Connection, request: Request) -> Any:
        # Answered by the read loop, without a task: what an initialized peer asks of a method
        # that never waits. Everything else (and every refusal's row) goes to _handle_request.
        bus = self._bus
        if bus.closing or conn.client_id is None:
            return SLOW
        method = bus.quick_method(request.method)
        route = bus.route_of(conn)
        if method is None or route is None:
            return SLOW
        return method(route, request)

    async def _handle_request(self, conn: Connection, request: Request) -> Any:
        bus = self._bus
        if bus.closing:
            raise ShuttingDown()
        if request.method == "initialize":
            return await self._initialize(conn, request)
        route = bus.route_of(conn)
        if route is None:
            raise NotInitialized()
        return await bus.method(request.method)(route, request)

    async def _request_failed(self, conn: Connection, request: Request, exc: BusError) -> None:
        if conn.client_id is None and not conn.closing_after_answer:
            self._anonymous_error(conn, closing=False)  # anonymous: counted, no row each
        elif not isinstance(exc, joins.WrongToken):  # counted into ws_refused instead
            await self._bus.record_error(conn.name, request, exc)

    async def _initialize(self, conn: Connection, request: Request) -> Any:
        if conn.client_id is not None:
            raise AlreadyInitialized()
        ws, bearer = conn.ws, self.lobby.bearer(conn)
        address = address_of(ws)
        client_id, result = await self._bus.join(
            conn, request, address=address, remote=str(ws.remote_address), bearer=bearer
        )
        self.lobby.left(conn, address)
        conn.authenticated(client_id)
        return result

    def _protocol_error(self, conn: Connection, error: BusError) -> None:
        if conn.client_id is None:
            self._anonymous_error(conn, closing=conn.closing_after_answer)
        else:
            row = Record(
                LogEvent.RPC_ERROR, actor=conn.name, status=str(error.code), error=error.message
            )
            self._bus.carry([row])

    def _frame_refused(self, conn: Connection, reason: str) -> None:
        event, address = LogEvent.FRAME_REFUSED, address_of(conn.ws)
        self._bus.carry(strangers.frame_refused(event, conn.client_id, address, status=reason))

    def _intake_refused(self, ws: Any, reason: str) -> None:
        """The intake stopped reading ``ws`` for good (see :attr:`Intake.refused`): close it,
        with a row (a peer) or a count (anonymous)."""
        conn = next((conn for conn in self.connections if conn.ws is ws), None)
        if conn is None:
            return
        limits = self._bus.limits
        if reason == "read_timeout":
            code, error = CLOSE_FRAME_TIMEOUT, f"frame_read_timeout {limits.frame_read_timeout}s"
            why = "frame read timeout: a large frame stopped coming"
        else:
            code, error = CLOSE_TRY_AGAIN_LATER, "sockets not initialized hold too many bytes"
            why = "try again later: initialize before sending large frames"
        event, address = LogEvent.FRAME_REFUSED, address_of(ws)
        rows = strangers.frame_refused(event, conn.client_id, address, status=reason, error=error)
        self._bus.carry(rows)
        conn.spawn(conn.force_close(code, why))

    def _anonymous_error(self, conn: Connection, *, closing: bool) -> None:
        state = self._bus.states.get(conn)
        address = address_of(conn.ws)
        self._bus.carry(strangers.error_answered(state, conn, address, closing=closing))

    # Slow consumers

    def _sweep_slow_consumers(self) -> Coroutine[Any, Any, None]:
        """The task that disconnects this door's slow consumers (:func:`_sweep`)."""
        assert self._slow is not None
        return _sweep(self.connections, self._slow, self._bus.carry)


async def _sweep(
    connections: set[Connection],
    slow: SlowConsumers[Connection],
    carry: Callable[[list[Action]], Any],
) -> None:
    """Disconnect (4004) every peer of ``connections`` the bus has not been able to write to
    for ``slow_consumer_timeout`` seconds, as NATS's write deadline does; runs until cancelled.

    "Not able to write" means the socket's unread bytes stayed above its low water mark
    (:meth:`Connection.write_blocked`) at every check. The WebSocket keepalive cannot catch
    such a peer: its ping waits behind the unread bytes, so its timeout never starts. One
    task checks every socket, which costs well under a microsecond each.
    """
    interval = min(1.0, slow.timeout / 4)
    loop = asyncio.get_running_loop()
    while True:
        await asyncio.sleep(interval)
        states = [(conn, conn.write_blocked()) for conn in connections]
        for conn in slow.check(states, loop.time()):
            unread = conn.write_buffer_size()
            carry(disconnect_slow(conn, conn.name, unread, slow.timeout))


def _let_go_of_handshake(ws: Any) -> None:
    """Drop ``ws``'s handshake headers (some 4 KiB a socket, kept by websockets for the socket's
    life): the door read what it needs of them (the token is in :meth:`Lobby.bearer`; the
    address comes from the transport). websockets reads them only during the handshake."""
    if isinstance(ws, ServerConnection):
        # Emptied, not replaced: websockets' parser keeps the request object to the end, and
        # reads a None ``ws.request`` as a handshake still to come.
        if ws.request is not None:
            ws.request.headers.clear()
        ws.response = None
    elif getattr(ws, "request", None) is not None:
        ws.request = None  # a picows socket: only the door reads it


class _Tracked(ServerConnection):
    """A websockets connection its door holds from its first byte (see :func:`_tracked`)."""

    opening: set[Any]

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        super().connection_made(transport)
        self.opening.add(self)

    def connection_lost(self, exc: Exception | None) -> None:
        self.opening.discard(self)
        super().connection_lost(exc)


def _tracked(opening: set[Any]) -> type[ServerConnection]:
    """The connection class to give ``serve(create_connection=...)`` so that every socket
    accepted is in ``opening`` until it is gone: websockets itself lists a connection only
    once its handshake is done, so a closing bus could not drop the ones still in it."""
    return type("TrackedConnection", (_Tracked,), {"opening": opening, "__module__": __name__})


def link_facts(link: Link) -> LinkFacts:
    """A link's address and load for ``listPeers``: a peer the bus reaches another way than a
    connection (a webhook) shows its link's name and nothing in flight."""
    if isinstance(link, Connection):
        return LinkFacts(address_of(link.ws), link.requests_in_flight, link.deliveries_in_flight)
    return LinkFacts(link.name)
