"""The bus: a websockets server that authenticates peers, authorizes and routes their messages.

:class:`Bus` is the asyncio shell around the pure parts: :mod:`bus.core.protocol` parses frames,
:mod:`bus.core.topics` finds subscribers, :mod:`bus.core.policy` decides, :mod:`bus.log.activity`
records. Use it as an async context manager::

    async with ActivityLog("bcpbus.db") as log:
        async with Bus(policy=Policy.default(), credentials=creds, log=log) as bus:
            await bus.start("127.0.0.1", 0)
            print(bus.url)
            await stop.wait()
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import secrets
import sqlite3
import ssl as _ssl
from collections.abc import Callable, Coroutine, Iterable, Mapping
from dataclasses import dataclass, field
from http import HTTPStatus
from typing import Any

from websockets.asyncio.server import Server, ServerConnection, serve
from websockets.exceptions import ConnectionClosed
from websockets.http11 import Request as HTTPRequest, Response as HTTPResponse

from schemas.bus import (
    FetchMessagesParams,
    InitializeParams,
    ListPeersResult,
    PeerJoined,
    PeerLeft,
    SubscribeParams,
    UnsubscribeParams,
)
from schemas.common import timestamp

from . import __version__
from .core import _json
from .core.digest import canonical_sha256
from .core.epochs import Epochs
from .core.errors import (
    CLOSE_AUTH_FAILED,
    CLOSE_GOING_AWAY,
    CLOSE_INITIALIZE_TIMEOUT,
    CLOSE_POLICY_VIOLATION,
    CLOSE_REPLACED,
    CLOSE_REVOKED,
    CLOSE_SLOW_CONSUMER,
    CLOSE_TRY_AGAIN_LATER,
    AlreadyInitialized,
    AuditUnavailable,
    AuthenticationFailed,
    BusError,
    ContentNotKept,
    DuplicateMessage,
    Forbidden,
    LimitExceeded,
    MethodNotFound,
    NotInitialized,
    ShuttingDown,
    SubscriptionNotFound,
)
from .core.identities import PeerIdentity
from .core.logevents import LogEvent
from .core.params import SendFields, parse, read_send_message
from .core.policy import RAW_TEXT_TYPES, Grants, Policy, PolicyError, may_flow
from .core.presence import BUS_CLIENT_ID, PRESENCE_TOPIC, Presence
from .core.protocol import Request
from .core.pushes import PLAIN, Debounce, PushOptions, push_window
from .core.recent import RecentIds
from .core.router import Route, Router
from .core.topics import validate_pattern, validate_topic
from .core.watch import Anonymous, SlowConsumers
from .log.activity import ActivityLog
from .log.fetch import FetchFilter, FetchResult, Page, check_since, sender_mark
from .log.history import History
from .ops.config import Limits, LogContent
from .ops.credentials import Credentials, PeerRecord
from .ops.refusals import Refusals
from .ops.rights import Regrant, Revoke, review
from .transports.connection import ByteBudget, Connection, Link, PeerGone
from .transports.local import LocalSocket, Socket, local_pair

__all__ = ["BUS_CLIENT_ID", "PRESENCE_TOPIC", "Bus", "PeerIdentity"]

logger = logging.getLogger("bus.server")

MAX_ANONYMOUS_ERRORS = 10
"""Error answers a connection may get before a successful ``initialize``; then close 1008."""


class Bus:
    """A running JSON-RPC message bus.

    Args:
        policy: the authorization policy in force on every request.
        credentials: the token hashes peers authenticate against.
        log: the activity log; the caller opens and closes it.
        identities: roles and taint per clientId from agent definitions.
        limits: the configurable limits.
        server_id: the ``serverId`` sent in ``initialize`` results; random by default.
        log_content: what ``send_start`` keeps of each envelope: ``full``, or ``digest`` (its
            ``type`` and the SHA-256 of its canonical JSON).
    """

    def __init__(
        self,
        *,
        policy: Policy,
        credentials: Credentials,
        log: ActivityLog,
        identities: Mapping[str, PeerIdentity] | None = None,
        limits: Limits | None = None,
        server_id: str | None = None,
        log_content: LogContent = "full",
    ) -> None:
        self.policy = policy
        self.credentials = credentials
        self.log = log
        self.identities = dict(identities or {})
        self.limits = limits or Limits()
        self.server_id = server_id or f"bus-{secrets.token_hex(4)}"
        if log_content not in ("full", "digest"):
            raise ValueError(f"log_content must be 'full' or 'digest', not {log_content!r}")
        self.log_content: LogContent = log_content
        self._connections: set[Connection] = set()
        self._anonymous = Anonymous(
            total=self.limits.max_anonymous_connections,
            per_address=self.limits.max_anonymous_per_address,
        )
        self.refusals = Refusals(log, self.limits.refusal_log_interval, event=LogEvent.WS_REFUSED)
        """What sockets that never initialized were refused, one ``ws_refused`` row per
        interval: an anonymous client cannot write rows of its own (:mod:`bus.ops.refusals`)."""
        self._refusals_task: asyncio.Task[None] | None = None
        self._budget = ByteBudget(self.limits.max_inflight_bytes)
        window = self.limits.dedup_window
        self._recent = (
            RecentIds(window=window, max_ids=self.limits.dedup_max_ids)
            if window is not None
            else None
        )
        self._sweeper: asyncio.Task[None] | None = None
        self._local_links: set[asyncio.Task[None]] = set()
        self._router: Router[Link] = Router()
        self._errors_before_init: dict[Connection, int] = {}
        self._slow: SlowConsumers[Connection] | None = (
            SlowConsumers(self.limits.slow_consumer_timeout)
            if self.limits.slow_consumer_timeout is not None
            else None
        )
        self._server: Server | None = None
        self._scheme = "ws"
        self._closing = False
        self._presence = Presence()
        self._presence_task: asyncio.Task[None] | None = None
        self._epochs = Epochs(log.last_epoch)
        self._held: dict[Link, _Held] = {}
        self._history = History(log.path)
        self.http_url: str | None = None
        """``http://HOST:PORT`` of the running HTTP binding (:mod:`bus.transports.http`) when the
        bus was
        assembled with one (:func:`bus.assemble.running`), else None. The binding imports the
        bus, never the other way round."""
        self.http_mount: Callable[[str, Any], None] | None = None
        """Serves an ASGI app under a path on the HTTP binding's port
        (:meth:`bus.transports.http.HttpBinding.mount`) while there is one, else None: how what
        runs beside the bus (the console) adds its pages."""
        self.on_delivered: Callable[[str, float], None] | None = None
        """Told each delivery's outcome (``process_finish`` status) and how many seconds the
        ``processMessage`` call took; :mod:`bus.ops.metrics` sets it."""
        self._methods = {
            "subscribe": self._subscribe,
            "unsubscribe": self._unsubscribe,
            "sendMessage": self._send_message,
            "fetchMessages": self._fetch_messages,
            "listSubscriptions": self._list_subscriptions,
            "ping": self._ping,
            "listPeers": self._list_peers,
        }
        self._since: dict[Link, str] = {}

    # Lifecycle

    async def start(
        self, host: str = "127.0.0.1", port: int = 0, *, ssl: _ssl.SSLContext | None = None
    ) -> None:
        """Listen on ``host:port`` (0 picks a free port; read it back from :attr:`port`); with
        ``ssl``, serve ``wss://``."""
        limits = self.limits
        self._scheme = "wss" if ssl is not None else "ws"
        self._server = await serve(
            self._handle_connection,
            host,
            port,
            process_request=self._process_request,
            max_size=limits.max_frame_bytes,
            open_timeout=limits.handshake_timeout,
            compression=None,
            ssl=ssl,
        )
        self.log.record(
            LogEvent.BUS_START,
            actor=BUS_CLIENT_ID,
            payload={"server_id": self.server_id, "url": self.url, "log_content": self.log_content},
        )
        self._presence_task = asyncio.create_task(self._presence.run(self._publish_own))
        self._refusals_task = asyncio.create_task(self.refusals.run())
        if self._slow is not None:
            self._sweeper = asyncio.create_task(self._sweep_slow_consumers())
        logger.info("listening on %s", self.url)

    @property
    def peers(self) -> Mapping[str, Link]:
        """The authenticated connections by clientId (a read-only snapshot)."""
        return self._router.peers

    @property
    def methods(self) -> list[str]:
        """The JSON-RPC methods peers may call, ``initialize`` first."""
        return ["initialize", *self._methods]

    @property
    def byte_budget(self) -> ByteBudget:
        """The bytes of requests being handled, for the whole bus (``max_inflight_bytes``);
        a transport charges each request body to it while the request is handled."""
        return self._budget

    def routes(self) -> Iterable[Route[Link]]:
        """Every authenticated peer's route: its link, clientId, grants and patterns."""
        return self._router.routes()

    @property
    def port(self) -> int:
        """The port the bus listens on."""
        if self._server is None:
            raise RuntimeError("the bus is not started")
        port: int = next(iter(self._server.sockets)).getsockname()[1]
        return port

    @property
    def host(self) -> str:
        if self._server is None:
            raise RuntimeError("the bus is not started")
        host: str = next(iter(self._server.sockets)).getsockname()[0]
        return host

    @property
    def url(self) -> str:
        """``ws://host:port`` of the listening socket (``wss://`` with TLS)."""
        return f"{self._scheme}://{self.host}:{self.port}"

    @property
    def latest_epoch(self) -> int:
        """The epoch of the last message accepted (0 before the first one this log holds)."""
        return self._epochs.last

    async def close(self) -> None:
        """Stop accepting, close every connection (1001), wait for their handlers. Idempotent.

        The activity log stays open: its owner closes it, which flushes it.
        """
        if self._closing:
            return
        self._closing = True
        if self._server is not None:
            # Stop accepting, but keep reading: requests in flight need their deliveries'
            # answers, and every one of them gets its answer (its result, or -32007 for what
            # arrives from now on) before the connections close.
            self._server.close(close_connections=False)
        await self._wait_requests_answered()
        for conn in list(self._connections):
            conn.spawn(conn.close(CLOSE_GOING_AWAY, "bus shutting down"))
        if self._server is not None:
            await self._server.wait_closed()
        if self._local_links:
            await asyncio.wait(set(self._local_links))
        for task in (self._presence_task, self._sweeper, self._refusals_task):
            if task is not None:
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task
        for held in self._held.values():
            held.cancel()
        self._held.clear()
        await self._history.close()
        with contextlib.suppress(BusError):  # a log that failed or closed first
            self.refusals.flush()
            self.log.record(LogEvent.SHUTDOWN, actor=BUS_CLIENT_ID)
            await self.log.commit()  # the disconnect and shutdown rows, before close() returns
        logger.info("closed")

    async def _wait_requests_answered(self) -> None:
        busy = [conn for conn in self._connections if conn.requests_in_flight]
        if not busy:
            return
        grace = self.limits.shutdown_grace
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

    async def __aenter__(self) -> Bus:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.close()

    # Connections

    async def connect_local(self) -> LocalSocket:
        """Open an in-process link to this bus and return the peer's end.

        Pass this method as ``Peer(..., connector=bus.connect_local)``: the peer then
        initializes, is authorized and logged as over a WebSocket, without a socket (see
        :mod:`bus.transports.local`). The bus closes the link with 1001 when it shuts down.

        Raises:
            ShuttingDown: the bus is closing.
        """
        if self._closing:
            raise ShuttingDown()
        bus_end, peer_end = local_pair()
        link = asyncio.get_running_loop().create_task(self._handle_connection(bus_end))
        self._local_links.add(link)
        link.add_done_callback(self._local_links.discard)
        return peer_end

    # Peers that are not on a socket (bus.transports.http, bus.transports.webhooks)

    async def route_for_token(
        self, token: str | None, request: Request, *, address: str
    ) -> Route[Link]:
        """The route a request that arrived without a socket (HTTP) acts through.

        The peer is the one ``token`` belongs to (the same credentials as ``initialize``). If it
        is online (a socket or a webhook) its route is returned, so it never gets its own
        messages; otherwise a route of its own kind that nothing is delivered to, with the
        grants the policy gives it now. Pass the route to :meth:`handle`.

        Raises:
            AuthenticationFailed: no peer has this token, or the policy refuses its roles; the
                row is logged (``actor`` is ``address``) and committed first.
            ShuttingDown: the bus is closing.
        """
        if self._closing:
            raise ShuttingDown()
        record = self.credentials.identify(token)
        if record is None:
            self.log.record(
                LogEvent.AUTH_FAILED,
                rpc_id=_rpc_id(request),
                actor=address,
                status="refused",
                error="unknown token" if token else "no credential",
            )
            with contextlib.suppress(BusError):
                await self.log.commit()
            raise AuthenticationFailed(
                "Authentication failed: send Authorization: Bearer with the token "
                "`bcpbus peers add` printed"
            )
        route = self._router.route_of(record.client_id)
        if route is not None:
            return route
        _, grants = self._grants_for(None, request, record.client_id, record.roles)
        return Route(_Detached(record.client_id), record.client_id, grants)

    async def handle(
        self,
        route: Route[Link],
        request: Request,
        *,
        accepted: Callable[[dict[str, Any]], None] | None = None,
    ) -> Any:
        """Carry out ``request`` for ``route``'s peer as if it came on its socket: the same
        checks, limits and rows; an error answer gets its ``rpc_error`` row.

        Args:
            accepted: for ``sendMessage``, called with ``{messageId}`` once the message is
                accepted (authorized, its rows committed) and before it is delivered, so a
                caller can answer at once and let delivery go on.

        Raises:
            BusError: the JSON-RPC error to answer with.
        """
        try:
            if self._closing:
                raise ShuttingDown()
            if request.method == "sendMessage":
                return await self._send_message(route, request, accepted)
            method = self._methods.get(request.method)
            if method is None:
                raise MethodNotFound(f"Method not found: {request.method[:64]!r}")
            # A peer that is not online may still ask what it missed: that is how it reads.
            offline_ok = request.method in ("ping", "fetchMessages")
            if self._router.route(route.handle) is not route and not offline_ok:
                raise NotInitialized(
                    f"{route.client_id} is not online, so nothing could be delivered to it: "
                    "give it a webhook (bcpbus peers add ID --webhook URL) or connect it over "
                    "WebSocket to subscribe"
                )
            return await method(route, request)
        except BusError as exc:
            await self.record_error(route.client_id, request, exc)
            raise

    async def attach(
        self, link: Link, client_id: str, roles: Iterable[str], patterns: Iterable[str] = ()
    ) -> Route[Link]:
        """Join a peer the bus reaches through ``link`` rather than a socket (a webhook).

        It is authorized, subscribed to its own clientId and to ``patterns``, logged and
        announced as a WebSocket peer's ``initialize`` is; a pattern the policy refuses is
        left out, with its rows. Call :meth:`detach` when it leaves.

        Raises:
            AuthenticationFailed: the policy refuses its roles; the row says why.
        """
        roles, grants = self._grants_for(None, None, client_id, roles)
        replaced = self._router.join(link, client_id, grants)
        if replaced is not None:
            self._take_over(replaced, client_id)
        if grants.may_subscribe(client_id):
            self._router.subscribe(link, client_id)
        route = self._router.route(link)
        assert route is not None
        self._since[link] = timestamp()
        self.log.record(
            LogEvent.INITIALIZE,
            actor=client_id,
            status="ok",
            payload={"roles": sorted(roles), "taint": grants.taint, "link": link.name},
        )
        self._presence.announce("peer_joined", PeerJoined(client_id=client_id, roles=sorted(roles)))
        for pattern in patterns:
            request = Request(None, "subscribe", {"topic": pattern})
            try:
                await self.handle(route, request)
            except BusError as exc:
                logger.warning("%s: not subscribed to %r: %s", client_id, pattern, exc)
        return route

    def detach(self, link: Link, reason: str = "detached") -> None:
        """Forget a peer :meth:`attach` joined; logged and announced as a disconnect."""
        route = self._router.leave(link)
        self._since.pop(link, None)
        if route is None:
            return
        self.log.record(LogEvent.DISCONNECT, actor=route.client_id, status=reason)
        self._presence.announce(
            "peer_left", PeerLeft(client_id=route.client_id, reason="disconnected")
        )

    def _process_request(self, ws: ServerConnection, request: HTTPRequest) -> HTTPResponse | None:
        if request.path == "/healthz":
            return ws.respond(HTTPStatus.OK, "ok\n")
        if self._closing:
            return ws.respond(HTTPStatus.SERVICE_UNAVAILABLE, "shutting down\n")
        # Sockets that have not authenticated are counted apart from peers, in total and per
        # address, so that anonymous sockets can never take the places of peers. A handshake
        # that carries a peer's token passes: anonymous sockets from its address (a NAT, a
        # shared host) cannot keep it out.
        address = _address(ws)
        refusal = self._anonymous.refusal(address)
        if refusal is not None and self.credentials.identify(_bearer(ws)) is None:
            name, _ = refusal
            self.refusals.count(name, address)
            return ws.respond(
                HTTPStatus.SERVICE_UNAVAILABLE, "too many connections that have not initialized\n"
            )
        return None

    async def _handle_connection(self, ws: ServerConnection | LocalSocket) -> None:
        conn = Connection(
            ws,
            self._handle_request,
            max_inflight=self.limits.max_inflight_deliveries,
            max_requests=self.limits.max_inflight_requests,
            budget=self._budget,
            on_protocol_error=self._protocol_error,
            on_frame_refused=self._frame_refused,
        )
        self._connections.add(conn)
        address = _address(ws)
        self._anonymous.opened(address)  # its connect row waits for initialize (anonymous: none)
        watchdog = asyncio.create_task(self._initialize_watchdog(conn))
        try:
            await conn.run()
        except ConnectionClosed as exc:
            if exc.sent is not None and exc.sent.code == 1009:
                if conn.client_id is None:
                    self.refusals.count("frame_too_large", address)
                else:
                    limit = self.limits.max_frame_bytes
                    self.log.record(
                        LogEvent.FRAME_TOO_LARGE, actor=conn.name, error=f"limit {limit}"
                    )
        finally:
            watchdog.cancel()
            if conn.client_id is None:
                self._anonymous.closed(address)
            self._connections.discard(conn)
            self._errors_before_init.pop(conn, None)
            self._since.pop(conn, None)
            if self._slow is not None:
                self._slow.forget(conn)
            self._forget(conn)
            await conn.drain_tasks()

    async def _initialize_watchdog(self, conn: Connection) -> None:
        timeout = self.limits.initialize_timeout
        if timeout is None:
            return
        try:
            async with asyncio.timeout(timeout):
                await conn.initialized.wait()
        except TimeoutError:
            self.refusals.count("initialize_timeout", _address(conn.ws))
            await conn.close(CLOSE_INITIALIZE_TIMEOUT, "initialize timeout")

    def _forget(self, conn: Connection) -> None:
        held = self._held.pop(conn, None)
        if held is not None:
            held.cancel()
        route = self._router.leave(conn)
        if route is None:
            return  # Never authenticated, or replaced: the takeover logged and announced it.
        self.log.record(LogEvent.DISCONNECT, actor=route.client_id, status=str(conn.ws.close_code))
        self._presence.announce(
            "peer_left", PeerLeft(client_id=route.client_id, reason="disconnected")
        )

    # Requests

    async def _handle_request(self, conn: Connection, request: Request) -> Any:
        try:
            # Dispatch inline rather than in a helper coroutine: one frame less per request.
            if self._closing:
                raise ShuttingDown()
            if request.method == "initialize":
                return await self._initialize(conn, request)
            route = self._router.route(conn)
            if route is None:
                raise NotInitialized()
            method = self._methods.get(request.method)
            if method is None:
                raise MethodNotFound(f"Method not found: {request.method[:64]!r}")
            return await method(route, request)
        except BusError as exc:
            if conn.client_id is None and not conn.closing_after_answer:
                self.refusals.count("rpc_error", _address(conn.ws))  # anonymous: no row each
            elif not isinstance(exc, _WrongToken):  # that one is counted by _authenticate
                await self.record_error(conn.name, request, exc)
            self._count_anonymous_error(conn)
            raise

    async def record_error(self, actor: str, request: Request, exc: BusError) -> None:
        """Log the ``rpc_error`` row of an error answer and commit it, before the peer reads
        the answer. :meth:`handle` does it for what it answers; a transport calls it for the
        errors it answers on its own (a malformed HTTP body)."""
        self.log.record(
            LogEvent.RPC_ERROR,
            rpc_id=_rpc_id(request),
            actor=actor,
            status=str(exc.code),
            payload={"method": request.method[:64]},
            error=exc.message,
        )
        with contextlib.suppress(BusError):
            await self.log.commit()

    def _protocol_error(self, conn: Connection, error: BusError) -> None:
        if conn.client_id is None:
            self.refusals.count("rpc_error", _address(conn.ws))
        else:
            self.log.record(
                LogEvent.RPC_ERROR, actor=conn.name, status=str(error.code), error=error.message
            )
        self._count_anonymous_error(conn)

    def _frame_refused(self, conn: Connection, reason: str) -> None:
        if conn.client_id is None:
            self.refusals.count("frame_refused", _address(conn.ws))
        else:
            self.log.record(LogEvent.FRAME_REFUSED, actor=conn.name, status=reason)

    def _count_anonymous_error(self, conn: Connection) -> None:
        # A connection that has not authenticated gets a few errors to learn from, then is
        # closed: otherwise anyone could fill the audit log with error rows until the
        # initialize timeout.
        if conn.client_id is not None or conn.closing_after_answer:
            return
        errors = self._errors_before_init[conn] = self._errors_before_init.get(conn, 0) + 1
        if errors >= MAX_ANONYMOUS_ERRORS:
            self.refusals.count("anonymous_errors", _address(conn.ws))
            reason = "too many errors before initialize"
            conn.close_after_answer(CLOSE_POLICY_VIOLATION, reason)
            conn.spawn(conn.close(CLOSE_POLICY_VIOLATION, reason))

    async def _initialize(self, conn: Connection, request: Request) -> Any:
        if conn.client_id is not None:
            raise AlreadyInitialized()
        params = parse(InitializeParams, request.params)
        client_id = params.client_id
        token = params.auth.token if params.auth is not None else _bearer(conn.ws)
        record = await self._authenticate(conn, request, client_id, token)
        self._check_not_attached(conn, request, client_id)
        self._check_capacity(conn, request, client_id)
        roles, grants = self._grants_for(conn, request, client_id, record.roles)
        replaced = self._router.join(conn, client_id, grants, credential=record.token_hash)
        self._since[conn] = timestamp()
        if replaced is not None:
            self._take_over(replaced, client_id)
        self._anonymous.closed(_address(conn.ws))
        conn.authenticated(client_id)
        self.log.record(LogEvent.CONNECT, actor=str(conn.ws.remote_address))
        if grants.may_subscribe(client_id):
            # As in the seed protocol, a peer is subscribed to its own address from the start,
            # so what others send it in answer to peer_joined (the gateway does) is not lost.
            self._router.subscribe(conn, client_id)
        self.log.record(
            LogEvent.INITIALIZE,
            rpc_id=_rpc_id(request),
            actor=client_id,
            status="ok",
            payload={"roles": sorted(roles), "taint": grants.taint},
        )
        self._presence.announce("peer_joined", PeerJoined(client_id=client_id, roles=sorted(roles)))
        return {
            "serverId": self.server_id,
            "serverInfo": {"name": "bcpbus", "version": __version__},
            "capabilities": {
                "subscribe": True,
                "publish": True,
                "processMessage": True,
                "topics": list(grants.subscribe_patterns),
            },
            "epoch": self._epochs.last,
        }

    async def _authenticate(
        self, conn: Connection, request: Request, client_id: str, token: str | None
    ) -> PeerRecord:
        """The credential ``token`` proves for ``client_id``.

        Raises:
            AuthenticationFailed: none; the refusal is counted into the next ``ws_refused``
                row (no row of its own: anyone can try), and the connection closes (4003)
                after the answer.
        """
        record = self.credentials.verify(client_id, token)
        if record is not None:
            return record
        self.refusals.count("wrong_token" if token else "no_credential", _address(conn.ws))
        conn.close_after_answer(CLOSE_AUTH_FAILED, "authentication failed")
        raise _WrongToken()

    def _check_not_attached(self, conn: Connection, request: Request, client_id: str) -> None:
        """Refuse a socket for a peer the bus reaches another way (its webhook).

        Raises:
            AuthenticationFailed: ``client_id`` is attached; the connection closes (4003).
        """
        route = self._router.route_of(client_id)
        if route is None or isinstance(route.handle, Connection):
            return
        self.log.record(
            LogEvent.AUTH_FAILED, rpc_id=_rpc_id(request), actor=client_id, status="webhook"
        )
        conn.close_after_answer(CLOSE_AUTH_FAILED, "authentication failed")
        raise AuthenticationFailed(
            f"Authentication failed: {client_id} is a webhook peer, which the bus reaches at "
            "its URL; it cannot also connect over WebSocket (re-add it without --webhook)"
        )

    def _check_capacity(self, conn: Connection, request: Request, client_id: str) -> None:
        """Refuse one peer more than ``max_connections`` (a takeover is not one more).

        Raises:
            LimitExceeded: the bus is full; the connection closes (1013) after the answer.
        """
        limit = self.limits.max_connections
        if limit is None or client_id in self._router or len(self._router) < limit:
            return
        self.log.record(
            LogEvent.LIMIT_EXCEEDED,
            rpc_id=_rpc_id(request),
            actor=client_id,
            status="max_connections",
        )
        conn.close_after_answer(CLOSE_TRY_AGAIN_LATER, "too many peers")
        raise LimitExceeded(f"Limit exceeded: the bus already has {limit} peers; retry later")

    def _grants_for(
        self,
        conn: Connection | None,
        request: Request | None,
        client_id: str,
        credential_roles: Iterable[str],
    ) -> tuple[frozenset[str], Grants]:
        """The roles and grants the policy gives ``client_id``.

        Raises:
            AuthenticationFailed: the policy refuses these roles to this clientId (e.g. the
                gateway role for a peer that is not a gateway member); the log says why.
        """
        identity = self.identities.get(client_id, PeerIdentity())
        try:
            roles = self.policy.roles_for(client_id, (*credential_roles, *identity.roles))
            return roles, self.policy.grants(client_id, roles, taint=identity.taint)
        except (PolicyError, ValueError) as exc:
            self.log.record(
                LogEvent.AUTH_FAILED,
                rpc_id=_rpc_id(request) if request is not None else None,
                actor=client_id,
                status="policy",
                error=str(exc),
            )
            if conn is not None:
                conn.close_after_answer(CLOSE_AUTH_FAILED, "authentication failed")
            raise AuthenticationFailed(
                "Authentication failed: this clientId's roles are not allowed by the policy"
            ) from None

    def _take_over(self, old: Link, client_id: str) -> None:
        self.log.record(LogEvent.REPLACED, actor=client_id, status=str(CLOSE_REPLACED))
        self._presence.announce("peer_left", PeerLeft(client_id=client_id, reason="replaced"))
        old.spawn(old.close(CLOSE_REPLACED, "replaced by a newer connection"))

    async def _subscribe(self, route: Route[Link], request: Request) -> Any:
        params = parse(SubscribeParams, request.params)
        pattern = validate_pattern(params.topic)
        if not route.grants.may_subscribe(pattern):
            self._refuse(route, request, "subscribe_denied", topic=pattern)
            raise Forbidden(f"{route.client_id} may not subscribe to {pattern!r}")
        options = PushOptions(params.debounce_ms, params.min_relevance)
        if pattern in route.patterns and route.options.get(pattern, PLAIN) != options:
            self._router.subscribe(route.handle, pattern, options)
            self._log_subscribe(route, request, pattern, options)
        elif pattern not in route.patterns:
            limit = self.limits.max_subscriptions
            if limit is not None and len(route.patterns) >= limit:
                self.log.record(
                    LogEvent.LIMIT_EXCEEDED,
                    rpc_id=_rpc_id(request),
                    actor=route.client_id,
                    topic=pattern,
                    status="max_subscriptions",
                )
                raise LimitExceeded(f"at most {limit} subscriptions per connection")
            self._router.subscribe(route.handle, pattern, options)
            self._log_subscribe(route, request, pattern, options)
        return {"success": True}

    def _log_subscribe(
        self, route: Route[Link], request: Request, pattern: str, options: PushOptions
    ) -> None:
        self.log.record(
            LogEvent.SUBSCRIBE,
            rpc_id=_rpc_id(request),
            actor=route.client_id,
            topic=pattern,
            payload=None
            if options.plain
            else {"debounceMs": options.debounce_ms, "minRelevance": options.min_relevance},
        )

    async def _list_subscriptions(self, route: Route[Link], request: Request) -> Any:
        subscriptions = []
        for pattern in sorted(route.patterns):
            options = route.options.get(pattern, PLAIN)
            subscriptions.append(
                {
                    "topic": pattern,
                    "debounceMs": options.debounce_ms,
                    "minRelevance": options.min_relevance,
                }
            )
        return {"subscriptions": subscriptions}

    async def _unsubscribe(self, route: Route[Link], request: Request) -> Any:
        pattern = parse(UnsubscribeParams, request.params).topic
        if not self._router.unsubscribe(route.handle, pattern):
            raise SubscriptionNotFound(f"not subscribed to {pattern!r}")
        self.log.record(
            LogEvent.UNSUBSCRIBE, rpc_id=_rpc_id(request), actor=route.client_id, topic=pattern
        )
        return {"success": True}

    async def _ping(self, route: Route[Link], request: Request) -> Any:
        return {"pong": True, "serverTime": timestamp()}

    async def _list_peers(self, route: Route[Link], request: Request) -> Any:
        if not route.grants.admin:
            self._refuse(route, request, "admin_denied")
            raise Forbidden(
                f"{route.client_id} may not call listPeers: it is for roles with `admin: true` "
                "in the policy (the default policy's operator role, operator:*)"
            )
        return peer_list(self._router.routes(), self._since).model_dump(by_alias=True)

    # Reloading

    def reconfigure(
        self,
        *,
        credentials: Credentials,
        policy: Policy,
        identities: Mapping[str, PeerIdentity],
    ) -> tuple[int, int]:
        """Put a new configuration in force at once, for new and connected peers alike.

        Each connected peer is reviewed as if it initialized again with the token it used
        (:func:`bus.ops.rights.review`): one whose token was removed or rotated, or whose roles the
        policy now refuses, is closed with 4005 (``CLOSE_REVOKED``); the others get their new
        grants and lose the subscriptions those no longer allow. Nothing here awaits, so no
        request is handled under half of the change.

        Returns:
            How many peers were closed, and how many subscriptions were dropped.
        """
        self.credentials, self.policy, self.identities = credentials, policy, dict(identities)
        revoked = dropped = 0
        for change in review(list(self._router.routes()), credentials, policy, self.identities):
            match change:
                case Revoke(route=route):
                    self._revoke(route, change.reason, change.detail)
                    revoked += 1
                case Regrant(route=route, grants=grants):
                    route.grants = grants
                    for pattern in change.dropped:
                        self._router.unsubscribe(route.handle, pattern)
                        self.log.record(
                            LogEvent.UNSUBSCRIBE,
                            actor=route.client_id,
                            topic=pattern,
                            status="revoked",
                        )
                    dropped += len(change.dropped)
        return revoked, dropped

    def _revoke(self, route: Route[Connection], reason: str, detail: str) -> None:
        self._router.leave(route.handle)  # from now on it receives nothing and may do nothing
        self.log.record(LogEvent.REVOKED, actor=route.client_id, status=reason, error=detail)
        self._presence.announce("peer_left", PeerLeft(client_id=route.client_id, reason="revoked"))
        conn = route.handle
        conn.spawn(conn.close(CLOSE_REVOKED, f"revoked: {reason}"))

    def _refuse(
        self,
        route: Route[Link],
        request: Request,
        reason: str,
        *,
        topic: str | None = None,
        message_id: str | None = None,
    ) -> None:
        self.log.record(
            LogEvent.REFUSED,
            message_id=message_id,
            rpc_id=_rpc_id(request),
            actor=route.client_id,
            topic=topic,
            status=reason,
        )
        logger.info("refused %s from %s: %s", request.method, route.client_id, reason)

    # Publishing

    async def _send_message(
        self,
        route: Route[Link],
        request: Request,
        accepted: Callable[[dict[str, Any]], None] | None = None,
    ) -> Any:
        fields = read_send_message(request.params)
        topic = validate_topic(fields.topic)
        self._authorize_send(route, request, fields, topic)
        assert isinstance(request.params, dict)  # validated as an object above
        key = (route.client_id, fields.message_id)
        if self._recent is not None and not self._recent.claim(key, _clock()):
            self._refuse(route, request, "duplicate", topic=topic, message_id=fields.message_id)
            raise DuplicateMessage(
                f"Duplicate messageId: {route.client_id} already sent {fields.message_id!r} "
                f"within the last {self._recent.window:g} s; it was accepted then, do not send "
                "it again",
                data={"messageId": fields.message_id},
            )
        message = _Message(
            topic,
            request.params["payload"],
            fields.message_id,
            fields.type,
            trace_id=fields.trace_id,
            relevance=fields.relevance,
        )
        rpc_id = _rpc_id(request)
        try:
            targets = await self._accept(message, sender=route, rpc_id=rpc_id)
        except BusError:
            if self._recent is not None:
                self._recent.release(key)  # nothing was delivered: a retry may go through
            raise
        if accepted is not None:
            accepted({"messageId": fields.message_id, "epoch": message.epoch})
        delivered = await self._fan_out(targets, message, actor=route.client_id, rpc_id=rpc_id)
        return {
            "accepted": True,
            "messageId": fields.message_id,
            "deliveredTo": delivered,
            "epoch": message.epoch,
        }

    def _authorize_send(
        self, route: Route[Link], request: Request, fields: SendFields, topic: str
    ) -> None:
        """Refuse (with a row) a ``from`` that is not the sender, or a type the policy denies.

        Raises:
            Forbidden: either refusal.
        """
        if fields.sender != route.client_id:
            self._refuse(route, request, "from_mismatch", topic=topic, message_id=fields.message_id)
            raise Forbidden(
                f"payload.from is {fields.sender!r} but this connection is {route.client_id!r}"
            )
        grants = route.grants
        if not grants.may_send(fields.type, topic):
            self._refuse(route, request, "type_denied", topic=topic, message_id=fields.message_id)
            raise Forbidden(
                f"{route.client_id} (roles: {', '.join(sorted(grants.roles)) or 'none'}) may not "
                f"send {fields.type!r} to {topic!r}"
            )

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
        message = _Message(topic, payload, message_id, message_type, trace_id=trace_id)
        targets = await self._accept(message, sender=sender, rpc_id=rpc_id)
        actor = sender.client_id if sender is not None else BUS_CLIENT_ID
        return await self._fan_out(targets, message, actor=actor, rpc_id=rpc_id)

    async def _publish_own(
        self, topic: str, payload: dict[str, Any], message_id: str, message_type: str
    ) -> int:
        return await self.publish(topic, payload, message_id, message_type, sender=None)

    async def _accept(
        self, message: _Message, *, sender: Route[Link] | None, rpc_id: str | None
    ) -> list[Route[Link]]:
        """Give ``message`` its epoch, record it and its targets, commit the rows, and return
        the targets.

        Raises:
            AuditUnavailable: the rows could not be committed; deliver nothing. A
                ``send_aborted`` row follows, so that the message is never fetched either.
        """
        actor = sender.client_id if sender is not None else BUS_CLIENT_ID
        grants = sender.grants if sender is not None else None
        log = self.log
        # The epoch is given and the row recorded with no await between them, so epochs
        # follow the order of the rows, which the log commits in order.
        epoch = message.epoch = self._epochs.next()
        topic, trace_id = message.topic, message.trace_id
        log.record(
            LogEvent.SEND_START,
            message_id=message.message_id,
            rpc_id=rpc_id,
            actor=actor,
            topic=topic,
            status=sender_mark(grants),
            payload_json=_content(message.payload, message.type, self.log_content),
            epoch=epoch,
            trace_id=trace_id,
        )
        targets: list[Route[Link]] = []
        for target in self._router.targets(topic, sender=sender.handle if sender else None):
            if grants is not None and not may_flow(grants, target.grants, message.type):
                # A reader's raw text is "high" whoever carries it (policy.RAW_TEXT_TYPES).
                level = "high" if message.type in RAW_TEXT_TYPES else grants.taint
                log.record(
                    LogEvent.TAINT_REFUSED,
                    message_id=message.message_id,
                    actor=target.client_id,
                    topic=topic,
                    status=f"{level}->{target.grants.taint}",
                    epoch=epoch,
                    trace_id=trace_id,
                )
                continue
            if target.options and not self._push_now(target, message):
                continue
            log.record(
                LogEvent.PROCESS_START,
                message_id=message.message_id,
                actor=target.client_id,
                topic=topic,
                epoch=epoch,
                trace_id=trace_id,
            )
            targets.append(target)
        if not targets:
            return targets  # fan_out commits the rows (and fetch commits before it reads)
        try:
            # Fail closed, for every message: nothing is delivered without its audit row, so
            # a peer that gets -32006 knows that nobody received the message and may resend it.
            await log.commit()
        except BusError:
            message.aborted = True
            # Its rows may still be written later: this one tells fetchMessages to skip it.
            with contextlib.suppress(BusError):
                log.record(
                    LogEvent.SEND_ABORTED,
                    message_id=message.message_id,
                    actor=actor,
                    topic=topic,
                    epoch=epoch,
                    trace_id=trace_id,
                )
            raise
        return targets

    async def _fan_out(
        self,
        targets: list[Route[Link]],
        message: _Message,
        *,
        actor: str | None,
        rpc_id: str | None,
    ) -> int:
        """Deliver to ``targets`` concurrently, record ``send_finish``, commit; return how many
        answered ``processed: true``."""
        log = self.log
        params = {"topic": message.topic, "payload": message.payload, "epoch": message.epoch}
        if not targets:
            results: list[bool] = []
        elif len(targets) == 1:
            results = [await self._deliver(targets[0], params, message)]
        else:
            results = await asyncio.gather(
                *(self._deliver(target, params, message) for target in targets)
            )
        delivered = sum(results)
        log.record(
            LogEvent.SEND_FINISH,
            message_id=message.message_id,
            rpc_id=rpc_id,
            actor=actor,
            topic=message.topic,
            status=f"delivered {delivered}/{len(targets)}",
            epoch=message.epoch,
            trace_id=message.trace_id,
        )
        await log.commit()
        return delivered

    async def _deliver(self, route: Route[Link], params: dict[str, Any], message: _Message) -> bool:
        status, error = "processed", None
        limit = self.limits.max_write_buffer
        target = route.handle
        started = _clock()
        try:
            if limit is not None and target.write_buffer_size() > limit:
                # A peer that does not read gets nothing more written: fail fast, hold nothing.
                raise _SlowConsumer()
            async with asyncio.timeout(self.limits.process_timeout):
                if target.inflight is not None:
                    async with target.inflight:
                        result = await target.call("processMessage", params)
                else:
                    result = await target.call("processMessage", params)
            if not (isinstance(result, dict) and result.get("processed") is True):
                status = "not_processed"
                error = _reply_text(result)
        except TimeoutError:
            status, error = "timeout", f"no answer within {self.limits.process_timeout}s"
        except PeerGone:
            status, error = "disconnected", None
        except _SlowConsumer:
            status, error = "slow_consumer", f"more than {limit} bytes unread"
        except BusError as exc:
            status, error = "error", str(exc)
        if self.on_delivered is not None:
            self.on_delivered(status, _clock() - started)
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
        return status == "processed"

    # Pushes that subscriptions hold back: minRelevance and debounceMs (see bus.core.pushes)

    def _push_now(self, route: Route[Link], message: _Message) -> bool:
        """Whether ``route``'s subscriptions want ``message`` pushed now; if not, log why, and
        hold it for the end of a debounce window if that is the reason."""
        topic = message.topic
        window = push_window(route.options_for(topic), message.relevance)
        if window == 0:
            return True
        if window is not None:
            held = self._held.get(route.handle)
            if held is None:
                held = self._held[route.handle] = _Held()
            offer = held.debounce.offer(topic, message, window / 1000, _clock())
            if offer.push:
                return True
            if offer.flush_at is not None:
                loop = asyncio.get_running_loop()
                held.timers[topic] = loop.call_at(
                    offer.flush_at, self._flush_held, route.handle, topic
                )
        self.log.record(
            LogEvent.PUSH_SKIPPED,
            message_id=message.message_id,
            actor=route.client_id,
            topic=topic,
            status="min_relevance" if window is None else "debounce",
            epoch=message.epoch,
            trace_id=message.trace_id,
        )
        return False

    def _flush_held(self, conn: Link, topic: str) -> None:
        """At the end of a debounce window: push the latest message held on ``topic``."""
        held = self._held.get(conn)
        if held is None:
            return
        held.timers.pop(topic, None)
        due = held.debounce.due(topic, _clock())
        route = self._router.route(conn)
        if due is None or route is None or self._closing:
            return
        message, skipped = due
        # Not if its sender was told -32006, nor once no subscription of the peer matches.
        if message.aborted or not route.options_for(topic):
            return
        conn.spawn(self._push_held(route, message, skipped))

    async def _push_held(self, route: Route[Link], message: _Message, skipped: int) -> None:
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
        params: dict[str, Any] = {
            "topic": message.topic,
            "payload": message.payload,
            "epoch": message.epoch,
        }
        if skipped:
            params["skipped"] = skipped
        with contextlib.suppress(BusError):  # unpushed, it stays fetchable
            await log.commit()
            await self._deliver(route, params, message)
            await log.commit()

    # Reading back

    async def fetch(
        self,
        grants: Grants,
        pattern: str,
        since_epoch: int,
        limit: int | None = None,
        *,
        only: FetchFilter | None = None,
        rpc_id: str | None = None,
    ) -> FetchResult:
        """The messages after ``since_epoch`` on topics matching ``pattern`` that the peer with
        ``grants`` may receive now, oldest first: ``fetchMessages``, for any transport.

        What "may receive" means is :mod:`bus.log.fetch`'s (the policy for ``pattern``, the taint
        rule from each sender, no ``bcp:`` topic but for the declassifier, not its own). The
        read is logged (a ``fetch`` row, committed before this returns).

        Args:
            grants: the reading peer's grants, as the policy gives them now.
            pattern: a topic pattern (``*`` segments allowed).
            since_epoch: the last epoch already seen; 0 for the oldest kept.
            limit: the most messages to return; capped by ``max_fetch_messages`` (None: the cap).
            only: further conditions on each message (type, correlation id, sender, time).
            rpc_id: the request's id, for the log rows.

        Raises:
            InvalidParams: ``pattern`` is malformed.
            Forbidden: the policy does not let this peer subscribe to ``pattern`` (logged).
            EpochNotKept: ``since_epoch`` is outside what the log keeps.
            ContentNotKept: the log keeps only digests (``log_content: digest``), or reached a
                message kept as a digest by an earlier run.
            AuditUnavailable: the log could not commit, or could not be read.
            ShuttingDown: the bus is closing.
        """
        if self._closing:
            raise ShuttingDown()
        pattern = validate_pattern(pattern)
        client_id = grants.client_id
        if not grants.may_subscribe(pattern):
            self.log.record(
                LogEvent.REFUSED,
                rpc_id=rpc_id,
                actor=client_id,
                topic=pattern,
                status="fetch_denied",
            )
            raise Forbidden(f"{client_id} may not read {pattern!r}: the policy does not grant it")
        if self.log_content == "digest":
            raise ContentNotKept(
                "This bus keeps only digests of messages (log_content: digest), not their "
                "content: there is nothing to fetch"
            )
        cap = self.limits.max_fetch_messages
        limit = cap if limit is None else max(1, min(limit, cap))
        upto = self._epochs.last
        # Every message given an epoch so far is then committed (or aborted): none can be
        # missing below upto and turn up later.
        await self.log.commit()
        page = Page(grants, pattern, since=since_epoch, limit=limit, only=only)
        try:
            check_since(since_epoch, await self._history.oldest(), upto)
            more = await self._history.fill(page, upto=upto, topic=_literal(pattern))
        except sqlite3.Error as exc:
            logger.error("fetch: reading the activity log failed: %r", exc)
            raise AuditUnavailable(
                "Activity log unavailable: it could not be read; retry later"
            ) from exc
        result = page.result(more=more, upto=upto)
        self.log.record(
            LogEvent.FETCH,
            rpc_id=rpc_id,
            actor=client_id,
            topic=pattern,
            status=f"{len(result.messages)} messages",
            payload={
                "sinceEpoch": since_epoch,
                "nextEpoch": result.next_epoch,
                "withheld": page.withheld,
            },
        )
        await self.log.commit()
        return result

    async def _fetch_messages(self, route: Route[Link], request: Request) -> Any:
        params = parse(FetchMessagesParams, request.params)
        result = await self.fetch(
            route.grants,
            params.topic,
            params.since_epoch,
            params.limit,
            rpc_id=_rpc_id(request),
        )
        return result.to_wire()

    # Slow consumers

    async def _sweep_slow_consumers(self) -> None:
        """Disconnect (4004) every peer the bus has not been able to write to for
        ``slow_consumer_timeout`` seconds, as NATS's write deadline does.

        "Not able to write" means the socket's unread bytes stayed above its low water mark
        (:meth:`Connection.write_blocked`) at every check. The WebSocket keepalive cannot catch
        such a peer: its ping waits behind the unread bytes, so its timeout never starts. One
        task checks every socket, which costs well under a microsecond each.
        """
        slow = self._slow
        assert slow is not None
        interval = min(1.0, slow.timeout / 4)
        while True:
            await asyncio.sleep(interval)
            states = [(conn, conn.write_blocked()) for conn in self._connections]
            for conn in slow.check(states, _clock()):
                size = conn.write_buffer_size()
                self.log.record(
                    LogEvent.SLOW_CONSUMER,
                    actor=conn.name,
                    status=str(CLOSE_SLOW_CONSUMER),
                    error=f"{size} bytes unread, nothing written for {slow.timeout:g}s",
                )
                logger.info("disconnecting slow consumer %s (%d bytes unread)", conn.name, size)
                conn.spawn(conn.force_close(CLOSE_SLOW_CONSUMER, "slow consumer"))


class _Detached:
    """The link of a peer that sent a request over HTTP and is not online: it only sends, and
    the bus has no way to deliver to it (it is in no routing table)."""

    def __init__(self, client_id: str) -> None:
        self.name = client_id
        self.inflight: asyncio.Semaphore | None = None

    def write_buffer_size(self) -> int:
        return 0

    async def call(self, method: str, params: Any) -> Any:
        raise PeerGone(self.name)

    def spawn(self, coro: Coroutine[Any, Any, None]) -> asyncio.Task[None]:
        return asyncio.get_running_loop().create_task(coro)  # pragma: no cover - never joined

    async def close(self, code: int, reason: str) -> None:
        return None


class _WrongToken(AuthenticationFailed):
    """A token that proves no peer: counted into ``ws_refused``, no ``rpc_error`` row."""


class _SlowConsumer(Exception):
    """A delivery refused because the target has too many unread bytes."""


@dataclass(slots=True)
class _Message:
    """One message on its way through the bus: what it is, and the epoch it was given."""

    topic: str
    payload: dict[str, Any]
    message_id: str
    type: str
    trace_id: str | None = None
    relevance: float | None = None
    epoch: int = 0
    """Given by :meth:`Bus._accept`; 0 until then."""
    aborted: bool = False
    """Its rows could not be committed: it was refused (-32006), and is never pushed later."""


@dataclass(slots=True)
class _Held:
    """One connection's debounce windows, and the timers that push what they hold."""

    debounce: Debounce[_Message] = field(default_factory=Debounce)
    timers: dict[str, asyncio.TimerHandle] = field(default_factory=dict)

    def cancel(self) -> None:
        for timer in self.timers.values():
            timer.cancel()
        self.timers.clear()
        self.debounce.clear()


def _bearer(ws: Socket) -> str | None:
    header = ws.request.headers.get("Authorization") if ws.request is not None else None
    if header and header[:7].lower() == "bearer ":
        return header[7:].strip() or None
    return None


def _content(payload: dict[str, Any], message_type: str, mode: LogContent) -> str:
    """``send_start``'s payload: the envelope as JSON, or its type and SHA-256 (``digest``).

    The digest is over the canonical JSON (keys sorted, no spaces, UTF-8), so an auditor who
    holds the message can recompute it: ``bus.core.digest.canonical_sha256(envelope)``.
    """
    if mode == "full":
        return _json.dumps(payload)
    return json.dumps(
        {"type": message_type, "sha256": canonical_sha256(payload)},
        separators=(",", ":"),
        ensure_ascii=False,
    )


def _literal(pattern: str) -> str | None:
    """``pattern`` if it is a concrete topic (read through the topic index), else None."""
    return None if "*" in pattern else pattern


def _address(ws: Socket) -> str:
    """The remote IP address of a socket, the unit of the anonymous-connection limit."""
    remote = ws.remote_address
    return str(remote[0]) if isinstance(remote, tuple) and remote else str(remote)


def _clock() -> float:
    return asyncio.get_running_loop().time()


def _rpc_id(request: Request) -> str | None:
    return None if request.id is None else str(request.id)


def _reply_text(result: Any) -> str:
    if isinstance(result, dict):
        return f"{result.get('status', '')}: {result.get('message', '')}"[:200]
    return "malformed processMessage result"


def peer_list(routes: Iterable[Route[Link]], since: Mapping[Link, str]) -> Any:
    """The ``listPeers`` result: every authenticated peer, sorted by clientId.

    A peer the bus reaches another way than a connection (a webhook) shows its link's name as
    its address and no requests in flight.
    """
    peers = [
        {
            "clientId": route.client_id,
            "roles": sorted(route.grants.roles),
            "taint": route.grants.taint,
            "since": since.get(route.handle) or timestamp(),
            "address": _link_address(route.handle),
            "subscriptions": sorted(route.patterns),
            "inflight": _link_inflight(route.handle),
        }
        for route in sorted(routes, key=lambda r: r.client_id)
    ]
    return ListPeersResult.model_validate({"peers": peers})


def _link_address(link: Link) -> str:
    return _address(link.ws) if isinstance(link, Connection) else link.name


def _link_inflight(link: Link) -> dict[str, int]:
    if isinstance(link, Connection):
        return {"requests": link.requests_in_flight, "deliveries": link.deliveries_in_flight}
    return {"requests": 0, "deliveries": 0}
